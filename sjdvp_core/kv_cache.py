"""A preallocated KV cache written by position (as gpt-fast's), with per-row positions.

A Jacobi window writes its W entries at their positions; entries of rejected drafts are simply written
over by the next window, and the attention mask hides every slot after a query's own position. So
rollback costs nothing and no layer is ever re-sliced. Rows may sit at different positions, which lets
each image in a batch accept its own number of tokens.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn


class StaticKVCache(nn.Module):
    def __init__(self, rows: int, heads: int, max_len: int, head_dim: int, dtype=torch.float32, device=None):
        super().__init__()
        shape = (rows, heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def update(self, positions: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """positions [R, W] (each < max_len; not checked here, which would wait for the device in every
        layer: the engine keeps positions inside the layout); k, v [R, H, W, D] -> the whole cache
        [R, H, S, D] after the write."""
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        self.k[rows, :, positions] = k.transpose(1, 2).to(self.k.dtype)
        self.v[rows, :, positions] = v.transpose(1, 2).to(self.v.dtype)
        return self.k, self.v


def causal_mask(positions: Tensor, max_len: int, key_valid: Tensor | None = None) -> Tensor:
    """[R, 1, W, S] bool: query at position t sees cache slots 0..t (and only valid keys, e.g. not
    the left padding of a CFG row)."""
    keys = torch.arange(max_len, device=positions.device)
    mask = keys[None, None, :] <= positions[:, :, None]
    if key_valid is not None:
        mask = mask & key_valid[:, None, :]
    return mask[:, None]
