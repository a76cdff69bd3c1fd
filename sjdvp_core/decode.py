"""Speculative Jacobi decoding: the one loop (Teng et al. 2024, arXiv 2410.01699), with pluggable
verifiers (SJD, LANTERN, GSD) and drafting (plain or Verification Prediction).

One iteration, per image b with n_b committed tokens: the window feeds the last committed token and the
drafts for positions n_b .. n_b + W - 2; one forward gives targets p for positions n_b .. n_b + W - 1;
drafts are verified left to right (first rejection by one cumulative op); the accepted drafts plus one
more token (the residual draw at the rejection, or a bonus draw from p after the last draft) are
committed. Positions the forward scored but did not commit are re-drafted from their new p (or VP's
fused p'), positions entering the window are drafted fresh. With coupling, every draw at a position
reuses that position's Gumbel noise, so successive drafts agree unless their distribution moved; the
noise lives per window slot ([B, W - 1, V], like the drafts' q) and shifts with the window. Each image
advances by its own count, and the model's cache is written by position, so rolling back rejected
entries costs nothing. W = 1 is plain AR. All randomness goes through one seeded torch.Generator.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .adapter import ModelAdapter, TokenLayout
from .drafting import DraftInit, coupled_draw, gumbel_noise
from .stats import DecodeStats
from .target import cfg_mix, residual, sample, target_probs
from .verify import Verifier, first_rejection
from .settings import AUTO_STRENGTHS, DecodeSettings
from .vp import AutoStrength, History, fuse, shift_slots

ProgressFn = Callable[[int, int, Tensor], None]


@dataclass
class DecodeResult:
    tokens: Tensor    # [B, L] vocabulary ids of the generated sequence
    codes: Tensor     # [B, h, w] codebook indices of the image cells
    layout: TokenLayout
    stats: DecodeStats


@dataclass
class Drafts:
    """The drafts for the window's undecided positions, slots [B, S] (S = W - 1) from position n."""
    tokens: Tensor   # [B, S] local ids
    q: Tensor        # [B, S, V] the distribution each draft was sampled from
    fresh: Tensor    # [B, S] drafted at initialisation, never from a target
    fused: Tensor    # [B, S] drawn from VP's fused distribution
    rose: Tensor     # [B, S] int8: its probability rose at its last observation (1), not (0), unknown (-1)

    def shift(self, m: Tensor, width: int) -> "Drafts":
        return Drafts(*(shift_slots(t, m, width) for t in (self.tokens, self.q, self.fresh, self.fused, self.rose)))

    @staticmethod
    def where(mask: Tensor, a: "Drafts", b: "Drafts") -> "Drafts":
        pick = lambda x, y: torch.where(mask.view(*mask.shape, *([1] * (x.dim() - 2))), x, y)  # noqa: E731
        return Drafts(*(pick(x, y) for x, y in zip(
            (a.tokens, a.q, a.fresh, a.fused, a.rose), (b.tokens, b.q, b.fresh, b.fused, b.rose))))


def _gather_row(t: Tensor, idx: Tensor) -> Tensor:
    """t [B, S, V], idx [B] -> [B, V]."""
    return t.gather(1, idx.view(-1, 1, 1).expand(-1, 1, t.shape[-1])).squeeze(1)


class _Timer:
    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"

    def now(self) -> float:
        if self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter()


