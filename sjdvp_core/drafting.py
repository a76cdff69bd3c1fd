"""Fresh drafts for positions that enter the window with no history.

random: uniform over the image vocabulary, stored with q = that uniform distribution (the distribution
it was really drawn from; a higher acceptance than declaring it one-hot, and just as exact).
repeat_left / repeat_above: copy the nearest known image cell to the left / above (from committed
tokens or carried drafts), stored with a one-hot q. Forced positions always get their forced token.
"""
from __future__ import annotations

import torch
from torch import Tensor


class DraftInit:
    def __init__(self, scheme: str, forced_local: Tensor, grid: Tensor, num_image: int, vocab: int,
                 pad: int, device):
        L = forced_local.numel()
        self.scheme, self.num_image, self.vocab = scheme, num_image, vocab
        # per position j in [0, L + pad): forced local id (-1 free), latest image cell <= j, cell above
        self.forced = torch.cat([forced_local, torch.full((pad,), -1)]).to(device)
        is_cell = torch.zeros(L + pad, dtype=torch.bool)
        is_cell[grid.flatten()] = True
        idx = torch.where(is_cell, torch.arange(L + pad), torch.full((L + pad,), -1))
        self.last_cell = idx.cummax(0).values.to(device)
        above = torch.full((L + pad,), -1)
        above[grid[1:].flatten()] = grid[:-1].flatten()
        self.above = above.to(device)
        self.uniform = torch.zeros(vocab, device=device)
        self.uniform[:num_image] = 1.0 / num_image

    def forced_at(self, positions: Tensor) -> Tensor:
        return self.forced[positions]

    def __call__(self, positions: Tensor, canvas: Tensor, known_end: Tensor,
                 generator: torch.Generator) -> tuple[Tensor, Tensor]:
        """Drafts for positions [B, S] given canvas [B, L + pad] known below known_end [B].
        Returns tokens [B, S] and their draft distributions q [B, S, V]."""
        tokens = torch.randint(self.num_image, positions.shape, generator=generator,
                               device=positions.device)
        one_hot = torch.zeros_like(tokens, dtype=torch.bool)
        if self.scheme != "random":
            src = self._source(positions, known_end)
            copy = src >= 0
            tokens = torch.where(copy, canvas.gather(1, src.clamp_min(0)), tokens)
            one_hot |= copy
        forced = self.forced[positions]
        tokens = torch.where(forced >= 0, forced, tokens)
        one_hot |= forced >= 0
        q = torch.where(one_hot[..., None], torch.nn.functional.one_hot(tokens, self.vocab).float(),
                        self.uniform.expand(*tokens.shape, -1))
        return tokens, q

    def _source(self, positions: Tensor, known_end: Tensor) -> Tensor:
        """Position to copy from, or -1. Unknown sources chain back to known ones."""
        left = self.last_cell[(known_end - 1).clamp_min(0)][:, None].expand_as(positions)
        if self.scheme == "repeat_left":
            return left
        src = self.above[positions]
        unknown = src >= known_end[:, None]
        while bool(unknown.any()):
            src = torch.where(unknown, self.above[src], src)
            unknown = src >= known_end[:, None]
        return torch.where(src >= 0, src, left)


def gumbel_noise(shape, generator: torch.Generator, device) -> Tensor:
    """Standard Gumbel noise, one value per (position, token), through the run's generator."""
    u = torch.rand(shape, generator=generator, device=device)
    return -torch.log(-torch.log(u.clamp(1e-20, 1.0 - 1e-7)))


def coupled_draw(dist: Tensor, noise: Tensor) -> Tensor:
    """Gumbel-max: argmax(log dist + noise) is distributed as dist, and with the noise held fixed a
    draft only changes where dist itself moved (coupled drafting, as in MC-SJD / SCD, arXiv
    2510.24211). Exact for verification as long as a position's noise never touched anything the
    position's own target was computed from, which causality guarantees (noise at j only feeds inputs
    that predict later positions)."""
    return (torch.log(dist) + noise).argmax(-1)
