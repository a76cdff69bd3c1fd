"""The Jacobi loop itself (Teng et al. 2024, arXiv 2410.01699), with pluggable verifiers (SJD, LANTERN, GSD)
and drafting rules (plain, Verification Prediction, coupled). `decode` (decode.py) prepares and runs it;
the calibrations (calibration.py) run it at fixed plans to measure the device.

One iteration, per image b with n_b committed tokens: the window feeds the last committed token and the
drafts for positions n_b .. n_b + W - 2; one forward gives targets p for positions n_b .. n_b + W - 1;
`accept` verifies the drafts left to right (first rejection by one cumulative op) and draws one more
token (the residual at the rejection, or a bonus draw from p after the last draft); the accepted drafts
and that token are committed; the window slides by what was committed and is re-drafted (drafting.py).
A step (steps.py: a chain's or a tree's) does that after the plan is chosen; the loop records its outcome.
Each image advances by its own count, and the model's cache is written by position, so rolling back
rejected entries costs nothing. With a draft tree (tree.py) the first slots hold several candidates,
scored in the same forward. W = 1 is plain AR. All randomness goes through one seeded
torch.Generator, drawn up front each iteration, so a chain's step after its forward is a pure function
that torch.compile may take (compiled.py). The loop reads one value back from the device per iteration:
the new positions.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .adapter import ModelAdapter, TokenLayout
from .auto import Plan, PlanChooser, Profile, warmed
from .captured import Passes
from .compiled import compiled, hold_in_place
from .cost import PassCost
from .drafting import Drafter
from .settings import DecodeSettings
from .stats import DecodeStats, Recorder
from .steps import ChainStep, Loop, Outcome, TreeStep
from .target import cfg_mix, sample, target_probs
from .verify import Verifier
from .window import LocalLayout, Window

ProgressFn = Callable[[int, int, Tensor], None]


@dataclass
class DecodeResult:
    tokens: Tensor    # [B, L] vocabulary ids of the generated sequence
    codes: Tensor     # [B, h, w] codebook indices of the image cells
    layout: TokenLayout
    stats: DecodeStats


class _Clock:
    """Wall time of the loop's phases, only when asked for (on a GPU each reading waits for the device)."""

    def __init__(self, device, on: bool):
        self.cuda, self.on = torch.device(device).type == "cuda", on

    def now(self) -> float:
        if self.on and self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() if self.on else 0.0


