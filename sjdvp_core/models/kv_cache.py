"""A preallocated KV cache written by position (as gpt-fast's), with per-row positions.

A Jacobi window writes its W entries at their positions; entries of rejected drafts are simply
written over by the next window, and the attention mask hides every slot after a query's own
position. So rollback costs nothing and no layer is ever re-sliced. Rows may sit at different
positions, which lets each image in a batch accept its own number of tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


class StaticKVCache(nn.Module):
    def __init__(
        self, rows: int, heads: int, max_len: int, head_dim: int, dtype=torch.float32, device=None
    ):
        super().__init__()
        shape = (rows, heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """positions [R, W] (each < max_len; not checked here, which would wait for the device in
        every layer: the engine keeps positions inside the layout); k, v [R, H, W, D] -> the
        whole cache [R, H, S, D] after the write."""
        # a no-op unless a device map put this layer elsewhere
        positions = positions.to(self.k.device)
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        self.k[rows, :, positions] = k.transpose(1, 2).to(self.k.dtype)
        self.v[rows, :, positions] = v.transpose(1, 2).to(self.v.dtype)
        return self.k, self.v

    def copy_slots(self, src: Tensor, dst: Tensor) -> None:
        """Per row, the entries at slots src [R, M] are copied to slots dst [R, M] (a draft tree's
        accepted branch moving from its scratch slots to its positions)."""
        src, dst = src.to(self.k.device), dst.to(self.k.device)
        rows = torch.arange(src.shape[0], device=src.device)[:, None]
        self.k[rows, :, dst] = self.k[rows, :, src]
        self.v[rows, :, dst] = self.v[rows, :, src]


def causal_mask(positions: Tensor, max_len: int, key_valid: Tensor | None = None) -> Tensor:
    """[R, 1, W, S] bool: query at position t sees cache slots 0..t (and only valid keys, e.g. not
    the left padding of a CFG row)."""
    keys = torch.arange(max_len, device=positions.device)
    mask = keys[None, None, :] <= positions[:, :, None]
    if key_valid is not None:
        mask = mask & key_valid[:, None, :]
    return mask[:, None]


def window_mask(slots: Tensor, max_len: int, key_valid: Tensor | None = None) -> Tensor:
    """causal_mask for a window written at cache slots [R, W], where every query also sees its own
    slot (a query on a CFG row's left padding would otherwise see no key at all)."""
    own = torch.arange(max_len, device=slots.device) == slots[:, None, :, None]
    return causal_mask(slots, max_len, key_valid) | own


def additive_mask(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A bool attention mask -> the additive one SDPA takes: 0 where a key is seen, the dtype's
    lowest value where not (as transformers does: a row with no key seen stays finite). Made once
    per forward rather than inside every layer's attention."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min
    )


def kv_bytes(
    layers: int, rows: int, kv_heads: int, entries: int, head_dim: int, itemsize: int
) -> int:
    """Bytes of a K and V cache of `entries` slots per row in every layer."""
    return 2 * layers * rows * kv_heads * entries * head_dim * itemsize


@dataclass(frozen=True)
class ForwardShape:
    """What one forward's transient memory depends on: heads, hidden and MLP widths, logits width,
    and whether its attention materialises the scores (measured: our GPT's bool-masked attention
    does on the CPU, transformers' additive-masked SDPA takes a fused kernel that does not)."""

    heads: int
    hidden: int
    ffn: int
    vocab: int
    scores: bool = True


def forward_bytes(
    shape: ForwardShape, rows: int, tokens: int, entries: int, itemsize: int, scored: int
) -> int:
    """Transient bytes of one forward of `tokens` per row over `entries` cache slots, with logits
    for `scored` of them (a prefill scores its last token only): the attention scores [R, H, W,
    S] in the compute dtype where materialised, the mask [R, 1, W, S] (bool and additive), a
    block's live activations (two of hidden width, two of MLP width) and the logits [R, W, V]
    (the head's output, and its fp32 copy where the compute dtype is narrower). Checked against
    measured peaks (tests/models/test_memory.py)."""
    scores = shape.heads * entries if shape.scores else 0
    per_token = (scores + 2 * shape.hidden + 2 * shape.ffn) * itemsize + entries * (1 + itemsize)
    logits = shape.vocab * (itemsize + (4 if itemsize < 4 else 0))
    return rows * (tokens * per_token + scored * logits)


def tree_slots(slots: Tensor, chain: int, scratch: int) -> Tensor:
    """A draft tree's cache slots: nodes [R, N] at the slots of their positions; the first `chain`
    nodes (the main chain) keep them, the others get scratch slots scratch, scratch + 1, ...
    (past the sequence), so siblings at one position never overwrite each other."""
    extra = scratch + torch.arange(slots.shape[1] - chain, device=slots.device)
    return torch.cat([slots[:, :chain], extra.expand(slots.shape[0], -1)], 1)


def adopt_branch(caches, positions: Tensor, chain: int, scratch: int, nodes: Tensor) -> None:
    """After a tree forward that wrote its nodes at tree_slots(positions, chain, scratch) for
    position slots [R, N]: the nodes [R, M] per row move to their positions' slots in every cache
    (a chain node is already there). Computed again from the tree's positions, not remembered
    from its forward: a recorded pass (engine/captured.py) replays without running Python."""
    src, dst = tree_slots(positions, chain, scratch).gather(1, nodes), positions.gather(1, nodes)
    for cache in caches:
        cache.copy_slots(src, dst)


def tree_mask(
    slots: Tensor, ancestors: Tensor, max_len: int, key_valid: Tensor | None = None
) -> Tensor:
    """[R, 1, N, S] bool for tree nodes at cache slots [R, N] whose first node is the chain's first:
    a node sees the committed slots before that one (valid keys only) and its ancestors' slots
    (ancestors [N, N], itself included), nothing else, whatever stale entries the cache holds."""
    R, N = slots.shape
    keys = torch.arange(max_len, device=slots.device)
    mask = (keys[None, None, :] < slots[:, :1, None]).expand(R, N, max_len)
    if key_valid is not None:
        mask = mask & key_valid[:, None, :]
    seen = torch.zeros(R, N, max_len, dtype=torch.int32, device=slots.device)
    seen.scatter_add_(
        2, slots[:, None, :].expand(R, N, N), ancestors.to(torch.int32)[None].expand(R, N, N)
    )
    return (mask | (seen > 0))[:, None]
