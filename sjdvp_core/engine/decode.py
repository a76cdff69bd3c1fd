"""`decode`: generate images with the Jacobi loop (loop.py), calibrating the device first where an
automatic window needs it or the caller asks for a priced report (calibration.py)."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .adapter import Edit, ModelAdapter
from .auto import Profile, allocated
from .budget import per_image
from .calibration import MeasureFn, calibration, forget_stale_cost
from .cost import PassCost
from .loop import DecodeResult, JacobiDecoder, ProgressFn
from .settings import DecodeSettings
from .tree import scratch_nodes

__all__ = ["DecodeResult", "decode"]


def decode(
    adapter: ModelAdapter,
    conditions: Sequence[Any] | Any,
    settings: DecodeSettings,
    negatives: Sequence[Any] | Any | None = None,
    progress: ProgressFn | None = None,
    timing: bool = False,
    cost: PassCost | None = None,
    profile: Profile | None = None,
    priced: bool = False,
    measuring: MeasureFn | None = None,
) -> DecodeResult:
    """Generate settings.batch_size images.

    conditions: one per image, or one shared by all (the family's prompt, class id, ...);
    negatives likewise, the CFG branch where the family has one. progress(done, total, codes) is
    called after every iteration with the tokens committed so far and the image cells known ([B,
    h, w] codebook indices, -1 where undecided); it may raise to abort. timing: split the time
    into forward / verify / draft (on a GPU this waits for the device three times per iteration).
    cost, profile: what an automatic window chooses by; default: measured on this device once and
    cached (calibration.py), with `measuring` told the progress. priced: measure the pass cost of
    a fixed window too, so the report prices the speed-up in seconds. The result's stats carry
    the cost and profile the decode used; the same cost, profile and seed give the same image."""
    if not isinstance(settings, DecodeSettings):
        raise ValueError(
            f"settings is a {type(settings).__module__}.{type(settings).__name__}: give "
            f"a {DecodeSettings.__module__}.DecodeSettings (method_settings makes one for "
            "a named method)"
        )
    B = settings.batch_size
    conditions = per_image(conditions, B, "conditions")
    negatives = None if negatives is None else per_image(negatives, B, "negatives")
    if not adapter.takes_images and any(isinstance(c, Edit) for c in conditions):
        raise ValueError(
            f"{adapter.family} does not take reference images: give the text alone (GLM-Image, "
            "Janus, Lumina-mGPT 2.0 and LlamaGen take them)"
        )
    speculative = settings.window.size > 1
    auto = settings.window.auto and speculative
    if auto or (priced and speculative and cost is None):
        # a prompt too long for the model is said before measuring
        adapter.prompt_length(conditions, negatives, settings.sampling.uses_cfg)
        cost, profile = calibration(adapter, settings, cost, profile, measuring)
    chosen_by = profile if auto else None  # a fixed window's decode chooses nothing
    widest = allocated(settings, chosen_by)
    scratch = scratch_nodes(widest.window, widest.tree)
    if scratch and not adapter.trees:
        raise ValueError(
            f"{adapter.family}: this model adapter cannot score draft trees; set tree width to 1"
        )
    with torch.inference_mode():
        try:
            layout, first_logits = adapter.start(
                conditions, negatives, settings.sampling.uses_cfg, scratch
            )
            decoder = JacobiDecoder(adapter, settings, layout, timing, cost, chosen_by)
            result = decoder.run(first_logits, progress)
        finally:
            adapter.finish()
    stats = result.stats
    stats.pass_cost, stats.profile, stats.precision = cost, profile, adapter.precision
    if auto:
        forget_stale_cost(adapter, settings, cost, stats)
    return result
