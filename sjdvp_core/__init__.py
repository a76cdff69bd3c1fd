"""sjdvp_core: speculative Jacobi decoding (SJD, LANTERN, GSD, Verification Prediction) for
autoregressive image models. Pure torch; ComfyUI is never imported here.

Subpackages: engine (the algorithm), models (the families and their registry), hub (catalogue,
downloads, the check command), cli (the generate command), demo (the built-in model)."""

from .engine.adapter import ModelAdapter, TokenLayout
from .engine.decode import DecodeResult, decode
from .engine.settings import (
    DEFAULT_WINDOW,
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    TreeSettings,
    VPSettings,
    WindowSettings,
    method_settings,
)
from .engine.stats import DecodeStats
from .models.loading import load_model

__all__ = [
    "ModelAdapter",
    "TokenLayout",
    "DecodeResult",
    "decode",
    "DecodeSettings",
    "DrafterSettings",
    "SamplingSettings",
    "TreeSettings",
    "VPSettings",
    "WindowSettings",
    "DEFAULT_WINDOW",
    "method_settings",
    "DecodeStats",
    "load_model",
]
