"""What differs between torch devices that the engine cares about."""

from __future__ import annotations

import torch


def wide_float(device) -> torch.dtype:
    """float64 for sums and noise that must not round, except on Apple's mps, which has no
    float64."""
    return torch.float32 if torch.device(device).type == "mps" else torch.float64


def default_device() -> str:
    """The device a command line runs on unless told: the GPU when there is one (as ComfyUI's loader
    does: CUDA/ROCm, then Apple's mps), else the CPU."""
    if torch.cuda.is_available():
        return "cuda"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return "cpu"
