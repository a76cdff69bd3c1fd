"""How drafts are made: fresh ones for positions entering the window, and re-drafts of the positions
a forward pass scored but did not commit.

A re-draft has a source (the target p, or VP's fusion of p with its history: vp.py) and a draw
(coupled by each position's Gumbel noise, as SCD's coupling, So et al., ICML 2026; sampled; or
SJD-PAC's continuation), small rule classes in tables (SOURCES, DRAWS) that `Drafter` binds. Every
draft is stored with q = the distribution really drawn from, so verification stays exact.
docs/method.md says more."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from .devices import wide_float
from .settings import AUTO_STRENGTHS, DrafterSettings, VPSettings
from .target import draw, residual, uniform
from .vp import AutoStrength, fuse, strength_weights
from .window import FLAT, ROSE, UNKNOWN, History, LocalLayout, Slide, Window


def gumbel_noise(shape, generator: torch.Generator, device) -> Tensor:
    """Standard Gumbel noise, one value per (position, token), through the run's generator, in
    float64: with float32 uniforms (2^24 levels) two of K = 16384 noisy scores tie at the maximum
    about once in a thousand draws, and argmax breaks ties toward low token ids, a bias of about
    5e-4 in total variation."""
    dtype = wide_float(device)
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    return -torch.log(-torch.log(u.clamp(tiny, 1.0 - torch.finfo(dtype).eps)))


def coupled_draw(dist: Tensor, noise: Tensor) -> Tensor:
    """Gumbel-max: argmax(log dist + noise) is distributed as dist, and with the noise held fixed a
    draft only changes where dist itself moved. Exact for verification as long as a position's noise
    never touched anything the position's own target was computed from, which causality guarantees
    (noise at j only feeds inputs that predict later positions)."""
    return noise.add(torch.log(dist)).argmax(-1)  # in the noise's (wider) dtype


def continue_draft(
    x: Tensor, q: Tensor, dist: Tensor, u_keep: Tensor, u_residual: Tensor
) -> Tensor:
    """A draft from dist that keeps the old draft x (drawn from q) as often as possible: x with
    probability min(1, dist(x) / q(x)), else a draw from norm(max(0, dist - q)). The result is
    distributed exactly as dist (the speculative-sampling identity), and it equals x with the
    largest probability any such draw can, sum(min(dist, q)): maximal coupling, as SJD-PAC's
    adaptive continuation (Kang et al., CVPR 2026, arXiv 2603.18599) carries drafts past a
    rejection. The old draft's randomness never reaches the targets that judge its own position,
    so verification stays exact. u_keep, u_residual [...]: uniforms (RedraftDraws)."""
    ratio = (dist.gather(-1, x[..., None]) / q.gather(-1, x[..., None]).clamp_min(1e-30))[..., 0]
    return torch.where(u_keep < ratio, x, draw(residual(dist, q), u_residual))


# --- fresh drafts: the first draft of a position entering the window, which has no target yet ---
# A copy of the nearest known cell above (the default: the SJD paper's vertical repeat) or to the
# left (one-hot q), or random over the image vocabulary, stored with q = that uniform distribution
# (exact, and accepted more often than declaring the draw one-hot). Forced positions get their
# forced token. Under coupled drafting the random draw is the Gumbel-max of the uniform q with the
# position's noise, so a later re-draft continues the same noise.
class FreshDrafts:
    """Drafts for positions with no target yet."""

    def __init__(self, scheme: str, local: LocalLayout, slots: int, device):
        self.local = local
        self.ids = torch.arange(local.size, device=device)
        self.uniform = torch.zeros(local.size, device=device)
        self.uniform[: local.num_image] = 1.0 / local.num_image
        # an image token's log q under a uniform draft
        self.log_uniform = torch.log(self.uniform[0])
        self.sources = (
            None if scheme == "random" else copy_sources(scheme, local, max(slots, 1)).to(device)
        )

    def random(self, shape, generator: torch.Generator, device) -> Tensor:
        """The random image tokens `__call__` may use, through the run's generator."""
        return torch.randint(self.local.num_image, shape, generator=generator, device=device)

    def __call__(
        self,
        positions: Tensor,
        canvas: Tensor,
        known_end: Tensor,
        random: Tensor,
        noise: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Drafts for positions [B, S] given canvas [B, L + pad] known below known_end [B], and
        random image tokens [B, S] (`random`), or with coupled drafting's noise [B, S, V] the
        Gumbel-max of the uniform q (coupled_draw's draw, over the image tokens alone). Only the
        drafts at positions from known_end on are fresh (the caller keeps the others). Returns
        tokens [B, S] and their draft distributions q [B, S, V]."""
        tokens = (
            random
            if noise is None
            else (noise[..., : self.local.num_image] + self.log_uniform).argmax(-1)
        )
        one_hot = torch.zeros_like(tokens, dtype=torch.bool)
        # one lookup: the position known_end + d copies sources[known_end, d]
        if self.sources is not None:
            ahead = (positions - known_end[:, None]).clamp(0, self.sources.shape[1] - 1)
            src = self.sources[known_end[:, None], ahead]
            copy = src >= 0
            tokens = torch.where(copy, canvas.gather(1, src.clamp_min(0)), tokens)
            one_hot |= copy
        forced = self.local.forced_at(positions)
        tokens = torch.where(forced >= 0, forced, tokens)
        one_hot |= forced >= 0
        return tokens, torch.where(
            one_hot[..., None], (self.ids == tokens[..., None]).float(), self.uniform
        )


def copy_sources(scheme: str, local: LocalLayout, slots: int) -> Tensor:
    """[L + pad, slots]: the position a fresh draft at e + d copies when the positions before e are
    known (repeat_above: the cell above it, chained up through unknown cells to a known one;
    where there is none, and for repeat_left, the last known cell), -1 for none. Built once per
    decode, so that drafting looks a source up in one gather rather than following the chain
    every iteration."""
    above, last_cell = local.above.cpu(), local.last_cell.cpu()
    size = above.shape[0]
    known = torch.arange(size)[:, None]
    left = last_cell[(known - 1).clamp_min(0)].expand(size, slots)
    if scheme == "repeat_left":
        return left.contiguous()
    src = above[(known + torch.arange(slots)).clamp(max=size - 1)]
    while bool((src >= known).any()):  # a cell's above is an earlier position: the chain ends
        src = torch.where(src >= known, above[src], src)
    return torch.where(src >= 0, src, left)


@dataclass
class RedraftDraws:
    """The randomness of one re-draft, drawn up front through the run's generator (`Drafter.draws`),
    so that `Drafter.redraft` is a pure function of its inputs (compilable; see loop.py)."""

    fresh: Tensor  # [B, S] random image tokens for fresh drafts
    noise: Tensor | None = None  # [B, S, V] coupled: Gumbel noise for slots new to the window
    draft: Tensor | None = None  # [B, S] sampled: uniforms for the re-drafts' draws
    keep: Tensor | None = None  # [B, S] continuation: uniforms for keeping the old draft
    residual: Tensor | None = None  # [B, S] continuation: uniforms for the residual's draw


@dataclass
class Slots:
    """One re-draft's view of the window after row b committed m[b] tokens: new slot s is old slot
    m[b] + s (`slide`). Masks [B, S]: `redraw` slots this pass scored (re-drafted), `new` slots
    new to the window (drafted fresh), `kept` neither (the old draft stays), `judged` re-drafted
    from a target with a history, `fused` where VP may fuse. p, growth [B, S, V] and the
    histories before and after this pass's observation (`before`, `history`) are in the new
    slots."""

    slide: Slide
    positions: Tensor
    p: Tensor
    growth: Tensor
    before: History
    history: History
    redraw: Tensor
    new: Tensor
    kept: Tensor
    judged: Tensor
    fused: Tensor
    carried: (
        bool  # some slot keeps its old draft: a pass narrower than the window (a draft tree's), or
    )
    # continuation; a chain's pass scores every slot, and its step skips the old drafts' fields

    @classmethod
    def after(
        cls,
        window: Window,
        p: Tensor,
        m: Tensor,
        n: Tensor,
        active: Tensor,
        offsets: Tensor,
        source: "Plain",
        keeps_old: bool,
    ) -> "Slots":
        S, w = window.slots, p.shape[1]
        slide = Slide(m, S + 1)
        before = window.history.slide(slide)
        p = slide.take(p, S + 1)  # this pass's targets in the new slots (stale past them)
        history, growth = before.observe(p, (slide.old < w) & active[:, None], source.beta)
        old = slide.old[:, :S]
        redraw, new = old < w, old >= S
        judged = redraw & (before.seen[:, :S] > 0)
        positions = n[:, None] + offsets[:S]
        return cls(
            slide,
            positions,
            p[:, :S],
            growth[:, :S],
            before,
            history,
            redraw,
            new,
            ~(redraw | new),
            judged,
            source.fusable(judged, positions),
            w < S or keeps_old,
        )

    @property
    def pbar_prev(self) -> Tensor:
        return self.before.pbar[:, : self.p.shape[1]]

    @property
    def pbar(self) -> Tensor:
        return self.history.pbar[:, : self.p.shape[1]]

    def prior(self, field: Tensor | None, dim: int = 1) -> Tensor | None:
        """The old field in the new slots, where some slot keeps it (else never read)."""
        return self.slide.take(field, dim=dim) if self.carried and field is not None else None

    def update(
        self, drafted: Tensor, fresh, old: Tensor | None, mask: Tensor | None = None
    ) -> Tensor:
        """A field in the new slots: drafted where mask (default: redraw), else the old value where
        the slot was kept, else fresh; masks broadcast over the field's trailing axes."""
        mask = self.redraw if mask is None else mask
        rest = fresh if old is None else torch.where(_along(self.kept, old), old, fresh)
        return torch.where(_along(mask, drafted), drafted, rest)


# --- the sources: what a re-draft draws from (the first in SOURCES whose `wants` holds) ---
class Plain:
    """SJD's re-draft: from the position's new target p."""

    beta: ClassVar[float] = 0.5  # the history's decay (kept for the statistics' `rose` without VP)
    auto: AutoStrength | None = None

    def __init__(self, vp: VPSettings | None, local: LocalLayout, device):
        self.vp, self.local = vp, local

    @staticmethod
    def wants(vp: VPSettings | None) -> bool:
        return True

    def fusable(self, judged: Tensor, positions: Tensor) -> Tensor:
        return torch.zeros_like(judged)

    def distribution(self, s: Slots, window: Window) -> tuple[Tensor, Tensor | None]:
        """(the re-drafts' distribution [B, S, V], VP auto's candidates or None)."""
        return s.p, None

    def stored(self, dist: Tensor, s: Slots) -> Tensor:
        """The q stored with a re-draft: what it was drawn from."""
        return dist

    def fresh_candidates(self, batch: int, slots: int, device) -> Tensor | None:
        return None


class FixedVP(Plain):
    """VP at a fixed strength: p fused with the history on judged slots of free positions inside
    the image."""

    def __init__(self, vp: VPSettings, local: LocalLayout, device):
        super().__init__(vp, local, device)
        self.beta = vp.beta
        self.weights = None if vp.auto else strength_weights((vp.strength,), device)  # made once

    @staticmethod
    def wants(vp: VPSettings | None) -> bool:
        return vp is not None

    def fusable(self, judged: Tensor, positions: Tensor) -> Tensor:
        return judged & (self.local.forced_at(positions) < 0) & (positions < self.local.length)

    def distribution(self, s: Slots, window: Window) -> tuple[Tensor, Tensor | None]:
        return fuse(s.p, s.pbar_prev, s.pbar, s.growth, s.fused, self.vp, self.weights), None

    def stored(self, dist: Tensor, s: Slots) -> Tensor:
        # lossy VP: verified against the unfused p (an ablation)
        return dist if self.vp.lossless else s.p


class AutoVP(FixedVP):
    """VP's strength chosen per run (AutoStrength): every candidate strength's fusion is kept per
    slot, so that verification can score what each would have drafted."""

    def __init__(self, vp: VPSettings, local: LocalLayout, device):
        super().__init__(vp, local, device)
        self.auto = AutoStrength(vp, AUTO_STRENGTHS, device)

    @staticmethod
    def wants(vp: VPSettings | None) -> bool:
        return vp is not None and vp.auto

    def distribution(self, s: Slots, window: Window) -> tuple[Tensor, Tensor | None]:
        candidates = self.auto.fuse(s.p, s.pbar_prev, s.pbar, s.growth, s.fused)
        dist = self.auto.chosen(candidates)
        # (elsewhere the new slots' are never read: their drafts are fresh, not fused)
        if s.carried:
            candidates = torch.where(
                _along(s.redraw, candidates), candidates, s.prior(window.candidates, dim=2)
            )
        return dist, candidates

    def fresh_candidates(self, batch: int, slots: int, device) -> Tensor | None:
        return torch.zeros(len(self.auto.strengths), batch, slots, self.local.size, device=device)


SOURCES = (AutoVP, FixedVP, Plain)


# --- the draws: how a re-draft's token is taken from its distribution ---
class Sampled:
    """An independent draw per re-draft (uniforms drawn up front)."""

    keeps_old: ClassVar[bool] = False
    follows_noise: ClassVar[bool] = False

    def randomness(self, shape: tuple[int, int], vocab: int, gen: torch.Generator, device) -> dict:
        """This draw's fields of RedraftDraws, drawn in a fixed order."""
        return {"draft": uniform(shape, gen, device)}

    def fresh_noise(
        self, shape: tuple[int, int, int], gen: torch.Generator, device
    ) -> Tensor | None:
        """Noise for slots drafted fresh (coupled drafting's), or None."""
        return None

    def noise(self, s: Slots, window: Window, draws: RedraftDraws) -> Tensor | None:
        """The window's noise in the new slots, or None."""
        return None

    def __call__(
        self, dist: Tensor, s: Slots, window: Window, noise: Tensor | None, draws: RedraftDraws
    ) -> Tensor:
        # slots not re-drafted get a harmless distribution (their token is never kept)
        return draw(dist.masked_fill(~s.redraw[..., None], 1.0), draws.draft)


class Coupled(Sampled):
    """Gumbel-max with the position's persistent noise: positions new to the draft slots get their
    noise now, the rest keep theirs."""

    follows_noise: ClassVar[bool] = True

    def randomness(self, shape: tuple[int, int], vocab: int, gen: torch.Generator, device) -> dict:
        return {"noise": gumbel_noise((*shape, vocab), gen, device)}

    def fresh_noise(
        self, shape: tuple[int, int, int], gen: torch.Generator, device
    ) -> Tensor | None:
        return gumbel_noise(shape, gen, device)

    def noise(self, s: Slots, window: Window, draws: RedraftDraws) -> Tensor | None:
        return torch.where(s.new[..., None], draws.noise, s.slide.take(window.noise))

    def __call__(
        self, dist: Tensor, s: Slots, window: Window, noise: Tensor | None, draws: RedraftDraws
    ) -> Tensor:
        return coupled_draw(dist, noise)


class Continued:
    """SJD-PAC's continuation over a base draw: a slot that held a draft keeps it by maximal
    coupling (continue_draft); the window's last scored position, which held none, is drawn by
    the base draw."""

    keeps_old: ClassVar[bool] = True
    follows_noise: ClassVar[bool] = False  # a kept draft ignores the noise

    def __init__(self, base: Sampled):
        self.base = base

    def randomness(self, shape: tuple[int, int], vocab: int, gen: torch.Generator, device) -> dict:
        return self.base.randomness(shape, vocab, gen, device) | {
            "keep": torch.rand(shape, generator=gen, device=device),
            "residual": uniform(shape, gen, device),
        }

    def fresh_noise(
        self, shape: tuple[int, int, int], gen: torch.Generator, device
    ) -> Tensor | None:
        return self.base.fresh_noise(shape, gen, device)

    def noise(self, s: Slots, window: Window, draws: RedraftDraws) -> Tensor | None:
        return self.base.noise(s, window, draws)

    def __call__(
        self, dist: Tensor, s: Slots, window: Window, noise: Tensor | None, draws: RedraftDraws
    ) -> Tensor:
        dist = dist.masked_fill(~s.redraw[..., None], 1.0)
        tok = self.base(dist, s, window, noise, draws)
        old_tokens, old_q = s.prior(window.tokens).masked_fill(s.new, 0), s.prior(window.q)
        return torch.where(
            s.new,
            tok,
            continue_draft(
                old_tokens, old_q.masked_fill(s.new[..., None], 0), dist, draws.keep, draws.residual
            ),
        )


DRAWS = {"sampled": Sampled, "coupled": Coupled}


def draw_rule(settings: DrafterSettings) -> Sampled | Continued:
    base = DRAWS["coupled" if settings.coupled else "sampled"]()
    return Continued(base) if settings.continuation else base


class Drafter:
    """The drafting rules of one decode: fresh drafts, a source and a draw for re-drafts. slots: the
    most draft slots its windows have (an automatic window's change from plan to plan within it,
    `resize`)."""

    def __init__(
        self, settings: DrafterSettings, scheme: str, local: LocalLayout, slots: int, device
    ):
        self.vp, self.local = settings.vp, local
        self.source = next(rule for rule in SOURCES if rule.wants(settings.vp))(
            settings.vp, local, device
        )
        self.rule = draw_rule(settings)
        self.auto = self.source.auto
        self.fresh = FreshDrafts(scheme, local, slots, device)
        self.slots = torch.arange(slots, device=device)

    @staticmethod
    def follows_noise(settings: DrafterSettings) -> bool:
        """Whether every draft is the argmax of log q + its position's noise, as coupled drafting
        draws it, so that further draws at a position (draft trees) may continue that noise's
        ranking: not under continuation (a kept draft ignores the noise) nor lossy VP (q is then
        not what was drawn from)."""
        return draw_rule(settings).follows_noise and (settings.vp is None or settings.vp.lossless)

    def start(self, n: Tensor, canvas: Tensor, gen: torch.Generator, slots: int) -> Window:
        """The first window, `slots` draft slots wide: every slot drafted fresh."""
        return self._fresh_window(n, canvas, gen, 0, slots)

    def resize(
        self, window: Window, slots: int, n: Tensor, canvas: Tensor, gen: torch.Generator
    ) -> Window:
        """The window with `slots` draft slots, for an automatic window's next plan (auto.py): a
        narrower one keeps its first slots, a wider one drafts its new slots fresh, as a window
        sliding into them would. So each iteration's step works on its own plan's slots, not on
        the widest plan's."""
        have = window.slots
        if slots <= have:
            return window.narrow(slots)
        return window.joined(self._fresh_window(n, canvas, gen, have, slots - have))

    def _fresh_window(
        self, n: Tensor, canvas: Tensor, gen: torch.Generator, first: int, count: int
    ) -> Window:
        """Draft slots first .. first + count - 1 drafted fresh after the canvas's drafts before
        them, and written to the canvas."""
        B, V, dev = n.shape[0], self.local.size, n.device
        positions = n[:, None] + first + self.slots[:count]
        random = self.fresh.random((B, count), gen, dev)
        noise = self.rule.fresh_noise((B, count, V), gen, dev)
        tokens, q = self.fresh(positions, canvas, n + first, random, noise)
        canvas.scatter_(1, positions, tokens)
        no = torch.zeros(B, count, dtype=torch.bool, device=dev)
        return Window(
            tokens,
            q,
            no,
            torch.full((B, count), UNKNOWN, device=dev),
            History.empty(B, count + 1, V, dev),
            noise,
            self.source.fresh_candidates(B, count, dev),
        )

    def draws(self, batch: int, slots: int, gen: torch.Generator, device) -> RedraftDraws | None:
        """The randomness `redraft` uses for a window of `slots` draft slots, drawn in a fixed order
        (none for a window without drafts)."""
        if slots == 0:
            return None
        shape = (batch, slots)
        fresh = self.fresh.random(shape, gen, device)
        return RedraftDraws(fresh, **self.rule.randomness(shape, self.local.size, gen, device))

    def redraft(
        self,
        window: Window,
        p: Tensor,
        m: Tensor,
        n: Tensor,
        active: Tensor,
        canvas: Tensor,
        draws: RedraftDraws | None,
    ) -> Window:
        """The window after row b committed m[b] tokens (n[b] is its new count): positions this pass
        scored (p [B, w, V]) are re-drafted, drafts it did not score are carried, positions
        entering the window are drafted fresh. The drafts are written to canvas after the
        committed tokens: they are the next forward's inputs (and repeat inits copy from them).
        All randomness comes in draws (`draws`)."""
        if window.slots == 0:
            return window
        s = Slots.after(window, p, m, n, active, self.slots, self.source, self.rule.keeps_old)
        dist, candidates = self.source.distribution(s, window)
        noise = self.rule.noise(s, window, draws)
        tok = self.rule(dist, s, window, noise, draws)
        rose = s.growth.gather(-1, tok[..., None])[..., 0] > 0  # p(tok) rose at this observation
        old_tokens = s.prior(window.tokens)
        # sources for repeat inits (a new slot gets tok as a placeholder: fresh drafts copy only
        # from before them)
        canvas.scatter_(1, s.positions, s.update(tok, tok, old_tokens))
        fresh_tok, fresh_q = self.fresh(
            s.positions, canvas, n + (~s.new).sum(1), draws.fresh, noise
        )
        tokens = s.update(tok, fresh_tok, old_tokens)
        canvas.scatter_(1, s.positions, tokens)
        return Window(
            tokens,
            s.update(self.source.stored(dist, s), fresh_q, s.prior(window.q)),
            s.update(s.fused, False, s.prior(window.fused)),
            s.update(torch.where(rose, ROSE, FLAT), UNKNOWN, s.prior(window.rose), s.judged),
            s.history,
            noise,
            candidates,
        )


def _along(mask: Tensor, field: Tensor) -> Tensor:
    """mask [B, S] for a window field: [B, S], or with a vocabulary axis after its slots ([B, S,
    V], [C, B, S, V])."""
    return mask[..., None] if field.dim() > 2 else mask