class JacobiDecoder:
    """Holds the per-run state; `run` is the loop. Use `decode()` rather than this class."""

    def __init__(self, adapter: ModelAdapter, settings: DecodeSettings, layout: TokenLayout):
        self.adapter, self.s, self.layout = adapter, settings, layout
        self.device = adapter.device
        self.cfg = settings.sampling.uses_cfg
        self.B, self.W, self.S = settings.batch_size, settings.window.size, settings.window.size - 1
        self.L = layout.length
        self.local_vocab = torch.cat([layout.image_tokens, layout.special_tokens]).to(self.device)
        self.K, self.V = layout.image_tokens.numel(), self.local_vocab.numel()
        to_local = {int(t): i for i, t in enumerate(self.local_vocab.tolist())}
        forced_local = torch.tensor([to_local[int(t)] if t >= 0 else -1 for t in layout.forced.tolist()])
        self.init = DraftInit(settings.window.init, forced_local, layout.grid, self.K, self.V,
                              self.W + 1, self.device)
        self.verifier = Verifier(settings.drafter, adapter.codebook(), self.K)
        self.vp = settings.drafter.vp
        self.coupled = settings.drafter.coupled
        self.auto = AutoStrength(self.vp, AUTO_STRENGTHS) if self.vp is not None and self.vp.auto else None
        self.gen = torch.Generator(device=self.device).manual_seed(settings.seed)
        self.timer = _Timer(self.device)
        self.stats = DecodeStats(length=self.L, window=self.W,
                                 slot_verified=torch.zeros(max(self.S, 1), dtype=torch.long),
                                 slot_accepted=torch.zeros(max(self.S, 1), dtype=torch.long))

    # --- helpers -------------------------------------------------------------------------------
    def _targets(self, logits: Tensor, first_pos: Tensor) -> Tensor:
        """Model logits [R, w, V_model] for positions first_pos[:, None] + arange(w) -> p [B, w, V]."""
        mixed = cfg_mix(logits.index_select(-1, self.local_vocab), self.s.sampling.cfg_scale, self.cfg)
        positions = (first_pos[:, None] + torch.arange(mixed.shape[1], device=self.device)).clamp(max=self.L + self.W)
        return target_probs(mixed, self.init.forced_at(positions), self.K, self.s.sampling)

    def _rows(self, t: Tensor) -> Tensor:
        return torch.cat([t, t]) if self.cfg else t

    # --- the loop ------------------------------------------------------------------------------
    def run(self, first_logits: Tensor, progress: ProgressFn | None) -> DecodeResult:
        B, S, L, dev = self.B, self.S, self.L, self.device
        t_start = self.timer.now()
        self.canvas = torch.zeros(B, L + self.W + 1, dtype=torch.long, device=dev)
        self.commit_iter = torch.full((B, L + self.W), -1, dtype=torch.long, device=dev)
        self.n = torch.zeros(B, dtype=torch.long, device=dev)
        p0 = self._targets(first_logits[:, None], self.n)[:, 0]
        self.canvas[:, 0] = sample(p0, self.gen)
        self.commit_iter[:, 0] = 0
        self.n += 1
        self.row_passes = torch.ones(B, dtype=torch.long, device=dev)
        self.history = History(B, S, self.V, dev)
        positions = self.n[:, None] + torch.arange(S, device=dev)
        tokens, q = self.init(positions, self.canvas, self.n, self.gen)
        if self.coupled:
            self.noise = gumbel_noise((B, S, self.V), self.gen, dev)
            tokens = coupled_draw(q, self.noise)
        no = torch.zeros(B, S, dtype=torch.bool, device=dev)
        self.drafts = Drafts(tokens, q, ~no, no, torch.full((B, S), -1, dtype=torch.int8, device=dev))
        self._write_drafts()
        self.stats.forward_passes = 1
        self._report(progress)
        lo, hi = self.layout.jacobi_span
        while bool((self.n < L).any()):
            active = self.n < L
            kmax = torch.where(self.n >= lo, (hi - self.n).clamp(0, S), torch.zeros_like(self.n))
            kmax = torch.where(active, kmax, torch.zeros_like(kmax))
            self._step(int(kmax.max()) + 1, kmax, active)
            self._report(progress)
        self.stats.time_total = self.timer.now() - t_start
        self.stats.row_forward_passes = self.row_passes.cpu()
        self.stats.vp_auto = self.auto.summary() if self.auto is not None else None
        self.stats.commit_iter = self.commit_iter[:, :L].cpu()
        tokens = self.local_vocab[self.canvas[:, :L]]
        codes = self.canvas[:, :L][:, self.layout.grid.to(dev)]
        return DecodeResult(tokens, codes, self.layout, self.stats)

    def _step(self, w: int, kmax: Tensor, active: Tensor) -> None:
        L, dev = self.L, self.device
        it = self.stats.forward_passes
        t0 = self.timer.now()
        last = self.canvas.gather(1, (self.n - 1)[:, None])
        inputs = torch.cat([last, self.drafts.tokens[:, :w - 1]], dim=1)               # [B, w]
        pos = ((self.n - 1)[:, None] + torch.arange(w, device=dev)).clamp(max=L - 1)
        logits = self.adapter.forward(self._rows(self.local_vocab[inputs]), self._rows(pos))
        self.stats.forward_passes += 1
        self.row_passes += active.long()
        t1 = self.timer.now()
        p = self._targets(logits, self.n)                                                 # [B, w, V]
        m = self._verify(p, w, kmax, active, it)
        t2 = self.timer.now()
        self._redraft(p, w, m, active)
        self.adapter.rollback(self._rows(self.n - 1))
        t3 = self.timer.now()
        self.stats.time_forward += t1 - t0
        self.stats.time_verify += t2 - t1
        self.stats.time_draft += t3 - t2

    def _verify(self, p: Tensor, w: int, kmax: Tensor, active: Tensor, it: int):
        """Accept a prefix of the drafts, draw the token after it, commit; return tokens committed [B]."""
        B, L, dev = self.B, self.L, self.device
        slots = torch.arange(w - 1, device=dev)
        x, q = self.drafts.tokens[:, :w - 1], self.drafts.q[:, :w - 1]
        a = self.verifier.accept_prob(p[:, :w - 1], q, x)
        u = torch.rand(B, w - 1, generator=self.gen, device=dev)
        accept = (u < a) & (slots < kmax[:, None])
        k = first_rejection(accept)                                                      # [B]
        rejected = k < kmax
        pk = _gather_row(p, k)
        qk = _gather_row(self.drafts.q, k.clamp(max=self.S - 1)) if self.S else pk
        nxt = sample(torch.where(rejected[:, None], residual(pk, qk), pk), self.gen)
        has_next = active & (self.n + k < L)
        m = k + has_next.long()
        at = (self.n + k)[:, None]
        self.canvas.scatter_(1, at, torch.where(has_next[:, None], nxt[:, None], self.canvas.gather(1, at)))
        cols = self.n[:, None] + torch.arange(self.W, device=dev)
        newly = torch.arange(self.W, device=dev) < m[:, None]
        self.commit_iter.scatter_(1, cols, torch.where(newly, it, self.commit_iter.gather(1, cols)))
        self.stats.committed_per_iter.append(m.cpu())
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)                                 # [B, w]
        self.stats.entropy_sum += float((entropy * (torch.arange(w, device=dev) < m[:, None])).sum())
        self._count(p, x, q, accept, k, kmax, w)
        self.n = self.n + m
        return m

    def _count(self, p, x, q, accept, k, kmax, w) -> None:
        """Per-slot acceptance, the momentum statistic and VP's expected-acceptance effect."""
        if w == 1:
            return
        slots = torch.arange(w - 1, device=self.device)
        verified = slots[None] < torch.minimum(k + 1, kmax)[:, None]
        self.stats.slot_verified[:w - 1] += verified.sum(0).cpu()
        self.stats.slot_accepted[:w - 1] += (verified & accept).sum(0).cpu()
        carried = verified & ~self.drafts.fresh[:, :w - 1]
        st = self.stats
        st.count_momentum(self.drafts.rose[:, :w - 1], carried, accept)
        fused = carried & self.drafts.fused[:, :w - 1]
        if bool(fused.any()):
            pv = p[:, :w - 1]
            st.vp_drafts += int(fused.sum())
            st.vp_expected_accept += float((torch.minimum(pv, q).sum(-1) * fused).sum())
            plain = self.history.prev[:, :w - 1]
            st.plain_expected_accept += float((torch.minimum(pv, plain).sum(-1) * fused).sum())
            if self.auto is not None:
                self.auto.observe(pv, fused)

    def _redraft(self, p: Tensor, w: int, m: Tensor, active: Tensor) -> None:
        """Slide the window by m: re-draft the positions this pass scored (plain or VP-fused), keep
        the drafts it did not score, draw fresh ones for positions entering the window."""
        S, W, dev = self.S, self.W, self.device
        if S == 0:
            return
        hist = self.history.padded(W)                          # slots aligned with p's positions
        pbar_prev, prev, had = hist.pbar, hist.prev, hist.seen > 0
        p = torch.nn.functional.pad(p, (0, 0, 0, W - w))
        growth = hist.observe(p, (torch.arange(W, device=dev) < w)[None] & active[:, None],
                              self.vp.beta if self.vp else 0.5)
        self.history = hist.shift(m, S)
        old_slot = m[:, None] + torch.arange(S, device=dev)
        redraw, kept = old_slot < w, (old_slot >= w) & (old_slot < S)
        p, pbar_prev, prev, had, growth = (shift_slots(t, m, S) for t in (p, pbar_prev, prev, had, growth))
        positions = self.n[:, None] + torch.arange(S, device=dev)
        fused = redraw & had & (self.init.forced_at(positions) < 0) & (self.vp is not None)
        if self.auto is not None:
            dist = self.auto.fuse(p, pbar_prev, growth, fused, redraw, m)
        else:
            dist = fuse(p, pbar_prev, growth, fused, self.vp) if self.vp is not None else p
        dist = dist.masked_fill(~redraw[..., None], 1.0)
        if self.coupled:   # positions new to the draft slots get their noise now, the rest keep theirs
            new = (old_slot >= S)[..., None]
            self.noise = torch.where(new, gumbel_noise(self.noise.shape, self.gen, dev),
                                     shift_slots(self.noise, m, S))
        tok = coupled_draw(dist, self.noise) if self.coupled else sample(dist, self.gen)
        rose = (p.gather(-1, tok[..., None]) > prev.gather(-1, tok[..., None]))[..., 0]
        q = dist if (self.vp is None or self.vp.lossless) else p
        carried = self.drafts.shift(m, S)
        self.canvas.scatter_(1, positions, torch.where(redraw, tok, carried.tokens))  # sources for repeat inits
        fresh_tok, fresh_q = self.init(positions, self.canvas, self.n + (redraw | kept).sum(1), self.gen)
        if self.coupled:
            fresh_tok = coupled_draw(fresh_q, self.noise)
        redrawn = Drafts(tok, q, torch.zeros_like(redraw), fused, torch.where(had, rose.to(torch.int8), -1))
        fresh = Drafts(fresh_tok, fresh_q, torch.ones_like(redraw), torch.zeros_like(redraw),
                       torch.full_like(tok, -1, dtype=torch.int8))
        self.drafts = Drafts.where(redraw, redrawn, Drafts.where(kept, carried, fresh))
        self._write_drafts()

    def _write_drafts(self) -> None:
        positions = self.n[:, None] + torch.arange(self.S, device=self.device)
        self.canvas.scatter_(1, positions, self.drafts.tokens)

    def _report(self, progress: ProgressFn | None) -> None:
        if progress is None:
            return
        done = self.n.clamp(max=self.L)
        grid = self.layout.grid.to(self.device)
        codes = torch.where(grid[None] < done[:, None, None], self.canvas[:, grid], -1)
        progress(int(done.sum()), self.B * self.L, codes)