class JacobiDecoder:
    """One decode's fixed parts; `run` is the loop. Use `decode()` rather than this class."""

    def __init__(self, adapter: ModelAdapter, settings: DecodeSettings, layout: TokenLayout, timing: bool,
                 cost: PassCost | None = None, profile: Profile | None = None):
        self.adapter, self.s, self.device = adapter, settings, adapter.device
        self.passes = Passes(adapter, settings.passes)    # the model's forward, recorded per shape where it can be
        self.B, self.W, self.S = settings.batch_size, settings.window.size, settings.window.size - 1
        self.local = LocalLayout(layout, settings.window.size + 1, self.device)
        self.drafter = Drafter(settings.drafter, settings.window.init, self.local, self.S, self.device)
        codebook = adapter.codebook()   # the image decoder's, which a memory manager may keep on another device
        self.verifier = Verifier(settings.drafter, None if codebook is None else codebook.to(self.device),
                                 self.local.num_image, adapter.module)
        self.gen = torch.Generator(device=self.device).manual_seed(settings.seed)
        self.clock = _Clock(self.device, timing)
        self.plan = Plan(self.W, settings.window.tree)
        self.same_noise = Drafter.follows_noise(settings.drafter)
        auto = settings.window.auto and cost is not None and profile is not None and self.S
        self.chooser = PlanChooser(cost, profile) if auto else None
        self.warm = warmed(layout.jacobi_span)
        self.steps = torch.arange(self.W + 1, device=self.device)   # slot offsets, made once
        # compiled: a chain's whole step after its forward is one graph (ChainStep); a tree's re-draft its own
        self.redraft = compiled(self.drafter.redraft, "draft") if settings.compile else self.drafter.redraft
        self.chain, self.tree = ChainStep(self), TreeStep(self)

    def targets(self, logits: Tensor, at: Tensor) -> Tensor:
        """Model logits [R, N, V_model] predicting positions at [B, N] -> p [B, N, V]."""
        s, local = self.s.sampling, self.local
        mixed = cfg_mix(local.local_logits(logits), s.cfg_scale, s.uses_cfg)
        return target_probs(mixed, local.mask_at(at.clamp(max=local.length + self.W)), s)

    def rows(self, t: Tensor) -> Tensor:
        """Per-image tensor -> per model row (CFG runs cond and uncond rows)."""
        return torch.cat([t, t]) if self.s.sampling.uses_cfg else t

    def begin(self, first_logits: Tensor) -> Loop:
        """The first token of every image (from the prefill's logits) and the first window of drafts."""
        if bool(first_logits.isnan().any()):   # a NaN target draws token 0 everywhere: a flat image, no error
            raise ValueError(f"{self.adapter.family}: the model's logits are NaN, its activations overflow at this "
                             "precision (fp16 does on some models): load it in bf16 or fp32")
        B, W, dev, L = self.B, self.W, self.device, self.local.length
        canvas = torch.zeros(B, L + W + 1, dtype=torch.long, device=dev)
        at_zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
        first_p = self.targets(first_logits[:, None], at_zero)[:, 0]
        if bool(first_p.isnan().any()):   # finite logits, scaled past float's range: the same flat image
            s = self.s.sampling
            raise ValueError(f"temperature={s.temperature:g} with cfg_scale={s.cfg_scale:g} scales the logits past "
                             "float's range: raise the temperature (or lower the cfg); for the most likely token "
                             "every time, use greedy sampling")
        canvas[:, 0] = sample(first_p, self.gen)
        n = torch.ones(B, dtype=torch.long, device=dev)
        first = self.plan if self.chooser is None else self.chooser.choice
        window = self.drafter.start(n, canvas, self.gen, first.window - 1)
        loop = Loop(canvas, n, [1] * B, [[1] * B], torch.ones(B, dtype=torch.long, device=dev), window,
                   Recorder(max(self.S, 1), dev))
        if self.s.compile:
            hold_in_place(*self.written(loop))
        return loop

    def written(self, loop: Loop) -> list[Tensor]:
        """The tensors a step writes into: the canvas, the statistics and VP auto's scores."""
        auto = self.drafter.auto
        return [loop.canvas, *loop.rec.accumulators, *(() if auto is None else auto.accumulators)]

    def done(self, loop: Loop) -> bool:
        return all(c >= self.local.free_end for c in loop.n_host)

    def iterate(self, loop: Loop) -> None:
        """plan -> step (chain or tree: forward, targets, accept, commit, re-draft) -> record; one read back to
        the host."""
        plan = self.plan if self.chooser is None else self.chooser.choose(loop.it)
        window = loop.window
        if plan.window - 1 != window.slots:   # auto changed plans: the state follows, so the step costs the plan's
            window = self.drafter.resize(window, plan.window - 1, loop.n, loop.canvas, self.gen)
        # how far each row may accept drafts: to the end of the image grid, nothing outside it
        end, (lo, hi) = self.local.free_end, self.local.span
        limit_host = [min(plan.window - 1, max(hi - c, 0)) if lo <= c < end else 0 for c in loop.n_host]
        limit, active, reach = torch.tensor(limit_host, device=self.device), loop.n < end, max(limit_host)
        t0 = self.clock.now()
        step = self.tree if plan.tree.on and reach > 0 else self.chain
        self.record(loop, plan, active, t0, step(loop, plan, window, limit, active, reach))

    def record(self, loop: Loop, plan: Plan, active: Tensor, t0: float, out: Outcome) -> None:
        """The loop's state and statistics after a step; auto's record of what the plan committed."""
        rec = loop.rec
        rec.scored.append(out.scored)
        rec.committed.append(out.m)
        if out.tree is not None:
            rec.tree_outcome(*out.tree)
        loop.n, loop.window, loop.row_passes, loop.it = out.n, out.window, loop.row_passes + active, loop.it + 1
        before, loop.n_host = loop.n_host, out.n.tolist()                                  # the one sync
        if self.chooser is not None:
            loop.plans[plan] = loop.plans.get(plan, 0) + 1
            if min(before) >= self.warm:
                self.chooser.record(plan, sum(b - a for a, b in zip(before, loop.n_host)) / self.B)
        loop.trace.append(loop.n_host)
        rec.phases(t0, out.forward_end, out.verify_end, self.clock.now(), out.one_graph)

    def run(self, first_logits: Tensor, progress: ProgressFn | None) -> DecodeResult:
        """Iterate until every image is complete, then fill in the known tail."""
        t_start = time.perf_counter()
        loop = self.begin(first_logits)
        self._progress(progress, loop.n_host, loop.canvas)
        seconds = []   # each iteration's wall time on the host: its one read back waits for the device
        while not self.done(loop):
            t = time.perf_counter()
            self.iterate(loop)
            seconds.append(time.perf_counter() - t)
            self._progress(progress, loop.n_host, loop.canvas)
        local, L, end, B, it, canvas = self.local, self.local.length, self.local.free_end, self.B, loop.it, loop.canvas
        canvas[:, end:L] = local.forced[end:L]                          # the known tail, without a forward pass
        if end < L:
            self._progress(progress, [L] * B, canvas)
        # position t of row b was committed at the first iteration whose count passed t; the tail at the last
        trace = torch.tensor(loop.trace).t().contiguous()                                  # [B, iterations]
        commit_iter = torch.searchsorted(trace, torch.arange(L).expand(B, -1).contiguous(), right=True)
        stats = DecodeStats(length=L, window=self.W, forward_passes=it, ar_passes=end,
                            row_forward_passes=loop.row_passes.cpu(), commit_iter=commit_iter.clamp(max=it - 1))
        stats.vp_auto = self.drafter.auto.summary() if self.drafter.auto is not None else None
        stats.auto_plans = {p.label: count for p, count in loop.plans.items()} or None
        stats.passes = self.passes.kind
        loop.rec.into(stats)
        stats.iteration_seconds = seconds
        stats.time_total = time.perf_counter() - t_start
        return DecodeResult(local.vocab[canvas[:, :L]], canvas[:, :L][:, local.grid], self.local.layout, stats)

    def commit(self, canvas: Tensor, n: Tensor, active: Tensor, k: Tensor, nxt: Tensor) -> Tensor:
        """Write the token after the k accepted drafts -> tokens committed per row [B]; in a row that commits
        none it lands past the row's end, where nothing reads it."""
        at = n + k
        canvas.scatter_(1, at[:, None], nxt[:, None])
        return k + (active & (at < self.local.free_end))

    def observe(self, rec: Recorder, window: Window, p: Tensor, k: Tensor, accepted: Tensor, limit: Tensor,
                 m: Tensor) -> None:
        """Statistics and VP auto's scores: they look at what verification decided, never steer it."""
        slots = self.steps[:p.shape[1]]
        rec.entropy += (torch.special.entr(p).sum(-1) * (slots < m[:, None])).sum()
        d = accepted.shape[1]
        if d == 0:
            return
        verified = slots[:d] < torch.minimum(k + 1, limit)[:, None]
        rec.outcomes(verified, accepted, window.rose[:, :d])
        if self.drafter.vp is not None:   # fused drafts were re-drafted from a target: none is a fresh draft
            fused = verified & window.fused[:, :d]
            rec.vp_effect(p[:, :d], window.q[:, :d], window.history.prev[:, :d], fused)
            if self.drafter.auto is not None:
                self.drafter.auto.observe(p[:, :d], window.candidates[:, :, :d], fused)

    def _progress(self, progress: ProgressFn | None, n_host: list[int], canvas: Tensor) -> None:
        if progress is None:
            return
        done = [min(c, self.local.length) for c in n_host]
        grid = self.local.grid
        codes = torch.where(grid[None] < torch.tensor(done, device=grid.device)[:, None, None], canvas[:, grid], -1)
        progress(sum(done), self.B * self.local.length, codes)
