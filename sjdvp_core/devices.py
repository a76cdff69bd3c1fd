"""What differs between torch devices that the engine cares about."""
from __future__ import annotations

import torch


def wide_float(device) -> torch.dtype:
    """float64 for sums and noise that must not round, except on Apple's mps, which has no float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64
