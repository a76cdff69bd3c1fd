"""Speculative Jacobi decoding: the one loop (Teng et al. 2024, arXiv 2410.01699), with pluggable
verifiers (SJD, LANTERN, GSD) and drafting rules (plain, Verification Prediction, coupled).

One iteration, per image b with n_b committed tokens: the window feeds the last committed token and the
drafts for positions n_b .. n_b + W - 2; one forward gives targets p for positions n_b .. n_b + W - 1;
`accept` verifies the drafts left to right (first rejection by one cumulative op) and draws one more
token (the residual at the rejection, or a bonus draw from p after the last draft); the accepted drafts
and that token are committed; the window slides by what was committed and is re-drafted (drafting.py).
Each image advances by its own count, and the model's cache is written by position, so rolling back
rejected entries costs nothing. With a draft tree (tree.py) the first slots hold several candidates,
scored in the same forward. W = 1 is plain AR. All randomness goes through one seeded
torch.Generator, drawn up front each iteration, so a chain's step after its forward is a pure function
that torch.compile may take (compiled.py). The loop reads one value back from the device per iteration:
the new positions.
"""
from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from .adapter import ModelAdapter, TokenLayout
from .auto import (
    MOST_FACTOR,
    TREES,
    Plan,
    PlanChooser,
    Profile,
    candidate_plans,
    contenders,
    largest_tree,
    most_tokens,
    warmed,
)
from .compiled import compiled, hold_in_place
from .cost import GRID, PassCost, cached, device_name, model_fingerprint, monotone
from .drafting import Drafter
from .settings import AUTO_STRENGTHS, DecodeSettings
from .stats import DecodeStats, Recorder
from .target import cfg_mix, sample, target_probs
from .tree import propose, scratch_nodes, tree_inputs, tree_shape, verify_tree
from .verify import Verifier, accept, accept_uniforms
from .window import LocalLayout

ProgressFn = Callable[[int, int, Tensor], None]
MeasureFn = Callable[[str, int, int], None]
"""Calibration progress: (what is measured, steps done, steps in all), after every iteration; it may raise to
abort (then nothing is cached). The first automatic run on a model measures the device (seconds for the demo,
about a thousand of the model's passes for a large one); a caller shows this, and lets the user stop it."""


@dataclass
class DecodeResult:
    tokens: Tensor    # [B, L] vocabulary ids of the generated sequence
    codes: Tensor     # [B, h, w] codebook indices of the image cells
    layout: TokenLayout
    stats: DecodeStats


@dataclass
class Step:
    """What a draft tree's forward and verification decided."""
    p: Tensor              # [B, w, V] the targets along the path taken
    k: Tensor              # [B] drafts accepted
    next: Tensor           # [B] the token after them
    accepted: Tensor       # [B, w - 1] each draft's own outcome
    scored: int            # tokens the forward scored per row
    forward_end: float     # the clock when the forward had finished
    tree: tuple[Tensor, Tensor, Tensor] | None = None   # per row: alternatives tried, one taken, a guess


class _Clock:
    """Wall time of the loop's phases, only when asked for (on a GPU each reading waits for the device)."""

    def __init__(self, device, on: bool):
        self.cuda, self.on = torch.device(device).type == "cuda", on

    def now(self) -> float:
        if self.on and self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() if self.on else 0.0


@dataclass
class _Loop:
    """The loop's state between iterations."""
    canvas: Tensor          # [B, L + W + 1] committed tokens, then drafts
    n: Tensor               # [B] committed tokens
    n_host: list[int]       # their host copy
    trace: list[list[int]]  # n_host after every iteration (the prefill's first), for DecodeStats.commit_iter
    row_passes: Tensor      # [B] forward passes until each image was complete
    window: Any             # the drafts (window.Window)
    rec: Recorder
    it: int = 1
    plans: dict = field(default_factory=dict)   # auto: iterations per plan


