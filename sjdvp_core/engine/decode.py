"""`decode`: generate images with the Jacobi loop (loop.py), calibrating the device first where an automatic
window needs it (calibration.py)."""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import torch

from .adapter import ModelAdapter
from .auto import Profile, largest_tree
from .budget import per_image
from .calibration import calibration, forget_stale_cost
from .cost import PassCost
from .loop import DecodeResult, JacobiDecoder, ProgressFn
from .settings import DecodeSettings
from .tree import scratch_nodes

__all__ = ["DecodeResult", "decode"]


def decode(adapter: ModelAdapter, conditions: Sequence[Any] | Any, settings: DecodeSettings,
           negatives: Sequence[Any] | Any | None = None, progress: ProgressFn | None = None,
           timing: bool = False, cost: PassCost | None = None, profile: Profile | None = None) -> DecodeResult:
    """Generate settings.batch_size images. conditions: one per image, or one shared by all (the
    family's prompt, class id, ...); negatives likewise, used as the CFG branch where the family has
    one. progress(done, total, codes) is called after every iteration with the tokens committed so far
    (all images) and the image cells known so far ([B, h, w] codebook indices, -1 where undecided); it
    may raise to abort. timing: split the time into forward / verify / draft (on a GPU this waits for
    the device three times per iteration). cost, profile: the pass cost and acceptance profile an
    automatic window chooses by (default: measured on this device once and cached, see pass_cost and
    acceptance_profile; a decode whose passes stray far from the cached cost forgets it, forget_stale_cost);
    the same cost, profile and seed give the same image."""
    if not isinstance(settings, DecodeSettings):
        raise ValueError(f"settings is a {type(settings).__module__}.{type(settings).__name__}: give a "
                         f"{DecodeSettings.__module__}.DecodeSettings (method_settings makes one for a named method)")
    B = settings.batch_size
    conditions = per_image(conditions, B, "conditions")
    negatives = None if negatives is None else per_image(negatives, B, "negatives")
    asked, auto = settings, settings.window.auto and settings.window.size > 1
    if auto:
        adapter.prompt_length(conditions, negatives, settings.sampling.uses_cfg)   # bad conditions: said now
        cost, profile = calibration(adapter, settings, cost, profile)
        settings = replace(settings, window=replace(settings.window, size=max(p.window for p in profile.plans),
                                                    tree=largest_tree(profile.plans)))
    scratch = scratch_nodes(settings.window.size, settings.window.tree)
    if scratch and not adapter.trees:
        raise ValueError(f"{adapter.family}: this model adapter cannot score draft trees; set tree width to 1")
    with torch.inference_mode():
        try:
            layout, first_logits = adapter.start(conditions, negatives, settings.sampling.uses_cfg, scratch)
            result = JacobiDecoder(adapter, settings, layout, timing, cost, profile).run(first_logits, progress)
            result.stats.pass_cost, result.stats.precision = cost, adapter.precision
        finally:
            adapter.finish()
    if auto:
        forget_stale_cost(adapter, asked, cost, result.stats)
    return result
