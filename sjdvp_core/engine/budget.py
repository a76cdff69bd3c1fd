"""What a decode needs in memory beyond the weights: the model's KV cache for its rows, one
forward's transients and the loop's own state. What a memory manager is told to keep free
(models/memory.py, the ComfyUI nodes)."""

from __future__ import annotations

from typing import Any, Sequence

from .adapter import ModelAdapter, TokenLayout
from .auto import TREES, Plan, largest_tree
from .captured import pass_kind
from .cost import GRID
from .settings import AUTO_STRENGTHS, DecodeSettings
from .tree import scratch_nodes
from .verify import neighbour_bytes, neighbours_built


def widest_tree(settings: DecodeSettings):
    """The draft tree a decode may use at most: the user's, and with an automatic tree the largest
    auto weighs beside it (candidate_plans offers TREES with the user's tree too)."""
    w = settings.window
    return largest_tree(
        [Plan(w.size, t) for t in (w.tree, *(TREES if w.auto and w.auto_tree else ()))]
    )


def state_bytes(settings: DecodeSettings, layout: TokenLayout) -> int:
    """Memory the loop holds beyond the model's KV cache, for memory managers: the Window's
    per-slot, per-vocabulary-entry tensors (q; coupled drafting's noise in float64; auto's
    candidates; VP's history, one slot wider: pbar and prev in fp32, growth in int16) and a draft
    tree's (each alternative's q, the targets of the nodes past the chain, fresh noise for the
    draws), doubled for the temporaries of one iteration."""
    S, d, tree = max(1, settings.window.size - 1), settings.drafter, widest_tree(settings)
    candidates = len(AUTO_STRENGTHS) if d.vp is not None and d.vp.auto else 0
    per_row = S * (4 * (1 + candidates) + 8 * d.coupled) + (S + 1) * (4 + 4 + 2)
    scratch = scratch_nodes(settings.window.size, tree)
    if scratch:
        levels = min(tree.depth, S)
        per_row += 4 * (levels * (tree.width - 1) + scratch) + 8 * levels
    return (
        2
        * settings.batch_size
        * per_row
        * (layout.image_tokens.numel() + layout.special_tokens.numel())
    )


def decode_bytes(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    conditions: Sequence[Any] | Any = None,
    negatives: Sequence[Any] | Any | None = None,
    itemsize: int | None = None,
) -> int:
    """Memory a decode with these settings needs beyond the weights: the model's KV cache for its
    rows (CFG doubles or triples them; a draft tree adds scratch entries; the prompt's length where
    conditions are given), one forward's transients (the prefill's with its references' encoders),
    the loop's own state, and LANTERN's neighbour table as it is built (not once it is: it stays
    with the model). What a memory manager is told to keep free. itemsize: of the compute dtype
    (default: the weights')."""
    cfg, B = settings.sampling.uses_cfg, settings.batch_size
    conditions = None if conditions is None else per_image(conditions, B, "conditions")
    rows = B * adapter.row_groups(conditions, cfg)
    scratch = scratch_nodes(settings.window.size, widest_tree(settings))
    prompt = adapter.prompt_length(
        conditions, None if negatives is None else per_image(negatives, B, "negatives"), cfg
    )
    # a window's forward, or the prefill's
    window = min(settings.window.size, adapter.layout.length) + scratch
    forward = max(
        adapter.forward_bytes(rows, window, scratch, prompt, itemsize),
        adapter.forward_bytes(rows, prompt or 0, scratch, prompt, itemsize, scored=1)
        + adapter.reference_bytes(conditions),
    )
    d = settings.drafter
    lantern = (
        neighbour_bytes(adapter.layout.image_tokens.numel(), d.lantern_k)
        if d.verifier == "lantern"
        and d.lantern_delta > 0
        and not neighbours_built(adapter.module, d.lantern_k)
        else 0
    )
    recorded = (
        recorded_bytes(adapter, settings, rows, window, scratch, prompt, itemsize)
        if pass_kind(adapter, settings.passes) == "captured"
        else 0
    )
    return (
        adapter.cache_bytes(rows, scratch, prompt, itemsize)
        + state_bytes(settings, adapter.layout)
        + forward
        + lantern
        + recorded
    )


def recorded_bytes(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    rows: int,
    window: int,
    scratch: int,
    prompt: int | None,
    itemsize: int | None,
) -> int:
    """What recorded passes hold while a decode runs (engine/captured.py): their shared pool, one
    pass's transients, and each shape's own logits, for every plan the decode may run (a fixed
    window's, or each window of the grid and each tree an automatic one may weigh) at the widest
    pass's size, a bound."""
    w = settings.window
    shapes = (
        1 + w.tree.on
        if not w.auto
        else sum(k <= w.size for k in GRID) + len(TREES) * w.auto_tree + w.tree.on
    )
    pass_bytes = adapter.forward_bytes(rows, window, scratch, prompt, itemsize)
    logits = pass_bytes - adapter.forward_bytes(rows, window, scratch, prompt, itemsize, scored=0)
    return pass_bytes + shapes * logits


def per_image(values, batch: int, name: str) -> list:
    """One value per image: a list of one per image, or one (alone or in a list of one) shared by
    all."""
    if isinstance(values, (list, tuple)):
        if len(values) == 1:
            return list(values) * batch
        if len(values) != batch:
            raise ValueError(
                f"{name}: got {len(values)} for batch_size={batch}; give one per image or one for all"
            )
        return list(values)
    return [values] * batch