class JacobiDecoder:
    """One decode's fixed parts; `run` is the loop. Use `decode()` rather than this class."""

    def __init__(self, adapter: ModelAdapter, settings: DecodeSettings, layout: TokenLayout, timing: bool,
                 cost: PassCost | None = None, profile: Profile | None = None):
        self.adapter, self.s, self.device = adapter, settings, adapter.device
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
        # compiled: a chain's whole step (verification and drafting) is one graph; a tree's drafting is its own
        self.step, self.redraft = None, self.drafter.redraft
        if settings.compile:
            self.step, self.redraft = compiled(self._step, "step"), compiled(self.drafter.redraft, "draft")

    def targets(self, logits: Tensor, at: Tensor) -> Tensor:
        """Model logits [R, N, V_model] predicting positions at [B, N] -> p [B, N, V]."""
        s, local = self.s.sampling, self.local
        mixed = cfg_mix(local.local_logits(logits), s.cfg_scale, s.uses_cfg)
        return target_probs(mixed, local.mask_at(at.clamp(max=local.length + self.W)), s)

    def rows(self, t: Tensor) -> Tensor:
        """Per-image tensor -> per model row (CFG runs cond and uncond rows)."""
        return torch.cat([t, t]) if self.s.sampling.uses_cfg else t

    def begin(self, first_logits: Tensor) -> _Loop:
        """The first token of every image (from the prefill's logits) and the first window of drafts."""
        B, W, dev, L = self.B, self.W, self.device, self.local.length
        canvas = torch.zeros(B, L + W + 1, dtype=torch.long, device=dev)
        at_zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
        canvas[:, 0] = sample(self.targets(first_logits[:, None], at_zero)[:, 0], self.gen)
        n = torch.ones(B, dtype=torch.long, device=dev)
        first = self.plan if self.chooser is None else self.chooser.choice
        window = self.drafter.start(n, canvas, self.gen, first.window - 1)
        loop = _Loop(canvas, n, [1] * B, [[1] * B], torch.ones(B, dtype=torch.long, device=dev), window,
                   Recorder(max(self.S, 1), dev))
        if self.s.compile:
            hold_in_place(*self.written(loop))
        return loop

    def written(self, loop: _Loop) -> list[Tensor]:
        """The tensors a step writes into: the canvas, the statistics and VP auto's scores."""
        auto = self.drafter.auto
        return [loop.canvas, *loop.rec.accumulators, *(() if auto is None else auto.accumulators)]

    def done(self, loop: _Loop) -> bool:
        return all(c >= self.local.free_end for c in loop.n_host)

    def iterate(self, loop: _Loop) -> None:
        """forward -> targets -> accept (one step) -> commit -> redraft; one read back to the host."""
        dev, local, rec = self.device, self.local, loop.rec
        end, (lo, hi) = local.free_end, local.span
        n, canvas, window = loop.n, loop.canvas, loop.window
        plan = self.plan if self.chooser is None else self.chooser.choose(loop.it)
        if plan.window - 1 != window.slots:   # auto changed plans: the state follows, so the step costs the plan's
            window = self.drafter.resize(window, plan.window - 1, n, canvas, self.gen)
        # how far each row may accept drafts: to the end of the image grid, nothing outside it
        limit_host = [min(plan.window - 1, max(hi - c, 0)) if lo <= c < end else 0 for c in loop.n_host]
        limit, active = torch.tensor(limit_host, device=dev), n < end
        t0 = self.clock.now()
        w, one_step = max(limit_host) + 1, False
        if plan.tree.on and w > 1:
            step = self._tree_step(window, canvas, n, w, limit, plan.tree)
            p, t1, scored = step.p, step.forward_end, step.scored
            m = self.commit(rec, window, canvas, n, limit, active, p, step.k, step.next, step.accepted)
            rec.tree_outcome(*step.tree)
            t2, n_next = self.clock.now(), n + m
            loop.window = self.redraft(window, p, m, n_next, active, canvas,
                                       self.drafter.draws(self.B, window.slots, self.gen, dev))
        else:   # the plan's full window even where the image's end leaves fewer drafts: one shape per plan
            scored, at = plan.window, n[:, None] + self.steps[:plan.window]
            logits = self._chain_forward(canvas, at)
            t1 = self.clock.now()
            # the step's randomness in the generator's order: the verification's, then the drafts'
            u = accept_uniforms(self.B, scored - 1, self.gen, dev)
            draws = self.drafter.draws(self.B, window.slots, self.gen, dev)
            one_step = self.step is not None
            if one_step:   # one compiled graph (timed as one: DecodeStats.time_step)
                m, n_next, loop.window = self.step(rec, logits, at, window, canvas, n, limit, active, *u, draws)
                t2 = self.clock.now()
            else:
                p, m = self._check(rec, logits, at, window, canvas, n, limit, active, *u)
                t2, n_next = self.clock.now(), n + m
                loop.window = self.redraft(window, p, m, n_next, active, canvas, draws)
        rec.scored.append(scored)
        rec.committed.append(m.clone() if one_step else m)   # a CUDA graph's next replay overwrites its outputs
        n, loop.row_passes, loop.it = n_next, loop.row_passes + active, loop.it + 1
        loop.n = n
        before, loop.n_host = loop.n_host, n.tolist()                                      # the one sync
        if self.chooser is not None:
            loop.plans[plan] = loop.plans.get(plan, 0) + 1
            if min(before) >= self.warm:
                self.chooser.record(plan, sum(b - a for a, b in zip(before, loop.n_host)) / self.B)
        loop.trace.append(loop.n_host)
        rec.phases(t0, t1, t2, self.clock.now(), one_step)

    def run(self, first_logits: Tensor, progress: ProgressFn | None) -> DecodeResult:
        """Iterate until every image is complete, then fill in the known tail."""
        t_start = time.perf_counter()
        loop = self.begin(first_logits)
        self._progress(progress, loop.n_host, loop.canvas)
        while not self.done(loop):
            self.iterate(loop)
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
        loop.rec.into(stats)
        stats.time_total = time.perf_counter() - t_start
        return DecodeResult(local.vocab[canvas[:, :L]], canvas[:, :L][:, local.grid], self.local.layout, stats)

    def _chain_forward(self, canvas: Tensor, at: Tensor) -> Tensor:
        """The model's logits predicting positions at [B, w]: over the last committed token and the w - 1 drafts
        after it (the canvas holds them)."""
        positions = (at - 1).clamp(max=self.local.length - 1)
        return self.adapter.forward(self.rows(self.local.vocab[canvas.gather(1, at - 1)]), self.rows(positions))

    def _step(self, rec: Recorder, logits: Tensor, at: Tensor, window, canvas: Tensor, n: Tensor, limit: Tensor,
              active: Tensor, u: Tensor, u_next: Tensor, draws) -> tuple[Tensor, Tensor, Any]:
        """A chain's whole step after its forward, `_check` then the re-draft (draws: Drafter.draws) -> (tokens
        committed [B], the new counts [B], the next window): one function, so that torch.compile makes the step
        one graph, which CUDA can capture and replay (compiled.py)."""
        p, m = self._check(rec, logits, at, window, canvas, n, limit, active, u, u_next)
        n = n + m
        return m, n, self.drafter.redraft(window, p, m, n, active, canvas, draws)

    def _check(self, rec: Recorder, logits: Tensor, at: Tensor, window, canvas: Tensor, n: Tensor, limit: Tensor,
               active: Tensor, u: Tensor, u_next: Tensor) -> tuple[Tensor, Tensor]:
        """A chain's verification after its forward (logits predicting positions at [B, w]): targets, accept
        (uniforms u [B, w - 1], u_next [B]: verify.accept_uniforms) and the commit -> (p [B, w, V], tokens
        committed [B]). Pure but for the canvas and the statistics it writes."""
        w = at.shape[1]
        p = self.targets(logits, at)                                                              # [B, w, V]
        k, nxt, accepted = accept(window.tokens[:, :w - 1], window.q[:, :w - 1], p, limit, self.verifier, u,
                                  u_next)
        return p, self.commit(rec, window, canvas, n, limit, active, p, k, nxt, accepted)

    def commit(self, rec: Recorder, window, canvas: Tensor, n: Tensor, limit: Tensor, active: Tensor, p: Tensor,
               k: Tensor, nxt: Tensor, accepted: Tensor) -> Tensor:
        """Write the token after the k accepted drafts and tally the outcome -> tokens committed per row [B]."""
        at = n + k
        m = k + (active & (at < self.local.free_end))
        # the next token; in a row that commits none it lands past the row's end, where nothing reads it
        canvas.scatter_(1, at[:, None], nxt[:, None])
        self._observe(rec, window, p, k, accepted, limit, m)
        return m

    def _tree_step(self, window, canvas: Tensor, n: Tensor, w: int, limit: Tensor, tree) -> Step:
        """The same over a draft tree (tree.py); p is along the path taken. The accepted alternatives are
        written to the canvas and their branch's cache entries kept."""
        shape, local = tree_shape(w, tree, self.device), self.local
        cand = propose(window, canvas, n, local, shape, tree.guesses, self.same_noise, self.gen)
        inputs = tree_inputs(canvas.gather(1, (n - 1)[:, None])[:, 0], window.tokens, cand, shape)
        positions = ((n - 1)[:, None] + shape.offsets).clamp(max=local.length - 1)
        logits = self.adapter.forward_tree(self.rows(local.vocab[inputs]), self.rows(positions), shape.ancestors, w)
        t1 = self.clock.now()
        p_all = self.targets(logits, n[:, None] + shape.offsets)                              # [B, N, V]
        out = verify_tree(window.tokens[:, :w - 1], window.q[:, :w - 1], p_all, cand, shape, limit, self.verifier,
                          self.gen)
        pick = (out.level * shape.alts + out.choice.clamp(max=shape.alts - 1))[:, None]
        at = (n + out.level)[:, None]
        canvas.scatter_(1, at, torch.where(out.took[:, None], cand.tokens.flatten(1).gather(1, pick),
                                           canvas.gather(1, at)))
        self.adapter.adopt(self.rows(out.branch))
        p = p_all.gather(1, out.path[..., None].expand(-1, -1, p_all.shape[-1]))
        return Step(p, out.k, out.next, out.accepted, shape.nodes, t1,
                    (out.tried, out.took, cand.guess[out.choice.clamp(max=shape.alts - 1)]))

    def _observe(self, rec: Recorder, window, p: Tensor, k: Tensor, accepted: Tensor, limit: Tensor,
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


def widest_tree(settings: DecodeSettings):
    """The draft tree a decode may use at most: the user's, or with an automatic tree the largest auto weighs."""
    w = settings.window
    return largest_tree([Plan(w.size, t) for t in TREES]) if w.auto and w.auto_tree and not w.tree.on else w.tree


def state_bytes(settings: DecodeSettings, layout: TokenLayout) -> int:
    """Memory the loop holds beyond the model's KV cache, for memory managers: the Window's per-slot,
    per-vocabulary-entry tensors (q; coupled drafting's noise in float64; auto's candidates; VP's history, one slot
    wider: pbar and prev in fp32, growth in int16) and a draft tree's (each alternative's q, the targets of the
    nodes past the chain, fresh noise for the draws), doubled for the temporaries of one iteration."""
    S, d, tree = max(1, settings.window.size - 1), settings.drafter, widest_tree(settings)
    candidates = len(AUTO_STRENGTHS) if d.vp is not None and d.vp.auto else 0
    per_row = S * (4 * (1 + candidates) + 8 * d.coupled) + (S + 1) * (4 + 4 + 2)
    scratch = scratch_nodes(settings.window.size, tree)
    if scratch:
        levels = min(tree.depth, S)
        per_row += 4 * (levels * (tree.width - 1) + scratch) + 8 * levels
    return 2 * settings.batch_size * per_row * (layout.image_tokens.numel() + layout.special_tokens.numel())


def decode_bytes(adapter: ModelAdapter, settings: DecodeSettings, conditions: Sequence[Any] | Any = None,
                 negatives: Sequence[Any] | Any | None = None, itemsize: int | None = None) -> int:
    """Memory a decode with these settings needs beyond the weights: the model's KV cache for its rows
    (CFG doubles them; a draft tree adds scratch entries; the prompt's length where conditions are given),
    one forward's transients and the loop's own state. What a memory manager is told to keep free.
    itemsize: of the compute dtype (default: the weights')."""
    cfg = settings.sampling.uses_cfg
    rows = settings.batch_size * (2 if cfg else 1)
    scratch = scratch_nodes(settings.window.size, widest_tree(settings))
    prompt = adapter.prompt_length(
        None if conditions is None else _per_image(conditions, settings.batch_size, "conditions"),
        None if negatives is None else _per_image(negatives, settings.batch_size, "negatives"), cfg)
    window = min(settings.window.size, adapter.layout.length) + scratch    # a window's forward, or the prefill's
    forward = max(adapter.forward_bytes(rows, window, scratch, prompt, itemsize),
                  adapter.forward_bytes(rows, prompt or 0, scratch, prompt, itemsize, scored=1))
    return adapter.cache_bytes(rows, scratch, prompt, itemsize) + state_bytes(settings, adapter.layout) + forward


def decode(adapter: ModelAdapter, conditions: Sequence[Any] | Any, settings: DecodeSettings,
           negatives: Sequence[Any] | Any | None = None, progress: ProgressFn | None = None,
           timing: bool = False, cost: PassCost | None = None, profile: Profile | None = None) -> DecodeResult:
    """Generate settings.batch_size images. conditions: one per image, or one shared by all (the
    family's prompt, class id, ...); negatives likewise, used as the CFG branch where the family has
    one. progress(done, total, codes) is called after every iteration with the tokens committed so far
    (all images) and the image cells known so far ([B, h, w] codebook indices, -1 where undecided); it
    may raise to abort. timing: split the time into forward / verify / draft (on a GPU this waits for
    the device three times per iteration). cost, profile: the pass cost and acceptance profile an
    automatic window chooses by (default: measured on this device once and cached, see pass_cost and
    acceptance_profile); the same cost, profile and seed give the same image."""
    B = settings.batch_size
    conditions = _per_image(conditions, B, "conditions")
    negatives = None if negatives is None else _per_image(negatives, B, "negatives")
    if settings.window.auto and settings.window.size > 1:
        cost, profile = calibration(adapter, settings, cost, profile)
        settings = replace(settings, window=replace(settings.window, size=max(p.window for p in profile.plans),
                                                    tree=largest_tree(profile.plans)))
    scratch = scratch_nodes(settings.window.size, settings.window.tree)
    if scratch and not adapter.trees:
        raise ValueError(f"{adapter.family}: this model adapter cannot score draft trees; set tree width to 1")
    with torch.inference_mode():
        try:
            layout, first_logits = adapter.start(conditions, negatives, settings.sampling.uses_cfg, scratch)
            result = JacobiDecoder(adapter, settings, layout, timing, cost, profile).run(first_logits, progress)
            result.stats.pass_cost, result.stats.precision = cost, adapter.precision
            return result
        finally:
            adapter.finish()


def calibration(adapter: ModelAdapter, settings: DecodeSettings, cost: PassCost | None = None,
                profile: Profile | None = None, progress: MeasureFn | None = None) -> tuple[PassCost, Profile | None]:
    """What an automatic window chooses by and a report prices by: the pass cost (pass_cost unless given) and,
    for an automatic window, the acceptance profile of the plans that can win at that cost (acceptance_profile
    unless given, then `contenders`; None for a fixed window). Measured once per model and device and cached
    (progress: MeasureFn); a caller that times decodes calls this first, so that the first decode's time does
    not include it."""
    cost = cost or pass_cost(adapter, settings, progress)
    if not (settings.window.auto and settings.window.size > 1):
        return cost, None
    plans = auto_plans(adapter, settings, cost)
    return cost, contenders(profile or acceptance_profile(adapter, settings, plans, progress), cost)


def warm_up(adapter: ModelAdapter, settings: DecodeSettings, plans: Sequence[Plan] = (), iterations: int = 4) -> None:
    """A few untimed iterations with these settings at each plan (default: the settings' window and tree; give an
    automatic window's contenders, `calibration`): the process's one-time costs (the allocator's first blocks,
    libraries' first calls, compiling the step for each shape) land here rather than in whichever decode is
    timed first."""
    with torch.inference_mode():
        for plan in plans or [Plan(settings.window.size, settings.window.tree)]:
            for done, (decoder, loop) in enumerate(_fixed_decodes(adapter, settings, plan, [settings.seed])):
                if done == iterations:
                    break
                decoder.iterate(loop)


def measure_cost(adapter: ModelAdapter, settings: DecodeSettings, grid: Sequence[int] = GRID,
                 iterations: int = 30, rounds: int = 3, progress: MeasureFn | None = None) -> PassCost:
    """t(k) on the adapter's device: the median wall time of real iterations (the forward and the engine's
    step) of decodes with these settings at a fixed window of k tokens, for every k of grid up to the
    settings' window and that window itself, stopping past the widest window auto would allocate
    (auto.MOST_FACTOR x t(1), confirmed by timing t(1) and t(k) again); the engine's share beside it. The k
    take turns in `rounds` rounds (two iterations to warm up in each), so a drift of the machine's speed moves
    every k alike, and the medians are fitted non-decreasing in k (a pass never costs less for scoring more;
    `monotone`): auto compares plans by these ratios, and one noisy median below its neighbour would send it to
    that window. A few seconds; progress counts iterations."""
    ks = sorted({k for k in grid if k <= settings.window.size} | {1, settings.window.size})   # up to the cap itself
    walls: dict[int, list[float]] = {k: [] for k in ks}
    shares: dict[int, list[float]] = {k: [] for k in ks}
    per_round = max(1, -(-iterations // rounds))
    done, extra = 0, 0

    def measure(k: int) -> float:
        """per_round timed iterations at window k (after two to warm up) -> their median, kept in walls[k]."""
        nonlocal done
        timed, these = 0, []
        for decoder, loop in _fixed_decodes(adapter, settings, Plan(k), itertools.count(), timing=True):
            if timed == per_round + 2:
                break
            before, t = sum(loop.rec.times[1:]), decoder.clock.now()
            decoder.iterate(loop)
            if timed >= 2:
                these.append(decoder.clock.now() - t)
                shares[k].append(sum(loop.rec.times[1:]) - before)
            timed, done = timed + 1, done + 1
            if progress is not None:
                progress("pass cost", done, (len(ks) * rounds + extra) * (per_round + 2))
        walls[k] += these
        return statistics.median(these)

    with torch.inference_mode():
        for r in range(rounds):
            for k in list(ks):
                measure(k)
                if r == 0 and statistics.median(walls[k]) > MOST_FACTOR * statistics.median(walls[ks[0]]):
                    # confirmed against t(1) timed again beside it before the grid is cut for good: the machine's
                    # speed drifts (a slow stretch once cut a CPU's grid at 4 tokens, and auto then priced wider
                    # windows from the flat segment before them)
                    extra += 2
                    one = measure(ks[0])
                    if measure(k) > MOST_FACTOR * one:
                        ks = ks[:ks.index(k) + 1]
                        break
    seconds = monotone([max(statistics.median(walls[k]), 1e-9) for k in ks])
    ks = ks[:next((i + 1 for i, t in enumerate(seconds) if t > MOST_FACTOR * seconds[0]), len(ks))]
    return PassCost(tuple(ks), tuple(seconds[:len(ks)]), f"measured on {device_name(adapter.device)}",
                    tuple(statistics.median(shares[k]) for k in ks))


def _fixed_decodes(adapter: ModelAdapter, settings: DecodeSettings, plan: Plan, seeds: Iterable[int],
                   timing: bool = False) -> Iterator[tuple["JacobiDecoder", _Loop]]:
    """Decodes of the adapter's example condition at one fixed plan, seed after seed, for the calibrations:
    yields (decoder, loop) before each iteration, which the caller runs (timing or counting it) before it
    asks for the next; it stops asking when it has enough."""
    conditions = [adapter.example_condition] * settings.batch_size
    for seed in seeds:
        fixed = replace(_fixed(settings, plan), seed=seed)
        try:
            layout, first_logits = adapter.start(conditions, None, fixed.sampling.uses_cfg,
                                                 scratch_nodes(plan.window, plan.tree))
            decoder = JacobiDecoder(adapter, fixed, layout, timing=timing)
            loop = decoder.begin(first_logits)
            while not decoder.done(loop):
                yield decoder, loop
        finally:
            adapter.finish()


def _fixed(settings: DecodeSettings, plan: Plan) -> DecodeSettings:
    """The settings with this plan for every iteration (what the calibrations time and count)."""
    return replace(settings, window=replace(settings.window, size=plan.window, tree=plan.tree, auto=False,
                                            auto_tree=False))


CALIBRATION = 6   # how calibrations are measured, or what they measure changed (6: a cheaper engine step): a change
                  # re-measures what older versions cached


def _cache_key(adapter: ModelAdapter, settings: DecodeSettings) -> dict:
    module = adapter.module
    dtype = next((str(t.dtype) for t in module.parameters()), "none")
    return {"family": adapter.family, "weights": model_fingerprint(module), "device": device_name(adapter.device),
            "dtype": dtype, "torch": torch.__version__, "batch": settings.batch_size,
            "cfg": settings.sampling.uses_cfg, "method": settings.drafter.name, "window": settings.window.size,
            "length": adapter.layout.length, "compile": settings.compile, "calibration": CALIBRATION}


def pass_cost(adapter: ModelAdapter, settings: DecodeSettings, progress: MeasureFn | None = None) -> PassCost:
    """measure_cost, cached on disk per (weights, device, dtype, torch version, rows, method, window, compile)."""
    return cached(_cache_key(adapter, settings), PassCost, lambda: measure_cost(adapter, settings, progress=progress),
                  f"the pass cost of {settings.drafter.name}")


def auto_plans(adapter: ModelAdapter, settings: DecodeSettings, cost: PassCost) -> list[Plan]:
    """What an automatic window may choose from on a device with this cost (auto.candidate_plans)."""
    w = settings.window
    return candidate_plans(cost, most_tokens(cost, w.size), w.tree, w.auto_tree and adapter.trees)


def measure_profile(adapter: ModelAdapter, settings: DecodeSettings, plans: Sequence[Plan],
                    samples: int = 4, span: int = 128, progress: MeasureFn | None = None) -> Profile:
    """Committed tokens per pass per image with each plan: decodes of the adapter's example condition with
    these settings at that fixed plan (seeds 0 .. samples - 1), counted over span image tokens after the
    warm-up (auto.warmed; the same stretch for every plan, less where the image is shorter), as the decode
    counts its own; fitted non-decreasing in the window (Profile.fitted). About samples x plans x 50 passes;
    cached by acceptance_profile. progress counts the tokens the decodes have to commit."""
    start = warmed(adapter.layout.jacobi_span)
    stop = min(start + span, adapter.layout.jacobi_span[1])
    committed = []
    with torch.inference_mode():
        for i, plan in enumerate(plans):
            won = passes = 0
            for seed in range(samples):
                begun = None    # tokens committed when the counted stretch began
                for decoder, loop in _fixed_decodes(adapter, settings, plan, [seed]):
                    if min(loop.n_host) >= stop:
                        break
                    if begun is None and min(loop.n_host) >= start:
                        begun = sum(min(c, stop) for c in loop.n_host)
                    decoder.iterate(loop)
                    passes += begun is not None
                    if progress is not None:
                        progress("acceptance profile", (i * samples + seed) * stop + min(min(loop.n_host), stop),
                                 len(plans) * samples * stop)
                end = sum(min(c, stop) for c in loop.n_host)
                won += (end - (end if begun is None else begun)) / settings.batch_size
            committed.append(max(1.0, won / max(passes, 1)))
    return Profile(tuple(plans), tuple(committed),
                   f"measured on the example image, {samples} seeds, tokens {start}-{stop}").fitted()


def acceptance_profile(adapter: ModelAdapter, settings: DecodeSettings, plans: Sequence[Plan],
                       progress: MeasureFn | None = None) -> Profile:
    """measure_profile, cached on disk per (weights, drafter, draft init, rows, plans, greedy or sampled): steps,
    not seconds, so it holds on any device, compiled or not. Not per CFG scale, temperature, top-k or top-p: a
    profile measured at one of them serves the others (each decode scales it to its own acceptance, g), and a new
    value would otherwise mean another measurement. Priced on the H200 and RTX 4090 rooflines, auto chose the same
    plans with the default sampling's profile as with each setting's own; on a 2-core CPU, where neighbouring
    windows differ by a few percent, the choices moved either way (benchmarks/results/profile_reuse.md)."""
    key = _cache_key(adapter, settings) | {"greedy": settings.sampling.greedy, "drafter": repr(settings.drafter),
                                           "init": settings.window.init, "plans": [p.to_json() for p in plans],
                                           "kind": "profile"}
    del key["device"], key["compile"]
    eager = replace(settings, compile=False)   # counted, not timed: compiling each plan's step would only cost time
    return cached(key, Profile, lambda: measure_profile(adapter, eager, plans, progress=progress),
                  f"the acceptance of {len(plans)} windows and trees for the automatic window")


def _per_image(values, batch: int, name: str) -> list:
    if isinstance(values, (list, tuple)):
        if len(values) == 1:
            return list(values) * batch
        if len(values) != batch:
            raise ValueError(f"{name}: got {len(values)} for batch_size={batch}; give one per image or one for all")
        return list(values)
    return [values] * batch
