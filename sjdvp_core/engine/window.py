"""The Jacobi window's state, and the layout in the engine's local vocabulary.

Every quantity the loop keeps per undecided position lives in one `Window`: the draft tokens, the
distribution each was drawn from, their flags, VP's probability history, auto's candidate
distributions and coupled drafting's noise. Slot s of row b is position n_b + s. When row b commits
m_b tokens every field slides by m_b through one index (`Slide`), so no quantity can fall out of
step with its position."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .adapter import TokenLayout
from .target import structure_mask


class Slide:
    """A window sliding by m[b] slots in row b: new slot s is old slot m[b] + s. The index is
    computed once per field shape and applied to every per-slot field (`take`), without a fill:
    what lands in the slots new to the window is stale, and every reader either overwrites it or
    masks it (History.seen, `new`)."""

    def __init__(self, m: Tensor, width: int):
        self.old = m[:, None] + torch.arange(width, device=m.device)  # [B, width] old slot of each
        self._clamped: dict[tuple, Tensor] = {}  # (width, slots had) -> [B, width]
        self._index: dict[tuple, Tensor] = {}  # ... and the field's shape

    def take(self, t: Tensor, width: int | None = None, dim: int = 1) -> Tensor:
        """t [..., B, S_t, ...] with slots at dim -> the slid field, `width` slots wide (default:
        as t)."""
        have, width = t.shape[dim], width or t.shape[dim]
        # a graph shares the index itself; keys would fix its shapes
        if torch.compiler.is_compiling():
            return t.gather(dim, _along_slots(self.old[:, :width].clamp(max=have - 1), t, dim))
        key = (width, dim, t.shape)
        at = self._index.get(key)
        if at is None:
            clamped = self._clamped.get((width, have))
            if clamped is None:
                clamped = self._clamped[(width, have)] = self.old[:, :width].clamp(max=have - 1)
            at = self._index[key] = _along_slots(clamped, t, dim)
        return t.gather(dim, at)

    def new(self, width: int) -> Tensor:
        """[B, width] slots that did not exist before the slide."""
        return self.old[:, :width] >= width


def _along_slots(at: Tensor, t: Tensor, dim: int) -> Tensor:
    """A slot index [B, width] shaped to gather t's slots at dim (viewed and expanded over t's
    other axes)."""
    if t.dim() == 2 and dim == 1:
        return at
    at = at.view(*([1] * (dim - 1)), *at.shape, *([1] * (t.dim() - dim - 1)))
    return at.expand(*t.shape[: dim - 1], -1, -1, *t.shape[dim + 1 :])


UNKNOWN, ROSE, FLAT = 0, 1, 2  # Window.rose: the momentum statistic's classes


def gather_slot(t: Tensor, slot: Tensor) -> Tensor:
    """t [B, S, V], slot [B] -> [B, V]."""
    return t[torch.arange(slot.shape[0], device=slot.device), slot]


class LocalLayout:
    """A TokenLayout in the engine's local vocabulary (image tokens first, in codebook order, then
    the structure tokens), with per-position lookups padded past the end so a window may run over
    it: the forced local id (-1 where the model chooses), the latest image cell at or before a
    position, and the cells left of and above a cell (-1 where there is none)."""

    def __init__(self, layout: TokenLayout, pad: int, device):
        self.layout, self.length = layout, layout.length
        # local id -> vocabulary id
        self.vocab = torch.cat([layout.image_tokens, layout.special_tokens]).to(device)
        self.num_image, self.size = layout.image_tokens.numel(), self.vocab.numel()
        first = int(self.vocab[0])
        # local ids that are one run of model ids (LlamaGen's, Janus's): the logits' columns are a
        # view
        self.run = (
            first if torch.equal(self.vocab.cpu(), torch.arange(first, first + self.size)) else None
        )
        self.span = layout.jacobi_span
        self.grid = layout.grid.to(device)
        L = self.length
        to_local = {int(t): i for i, t in enumerate(self.vocab.tolist())}
        forced = [to_local[int(t)] if t >= 0 else -1 for t in layout.forced.tolist()]
        self.forced = torch.tensor(forced + [-1] * pad, device=device)
        is_cell = torch.zeros(L + pad, dtype=torch.bool)
        above, left = torch.full((L + pad,), -1), torch.full((L + pad,), -1)
        for (
            grid
        ) in layout.grids:  # neighbours within each grid (a prior grid's cells are cells too)
            is_cell[grid.flatten()] = True
            above[grid[1:].flatten()] = grid[:-1].flatten()
            left[grid[:, 1:].flatten()] = grid[:, :-1].flatten()
        idx = torch.where(is_cell, torch.arange(L + pad), torch.full((L + pad,), -1))
        self.last_cell = idx.cummax(0).values.to(device)
        self.above, self.left = above.to(device), left.to(device)
        # the structure mask of every position, through a few distinct rows: free, or forced to one
        # token
        kinds = sorted(set(forced)) + [-1]
        self.mask_rows = structure_mask(
            torch.tensor(kinds, device=device), self.num_image, self.size
        )
        self.mask_kind = torch.tensor(
            [kinds.index(t) for t in forced] + [kinds.index(-1)] * pad, device=device
        )
        # the forced tokens after the image (row end, end of image, ...) are known: a row is done at
        # free_end
        self.free_end = L
        while self.free_end > self.span[1] and forced[self.free_end - 1] >= 0:
            self.free_end -= 1

    def local_logits(self, logits: Tensor) -> Tensor:
        """Model logits [..., V_model] -> [..., size], in local order: a slice (no copy) where the
        local vocabulary is one run of model ids, else a gather of its columns."""
        if self.run is not None:
            return logits[..., self.run : self.run + self.size]
        return logits.index_select(-1, self.vocab)

    def forced_at(self, positions: Tensor) -> Tensor:
        return self.forced[positions]

    def mask_at(self, positions: Tensor) -> Tensor:
        """[..., V] target.structure_mask of the tokens at positions [...]."""
        return self.mask_rows[self.mask_kind[positions]]


@dataclass
class History:
    """VP's probability history of the window's undecided positions, per slot: an exponentially
    weighted mean of the targets (pbar), the last target (prev), per token the number of consecutive
    rises (growth), and how often the slot was observed. It has one slot more than the drafts: the
    window's last scored position is observed before it gets a draft slot."""

    pbar: Tensor  # [B, slots, V]
    prev: Tensor  # [B, slots, V]
    growth: Tensor  # [B, slots, V] int16
    seen: Tensor  # [B, slots] long

    @classmethod
    def empty(cls, batch: int, slots: int, vocab: int, device) -> "History":
        def z(*shape, dtype=torch.float32):
            return torch.zeros(*shape, dtype=dtype, device=device)

        return cls(
            z(batch, slots, vocab),
            z(batch, slots, vocab),
            z(batch, slots, vocab, dtype=torch.int16),
            z(batch, slots, dtype=torch.long),
        )

    def observe(self, p: Tensor, observed: Tensor, beta: float) -> tuple["History", Tensor]:
        """Observations p [B, slots, V] folded into the observed slots [B, slots] -> (the new
        history, the growth counts every slot would have with this observation)."""
        seen = (self.seen > 0)[..., None]
        rose = seen & (p > self.prev)
        growth = torch.where(rose, self.growth + 1, 0)
        pbar = torch.where(seen, beta * self.pbar + (1 - beta) * p, p)
        obs = observed[..., None]
        return History(
            torch.where(obs, pbar, self.pbar),
            torch.where(obs, p, self.prev),
            torch.where(obs, growth, self.growth),
            self.seen + observed,
        ), growth

    def narrow(self, slots: int) -> "History":
        """The first `slots` slots."""
        return History(
            self.pbar[:, :slots], self.prev[:, :slots], self.growth[:, :slots], self.seen[:, :slots]
        )

    def joined(self, more: "History") -> "History":
        """This history, then more's slots after its first: more begins at this one's last position
        (a window's history has a slot past its drafts, and the next window's drafts begin
        there)."""
        return History(
            *(
                torch.cat([a, b[:, 1:]], 1)
                for a, b in zip(
                    (self.pbar, self.prev, self.growth, self.seen),
                    (more.pbar, more.prev, more.growth, more.seen),
                )
            )
        )

    def slide(self, slide: Slide) -> "History":
        """Slots new to the window start unseen (their other fields are stale and ignored until
        seen)."""
        seen = slide.take(self.seen)
        return History(
            slide.take(self.pbar),
            slide.take(self.prev),
            slide.take(self.growth),
            seen.masked_fill(slide.new(seen.shape[1]), 0),
        )


