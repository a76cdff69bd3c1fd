"""Fresh drafts: the first draft of a position entering the Jacobi window, which has no target yet.

A copy of the nearest known cell above (the default: the SJD paper's vertical repeat) or to the left
(one-hot q), or random over the image vocabulary (stored with q = that uniform distribution, the
distribution they were really drawn from: exact, and accepted more often than declaring the draw
one-hot). Forced positions always get their forced token. Under coupled drafting the random draw is the
Gumbel-max of the uniform q with the position's noise, so a later re-draft continues the same noise.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .window import LocalLayout


class FreshDrafts:
    """Drafts for positions with no target yet."""

    def __init__(self, scheme: str, local: LocalLayout, slots: int, device):
        self.local = local
        self.ids = torch.arange(local.size, device=device)
        self.uniform = torch.zeros(local.size, device=device)
        self.uniform[:local.num_image] = 1.0 / local.num_image
        self.log_uniform = torch.log(self.uniform[0])   # an image token's log q under a uniform draft
        self.sources = None if scheme == "random" else copy_sources(scheme, local, max(slots, 1)).to(device)

    def random(self, shape, generator: torch.Generator, device) -> Tensor:
        """The random image tokens `__call__` may use, through the run's generator."""
        return torch.randint(self.local.num_image, shape, generator=generator, device=device)

    def __call__(self, positions: Tensor, canvas: Tensor, known_end: Tensor, random: Tensor,
                 noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Drafts for positions [B, S] given canvas [B, L + pad] known below known_end [B], and random image
        tokens [B, S] (`random`), or with coupled drafting's noise [B, S, V] the Gumbel-max of the uniform q
        (coupled_draw's draw, over the image tokens alone). Only the drafts at positions from known_end on are
        fresh (the caller keeps the others). Returns tokens [B, S] and their draft distributions q [B, S, V]."""
        tokens = random if noise is None else (noise[..., :self.local.num_image] + self.log_uniform).argmax(-1)
        one_hot = torch.zeros_like(tokens, dtype=torch.bool)
        if self.sources is not None:   # one lookup: the position known_end + d copies sources[known_end, d]
            ahead = (positions - known_end[:, None]).clamp(0, self.sources.shape[1] - 1)
            src = self.sources[known_end[:, None], ahead]
            copy = src >= 0
            tokens = torch.where(copy, canvas.gather(1, src.clamp_min(0)), tokens)
            one_hot |= copy
        forced = self.local.forced_at(positions)
        tokens = torch.where(forced >= 0, forced, tokens)
        one_hot |= forced >= 0
        return tokens, torch.where(one_hot[..., None], (self.ids == tokens[..., None]).float(), self.uniform)


def copy_sources(scheme: str, local: LocalLayout, slots: int) -> Tensor:
    """[L + pad, slots]: the position a fresh draft at e + d copies when the positions before e are known
    (repeat_above: the cell above it, chained up through unknown cells to a known one; where there is none,
    and for repeat_left, the last known cell), -1 for none. Built once per decode, so that drafting looks a
    source up in one gather rather than following the chain every iteration."""
    above, last_cell = local.above.cpu(), local.last_cell.cpu()
    size = above.shape[0]
    known = torch.arange(size)[:, None]
    left = last_cell[(known - 1).clamp_min(0)].expand(size, slots)
    if scheme == "repeat_left":
        return left.contiguous()
    src = above[(known + torch.arange(slots)).clamp(max=size - 1)]
    while bool((src >= known).any()):   # a cell's above is an earlier position: the chain ends
        src = torch.where(src >= known, above[src], src)
    return torch.where(src >= 0, src, left)
