"""The Jacobi window's state, and the layout in the engine's local vocabulary.

Every quantity the loop keeps per undecided position lives in one `Window`: the draft tokens, the
distribution each was drawn from, their flags, VP's probability history, auto's candidate
distributions and coupled drafting's noise. Slot s of row b is position n_b + s. When row b commits m_b
tokens every field slides by m_b at once (`slide`), so no quantity can fall out of step with its
position; `where` picks per slot between two windows.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from .adapter import TokenLayout


def shift_slots(t: Tensor, shift: Tensor, width: int, fill=0) -> Tensor:
    """Per row b, new slot s <- old slot shift[b] + s (fill where that runs past the old slots).
    t [B, S_old, ...] -> [B, width, ...]."""
    B, S_old = t.shape[:2]
    idx = shift[:, None] + torch.arange(width, device=t.device)              # [B, width]
    valid = idx < S_old
    idx = idx.clamp(max=S_old - 1).view(B, width, *([1] * (t.dim() - 2))).expand(B, width, *t.shape[2:])
    out = t.gather(1, idx)
    mask = valid.view(B, width, *([1] * (t.dim() - 2)))
    return torch.where(mask, out, torch.full_like(out, fill))


def gather_slot(t: Tensor, slot: Tensor) -> Tensor:
    """t [B, S, V], slot [B] -> [B, V]."""
    return t.gather(1, slot.view(-1, 1, 1).expand(-1, 1, t.shape[-1])).squeeze(1)


class LocalLayout:
    """A TokenLayout in the engine's local vocabulary (image tokens first, in codebook order, then the
    structure tokens), with per-position lookups padded past the end so a window may run over it:
    the forced local id (-1 where the model chooses), the latest image cell at or before a position,
    and the cells left of and above a cell (-1 where there is none)."""

    def __init__(self, layout: TokenLayout, pad: int, device):
        self.layout, self.length = layout, layout.length
        self.vocab = torch.cat([layout.image_tokens, layout.special_tokens]).to(device)   # local id -> vocabulary id
        self.num_image, self.size = layout.image_tokens.numel(), self.vocab.numel()
        self.span = layout.jacobi_span
        self.grid = layout.grid.to(device)
        L = self.length
        to_local = {int(t): i for i, t in enumerate(self.vocab.tolist())}
        forced = [to_local[int(t)] if t >= 0 else -1 for t in layout.forced.tolist()]
        self.forced = torch.tensor(forced + [-1] * pad, device=device)
        is_cell = torch.zeros(L + pad, dtype=torch.bool)
        is_cell[layout.grid.flatten()] = True
        idx = torch.where(is_cell, torch.arange(L + pad), torch.full((L + pad,), -1))
        self.last_cell = idx.cummax(0).values.to(device)
        above, left = torch.full((L + pad,), -1), torch.full((L + pad,), -1)
        above[layout.grid[1:].flatten()] = layout.grid[:-1].flatten()
        left[layout.grid[:, 1:].flatten()] = layout.grid[:, :-1].flatten()
        self.above, self.left = above.to(device), left.to(device)
        # the forced tokens after the image (row end, end of image, ...) are known: a row is done at free_end
        self.free_end = L
        while self.free_end > self.span[1] and forced[self.free_end - 1] >= 0:
            self.free_end -= 1

    def forced_at(self, positions: Tensor) -> Tensor:
        return self.forced[positions]


class History:
    """VP's probability history of the window's undecided positions, per slot: an exponentially
    weighted mean of the targets (pbar), the last target (prev), per token the number of consecutive
    rises (growth), and how often the slot was observed. It has one slot more than the drafts: the
    window's last scored position is observed before it gets a draft slot."""

    def __init__(self, pbar: Tensor, prev: Tensor, growth: Tensor, seen: Tensor):
        self.pbar, self.prev, self.growth, self.seen = pbar, prev, growth, seen

    @classmethod
    def empty(cls, batch: int, slots: int, vocab: int, device) -> "History":
        def z(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=device)
        return cls(z(batch, slots, vocab), z(batch, slots, vocab), z(batch, slots, vocab, dtype=torch.int16),
                   z(batch, slots, dtype=torch.long))

    def observe(self, p: Tensor, observed: Tensor, beta: float) -> tuple["History", Tensor]:
        """Observations p [B, slots, V] folded into the observed slots [B, slots] -> (the new history,
        the growth counts every slot would have with this observation)."""
        seen = (self.seen > 0)[..., None]
        rose = seen & (p > self.prev)
        growth = torch.where(rose, self.growth + 1, torch.zeros_like(self.growth))
        pbar = torch.where(seen, beta * self.pbar + (1 - beta) * p, p)
        obs = observed[..., None]
        return History(torch.where(obs, pbar, self.pbar), torch.where(obs, p, self.prev),
                       torch.where(obs, growth, self.growth), self.seen + observed.long()), growth

    def slide(self, m: Tensor) -> "History":
        return History(*(shift_slots(t, m, t.shape[1]) for t in (self.pbar, self.prev, self.growth, self.seen)))


@dataclass
class Window:
    """Per-slot state of the window's undecided positions: S = W - 1 draft slots (the positions after
    the last committed token that the next forward feeds), and VP's history (one slot more, see History)."""
    tokens: Tensor                 # [B, S] local ids of the drafts
    q: Tensor                      # [B, S, V] the distribution each draft was really drawn from
    fresh: Tensor                  # [B, S] drafted at initialisation, never from a target
    fused: Tensor                  # [B, S] drawn from VP's fused distribution
    rose: Tensor                   # [B, S] int8: its probability rose at its last observation (1), not (0),
                                   # unknown (-1)
    history: History               # VP's probability history, [B, S + 1, ...]
    noise: Tensor | None = None    # [B, S, V] coupled drafting's Gumbel noise (float64)
    candidates: Tensor | None = None  # [C, B, S, V] VP auto: each candidate strength's draft distribution

    def slide(self, m: Tensor) -> "Window":
        """Row b forgets its first m[b] slots (now committed); the rest move down, new slots are empty."""
        def slid(name, t):
            if t is None:
                return None
            if name == "history":
                return t.slide(m)
            if name == "candidates":        # slots are its third dimension
                return torch.stack([shift_slots(c, m, c.shape[1]) for c in t])
            return shift_slots(t, m, t.shape[1])
        return Window(**{f.name: slid(f.name, getattr(self, f.name)) for f in fields(self)})

    def where(self, mask: Tensor, other: "Window") -> "Window":
        """Per draft slot (mask [B, S]): this window's state where mask, the other's elsewhere. Fields the
        two windows share (the same object, as the history and noise usually are) are kept as they are."""
        def pick(name, a, b):
            if a is b:
                return a
            if name == "history":
                raise ValueError("Window.where: the two windows must share their history")
            m = mask[None] if name == "candidates" else mask
            return torch.where(m.view(*m.shape, *([1] * (a.dim() - m.dim()))), a, b)
        return Window(**{f.name: pick(f.name, getattr(self, f.name), getattr(other, f.name)) for f in fields(self)})