@dataclass
class Window:
    """Per-slot state of the window's undecided positions: S = W - 1 draft slots (the positions
    after the last committed token that the next forward feeds), and VP's history (one slot more,
    see History)."""

    tokens: Tensor  # [B, S] local ids of the drafts
    q: Tensor  # [B, S, V] the distribution each draft was really drawn from
    fused: Tensor  # [B, S] drawn from VP's fused distribution
    rose: Tensor  # [B, S] long: whether the draft's probability rose at the observation it was
    # re-drafted from (ROSE, FLAT), or UNKNOWN (drafted fresh or without a history)
    history: History  # VP's probability history, [B, S + 1, ...]
    noise: Tensor | None = None  # [B, S, V] coupled drafting's Gumbel noise (float64)
    candidates: Tensor | None = (
        None  # [C, B, S, V] VP auto: each candidate strength's draft distribution
    )

    @property
    def slots(self) -> int:
        return self.tokens.shape[1]

    def narrow(self, slots: int) -> "Window":
        """The first `slots` draft slots (and their history): a narrower plan's window (auto.py)."""
        return Window(
            self.tokens[:, :slots],
            self.q[:, :slots],
            self.fused[:, :slots],
            self.rose[:, :slots],
            self.history.narrow(slots + 1),
            None if self.noise is None else self.noise[:, :slots],
            None if self.candidates is None else self.candidates[:, :, :slots],
        )

    def joined(self, more: "Window") -> "Window":
        """This window's slots, then more's (drafted for the positions after them): a wider
        plan's window."""

        def cat(a, b, dim=1):
            return None if a is None else torch.cat([a, b], dim)

        return Window(
            cat(self.tokens, more.tokens),
            cat(self.q, more.q),
            cat(self.fused, more.fused),
            cat(self.rose, more.rose),
            self.history.joined(more.history),
            cat(self.noise, more.noise),
            cat(self.candidates, more.candidates, 2),
        )
