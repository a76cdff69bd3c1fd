"""sjdvp_core: speculative Jacobi decoding (SJD, LANTERN, GSD, Verification Prediction) for
autoregressive image models. Pure torch; ComfyUI is never imported here."""
from .adapter import ModelAdapter, TokenLayout
from .decode import DecodeResult, decode
from .settings import DecodeSettings, DrafterSettings, SamplingSettings, TreeSettings, VPSettings, WindowSettings
from .stats import DecodeStats

__all__ = ["ModelAdapter", "TokenLayout", "DecodeResult", "decode", "DecodeSettings", "DrafterSettings",
           "SamplingSettings", "TreeSettings", "VPSettings", "WindowSettings", "DecodeStats"]