def state_bytes(settings: DecodeSettings, layout: TokenLayout) -> int:
    """Memory the loop holds beyond the model's KV cache, for memory managers: per undecided window slot
    and (local) vocabulary entry, the drafts' q and VP's history (pbar, prev in fp32, growth in int16),
    coupled drafting's noise, auto's candidates; doubled for the temporaries of one iteration."""
    vocab = layout.image_tokens.numel() + layout.special_tokens.numel()
    vp = settings.drafter.vp
    per_entry = 4 * 3 + 2 + 4 * settings.drafter.coupled + 4 * len(AUTO_STRENGTHS) * (vp is not None and vp.auto)
    return 2 * settings.batch_size * max(1, settings.window.size - 1) * vocab * per_entry


def decode(adapter: ModelAdapter, conditions: Sequence[Any] | Any, settings: DecodeSettings,
           negatives: Sequence[Any] | Any | None = None, progress: ProgressFn | None = None) -> DecodeResult:
    """Generate settings.batch_size images. conditions: one per image, or one shared by all (the
    family's prompt, class id, ...); negatives likewise, used as the CFG branch where the family has
    one. progress(done, total, codes) is called after every iteration with the tokens committed so far
    (all images) and the image cells known so far ([B, h, w] codebook indices, -1 where undecided); it
    may raise to abort."""
    B = settings.batch_size
    conditions = _per_image(conditions, B, "conditions")
    negatives = None if negatives is None else _per_image(negatives, B, "negatives")
    with torch.inference_mode():
        try:
            layout, first_logits = adapter.start(conditions, negatives, settings.sampling.uses_cfg,
                                                 settings.window.size)
            return JacobiDecoder(adapter, settings, layout).run(first_logits, progress)
        finally:
            adapter.finish()


def _per_image(values, batch: int, name: str) -> list:
    if isinstance(values, (list, tuple)):
        if len(values) == 1:
            return list(values) * batch
        if len(values) != batch:
            raise ValueError(f"{name}: got {len(values)} for batch_size={batch}; give one per image or one for all")
        return list(values)
    return [values] * batch
