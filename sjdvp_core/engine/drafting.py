"""How drafts are made: fresh ones for positions entering the window, and re-drafts of the positions a
forward pass scored but did not commit.

Fresh drafts: a copy of the nearest known cell above (the default: the SJD paper's vertical repeat) or to
the left (one-hot q), or random over the image vocabulary (stored with q = that uniform distribution, the
distribution they were really drawn from: exact, and accepted more often than declaring the draw
one-hot). Forced positions always get their forced token.
Re-drafts: from the position's new target p (plain SJD), or from VP's fusion of p with the position's
probability history (vp.py; the strength fixed or chosen by AutoStrength); stored with q = the
distribution drawn from, so verification stays exact.
Coupled drafting draws every draft at a position with that position's persistent Gumbel noise
(Gumbel-max), so successive drafts only differ where their distribution moved: the same idea as SCD's
Gumbel coupling (So et al., ICML 2026, arXiv 2510.24211) and MC-SJD. Continuation instead keeps each
re-drafted position's old draft by maximal coupling (continue_draft), as SJD-PAC does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .devices import wide_float
from .settings import AUTO_STRENGTHS, DrafterSettings
from .target import draw, residual, uniform
from .vp import AutoStrength, fuse, strength_weights
from .window import FLAT, ROSE, UNKNOWN, History, LocalLayout, Slide, Window


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


def gumbel_noise(shape, generator: torch.Generator, device) -> Tensor:
    """Standard Gumbel noise, one value per (position, token), through the run's generator, in float64:
    with float32 uniforms (2^24 levels) two of K = 16384 noisy scores tie at the maximum about once in
    a thousand draws, and argmax breaks ties toward low token ids, a bias of about 5e-4 in total variation."""
    dtype = wide_float(device)
    u = torch.rand(shape, generator=generator, device=device, dtype=dtype)
    tiny = torch.finfo(dtype).tiny
    return -torch.log(-torch.log(u.clamp(tiny, 1.0 - torch.finfo(dtype).eps)))


def coupled_draw(dist: Tensor, noise: Tensor) -> Tensor:
    """Gumbel-max: argmax(log dist + noise) is distributed as dist, and with the noise held fixed a
    draft only changes where dist itself moved. Exact for verification as long as a position's noise
    never touched anything the position's own target was computed from, which causality guarantees
    (noise at j only feeds inputs that predict later positions)."""
    return noise.add(torch.log(dist)).argmax(-1)            # in the noise's (wider) dtype


def continue_draft(x: Tensor, q: Tensor, dist: Tensor, u_keep: Tensor, u_residual: Tensor) -> Tensor:
    """A draft from dist that keeps the old draft x (drawn from q) as often as possible: x with
    probability min(1, dist(x) / q(x)), else a draw from norm(max(0, dist - q)). The result is
    distributed exactly as dist (the speculative-sampling identity), and it equals x with the largest
    probability any such draw can, sum(min(dist, q)): maximal coupling, as SJD-PAC's adaptive
    continuation (Kang et al., CVPR 2026, arXiv 2603.18599) carries drafts past a rejection. The old
    draft's randomness never reaches the targets that judge its own position, so verification stays exact.
    u_keep, u_residual [...]: uniforms (RedraftDraws)."""
    ratio = (dist.gather(-1, x[..., None]) / q.gather(-1, x[..., None]).clamp_min(1e-30))[..., 0]
    return torch.where(u_keep < ratio, x, draw(residual(dist, q), u_residual))


@dataclass
class RedraftDraws:
    """The randomness of one re-draft, drawn up front through the run's generator (`Drafter.draws`), so that
    `Drafter.redraft` is a pure function of its inputs (compilable; see loop.py)."""
    fresh: Tensor                      # [B, S] random image tokens for fresh drafts
    noise: Tensor | None = None        # [B, S, V] coupled: Gumbel noise for slots new to the window
    draft: Tensor | None = None        # [B, S] sampled: uniforms for the re-drafts' draws
    keep: Tensor | None = None         # [B, S] continuation: uniforms for keeping the old draft
    residual: Tensor | None = None     # [B, S] continuation: uniforms for the residual's draw


class Drafter:
    """The drafting rules of one decode: fresh drafts, plain / VP-fused / auto re-drafts, coupling. slots: the
    most draft slots its windows have (an automatic window's change from plan to plan within it, `resize`)."""

    def __init__(self, settings: DrafterSettings, scheme: str, local: LocalLayout, slots: int, device):
        self.vp, self.coupled, self.local = settings.vp, settings.coupled, local
        self.continuation = settings.continuation
        self.fresh = FreshDrafts(scheme, local, slots, device)
        self.slots = torch.arange(slots, device=device)
        self.auto = AutoStrength(self.vp, AUTO_STRENGTHS, device) if self.vp is not None and self.vp.auto else None
        fixed = self.vp is not None and not self.vp.auto
        self.weights = strength_weights((self.vp.strength,), device) if fixed else None   # VP's, made once

    @staticmethod
    def follows_noise(settings: DrafterSettings) -> bool:
        """Whether every draft is the argmax of log q + its position's noise, as coupled drafting draws it,
        so that further draws at a position (draft trees) may continue that noise's ranking: not under
        continuation (a kept draft ignores the noise) nor lossy VP (q is then not what was drawn from)."""
        return settings.coupled and not settings.continuation and (settings.vp is None or settings.vp.lossless)

    def start(self, n: Tensor, canvas: Tensor, gen: torch.Generator, slots: int) -> Window:
        """The first window, `slots` draft slots wide: every slot drafted fresh."""
        return self._fresh_window(n, canvas, gen, 0, slots)

    def resize(self, window: Window, slots: int, n: Tensor, canvas: Tensor, gen: torch.Generator) -> Window:
        """The window with `slots` draft slots, for an automatic window's next plan (auto.py): a narrower one
        keeps its first slots, a wider one drafts its new slots fresh, as a window sliding into them would. So
        each iteration's step works on its own plan's slots, not on the widest plan's."""
        have = window.slots
        if slots <= have:
            return window.narrow(slots)
        return window.joined(self._fresh_window(n, canvas, gen, have, slots - have))

    def _fresh_window(self, n: Tensor, canvas: Tensor, gen: torch.Generator, first: int, count: int) -> Window:
        """Draft slots first .. first + count - 1 drafted fresh after the canvas's drafts before them, and
        written to the canvas."""
        B, V, dev = n.shape[0], self.local.size, n.device
        positions = n[:, None] + first + self.slots[:count]
        random = self.fresh.random((B, count), gen, dev)
        noise = gumbel_noise((B, count, V), gen, dev) if self.coupled else None
        tokens, q = self.fresh(positions, canvas, n + first, random, noise)
        canvas.scatter_(1, positions, tokens)
        no = torch.zeros(B, count, dtype=torch.bool, device=dev)
        candidates = torch.zeros(len(self.auto.strengths), B, count, V, device=dev) if self.auto else None
        return Window(tokens, q, no, torch.full((B, count), UNKNOWN, device=dev),
                      History.empty(B, count + 1, V, dev), noise, candidates)

    def draws(self, batch: int, slots: int, gen: torch.Generator, device) -> RedraftDraws | None:
        """The randomness `redraft` uses for a window of `slots` draft slots, drawn in a fixed order (none for a
        window without drafts)."""
        if slots == 0:
            return None
        shape = (batch, slots)
        return RedraftDraws(self.fresh.random(shape, gen, device),
                            gumbel_noise((*shape, self.local.size), gen, device) if self.coupled else None,
                            None if self.coupled else uniform(shape, gen, device),
                            torch.rand(shape, generator=gen, device=device) if self.continuation else None,
                            uniform(shape, gen, device) if self.continuation else None)

    def redraft(self, window: Window, p: Tensor, m: Tensor, n: Tensor, active: Tensor, canvas: Tensor,
                draws: RedraftDraws | None) -> Window:
        """The window after row b committed m[b] tokens (n[b] is its new count): positions this pass
        scored (p [B, w, V]) are re-drafted, drafts it did not score are carried, positions entering the
        window are drafted fresh. The drafts are written to canvas after the committed tokens: they are the
        next forward's inputs (and repeat inits copy from them). All randomness comes in draws (`draws`)."""
        S = window.slots
        if S == 0:
            return window
        W, w = S + 1, p.shape[1]
        slide = Slide(m, W)
        before = window.history.slide(slide)         # the history before this observation, in the new slots
        p = slide.take(p, W)                         # this pass's targets in the new slots (stale past them)
        history, growth = before.observe(p, (slide.old < w) & active[:, None], self.vp.beta if self.vp else 0.5)
        p, growth, pbar_prev, pbar = p[:, :S], growth[:, :S], before.pbar[:, :S], history.pbar[:, :S]
        had, old = before.seen[:, :S] > 0, slide.old[:, :S]
        redraw, new = old < w, old >= S
        kept, judged = ~(redraw | new), redraw & had      # judged: re-drafted from a target with a history
        positions = n[:, None] + self.slots[:S]
        if self.vp is not None:   # VP fuses judged slots of free positions inside the image
            fused = judged & (self.local.forced_at(positions) < 0) & (positions < self.local.length)
        else:
            fused = torch.zeros_like(judged)
        # a slot keeps its old draft only where this pass did not score it (a draft tree's pass narrower than the
        # window) or under continuation: a chain's pass scores every slot, and its step skips the old drafts' fields
        carried = w < S or self.continuation

        def prior(field: Tensor, dim: int = 1) -> Tensor | None:
            return slide.take(field, dim=dim) if carried else None

        def update(drafted: Tensor, fresh, old: Tensor | None, mask: Tensor = redraw) -> Tensor:
            """A field in the new slots: drafted where mask, else the old value (slid) where the slot was kept,
            else fresh; masks [B, S] broadcast over the field's trailing axes."""
            rest = fresh if old is None else torch.where(_along(kept, old), old, fresh)
            return torch.where(_along(mask, drafted), drafted, rest)

        candidates = None
        if self.auto is not None:
            candidates = self.auto.fuse(p, pbar_prev, pbar, growth, fused)
            dist = self.auto.chosen(candidates)
            if carried:   # (elsewhere the new slots' are never read: their drafts are fresh, not fused)
                candidates = torch.where(_along(redraw, candidates), candidates, prior(window.candidates, dim=2))
        else:
            dist = fuse(p, pbar_prev, pbar, growth, fused, self.vp, self.weights) if self.vp is not None else p
        if not self.coupled or self.continuation:   # sampled: slots not re-drafted get a harmless distribution
            dist = dist.masked_fill(~redraw[..., None], 1.0)
        noise = None
        if self.coupled:   # positions new to the draft slots get their noise now, the rest keep theirs
            noise = torch.where(new[..., None], draws.noise, slide.take(window.noise))
        tok = coupled_draw(dist, noise) if self.coupled else draw(dist, draws.draft)
        old_tokens, old_q = prior(window.tokens), prior(window.q)
        if self.continuation:   # where the slot held a draft (the window's last scored position held none)
            tok = torch.where(new, tok, continue_draft(old_tokens.masked_fill(new, 0),
                                                       old_q.masked_fill(new[..., None], 0), dist, draws.keep,
                                                       draws.residual))
        rose = growth.gather(-1, tok[..., None])[..., 0] > 0          # p(tok) rose at this observation
        q = dist if (self.vp is None or self.vp.lossless) else p
        # sources for repeat inits (a new slot gets tok as a placeholder: fresh drafts copy only from before them)
        canvas.scatter_(1, positions, update(tok, tok, old_tokens))
        fresh_tok, fresh_q = self.fresh(positions, canvas, n + (~new).sum(1), draws.fresh, noise)
        tokens = update(tok, fresh_tok, old_tokens)
        canvas.scatter_(1, positions, tokens)
        return Window(tokens, update(q, fresh_q, old_q), update(fused, False, prior(window.fused)),
                      update(torch.where(rose, ROSE, FLAT), UNKNOWN, prior(window.rose), judged),
                      history, noise, candidates)


def _along(mask: Tensor, field: Tensor) -> Tensor:
    """mask [B, S] for a window field: [B, S], or with a vocabulary axis after its slots ([B, S, V], [C, B, S, V])."""
    return mask[..., None] if field.dim() > 2 else mask
