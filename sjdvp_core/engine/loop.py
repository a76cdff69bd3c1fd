"""The Jacobi loop (Teng et al. 2024, arXiv 2410.01699): one iteration on one page.

Per image b with n_b committed tokens, an iteration reads top to bottom: choose the plan (auto.py),
run the forward over the last committed token and the drafts after it (a chain, or a draft tree),
turn logits into targets p, verify the drafts left to right (verify.py), commit, re-draft
(drafting.py). All randomness is drawn from one seeded generator before each step, so a chain's step
after its forward is a pure function that torch.compile or a CUDA graph may take. docs/design.md,
"The loop", says more."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import Tensor

from .adapter import ModelAdapter, TokenLayout
from .auto import Plan, PlanChooser, Profile, allocated, warmed
from .captured import Passes
from .compiled import compiled, hold_in_place
from .cost import PassCost
from .drafting import Drafter
from .settings import DecodeSettings
from .stats import DecodeStats, Recorder
from .target import cfg_mix, sample, target_probs
from .tree import propose, tree_inputs, tree_shape, verify_tree
from .verify import Verifier, accept, accept_uniforms
from .window import LocalLayout, Window

ProgressFn = Callable[[int, int, Tensor], None]


@dataclass
class DecodeResult:
    tokens: Tensor  # [B, L] vocabulary ids of the generated sequence
    codes: Tensor  # [B, h, w] codebook indices of the image cells
    layout: TokenLayout
    stats: DecodeStats


@dataclass
class Loop:
    """The loop's state between iterations."""

    canvas: Tensor  # [B, L + width + 1] committed tokens, then drafts
    n: Tensor  # [B] committed tokens
    n_host: list[int]  # their host copy
    trace: list[list[int]]  # n_host after every iteration (the prefill's first): commit_iter
    row_passes: Tensor  # [B] forward passes until each image was complete
    window: Window  # the drafts
    rec: Recorder
    it: int = 1
    plans: dict = field(default_factory=dict)  # auto: iterations per plan


@dataclass
class Outcome:
    """What one step decided."""

    m: Tensor  # [B] tokens committed
    n: Tensor  # [B] the new counts
    window: Window  # the next drafts
    scored: int  # tokens the forward scored per row
    forward_end: float  # the clock when the forward had finished
    verify_end: float  # ... and verification (one_graph: verification and the re-draft)
    one_graph: bool = False  # verification and the re-draft ran as one graph (timed as one)
    tree: tuple[Tensor, Tensor, Tensor] | None = None  # alternatives tried, one taken, a guess


class Clock:
    """Wall time of the loop's phases, only when asked for (on a GPU each reading waits for it)."""

    def __init__(self, device, on: bool):
        self.cuda, self.on = torch.device(device).type == "cuda", on

    def now(self) -> float:
        if self.on and self.cuda:
            torch.cuda.synchronize()
        return time.perf_counter() if self.on else 0.0


class JacobiDecoder:
    """One decode's fixed parts and its loop (`run`). Use `decode()` rather than this class.

    Three sizes: the user's cap (settings.window.size), the widest plan this decode may run
    (`width`, what the canvas and the drafts are allocated for: the cap, or auto's widest
    contender), and each iteration's plan.window."""

    def __init__(
        self,
        adapter: ModelAdapter,
        settings: DecodeSettings,
        layout: TokenLayout,
        timing: bool = False,
        cost: PassCost | None = None,
        profile: Profile | None = None,
        clock: Clock | None = None,
    ):
        self.adapter, self.s, self.device = adapter, settings, adapter.device
        # the model's forward, captured where it can be
        self.passes = Passes(adapter, settings.passes)
        auto = settings.window.auto and cost is not None and profile is not None
        self.chooser = PlanChooser(cost, profile) if auto else None
        self.plan = Plan(settings.window.size, settings.window.tree)
        self.width = allocated(settings, profile if auto else None).window
        self.B = settings.batch_size
        self.groups = 1  # model rows per image: read from the prefill (begin)
        self.local = LocalLayout(layout, self.width + 1, self.device)
        self.offsets = torch.arange(self.width + 1, device=self.device)  # a step's slot offsets
        self.drafter = Drafter(
            settings.drafter, settings.window.init, self.local, self.width - 1, self.device
        )
        codebook = adapter.codebook()  # a memory manager may keep the image decoder elsewhere
        self.verifier = Verifier(
            settings.drafter,
            None if codebook is None else codebook.to(self.device),
            self.local.num_image,
            adapter.module,
        )
        self.gen = torch.Generator(device=self.device).manual_seed(settings.seed)
        self.clock = clock or Clock(self.device, timing)  # a calibration's test gives its own
        self.same_noise = Drafter.follows_noise(settings.drafter)
        self.warm = warmed(layout.jacobi_span)
        # compiled: a chain's step after its forward is one graph; a tree's re-draft its own
        self.redraft = (
            compiled(self.drafter.redraft, "draft") if settings.compile else self.drafter.redraft
        )
        self.graph = compiled(self.after_forward, "step") if settings.compile else None

    # --- the loop -------------------------------------------------------------------------------
    def run(self, first_logits: Tensor, progress: ProgressFn | None) -> DecodeResult:
        """Iterate until every image is complete, then fill in the known tail."""
        t_start = time.perf_counter()
        loop = self.begin(first_logits)
        self._progress(progress, loop.n_host, loop.canvas)
        seconds = []  # each iteration's wall time: its one read back waits for the device
        while not self.done(loop):
            t = time.perf_counter()
            self.iterate(loop)
            seconds.append(time.perf_counter() - t)
            self._progress(progress, loop.n_host, loop.canvas)
        local, B, it, canvas = self.local, self.B, loop.it, loop.canvas
        L, end = local.length, local.free_end
        canvas[:, end:L] = local.forced[end:L]  # the known tail, without a forward pass
        if end < L:
            self._progress(progress, [L] * B, canvas)
        # position t of row b was committed at the first iteration whose count passed t
        trace = torch.tensor(loop.trace).t().contiguous()  # [B, iterations]
        at = torch.arange(L).expand(B, -1).contiguous()
        commit_iter = torch.searchsorted(trace, at, right=True).clamp(max=it - 1)
        stats = DecodeStats(
            length=L,
            window=self.width,
            forward_passes=it,
            ar_passes=end,
            row_forward_passes=loop.row_passes.cpu(),
            commit_iter=commit_iter,
        )
        stats.vp_auto = self.drafter.auto.summary() if self.drafter.auto is not None else None
        stats.auto_plans = {p.label: count for p, count in loop.plans.items()} or None
        stats.passes = self.passes.kind
        loop.rec.into(stats)
        stats.iteration_seconds = seconds
        stats.time_total = time.perf_counter() - t_start
        tokens = canvas[:, :L]
        return DecodeResult(local.vocab[tokens], tokens[:, local.grid], local.layout, stats)

    def begin(self, first_logits: Tensor) -> Loop:
        """The first token of every image (from the prefill's logits) and the first drafts."""
        if bool(first_logits.isnan().any()):  # a NaN target draws token 0 everywhere: a flat image
            raise ValueError(
                f"{self.adapter.family}: the model's logits are NaN, its activations "
                "overflow at this precision (fp16 does on some models): load it in bf16 "
                "or fp32"
            )
        B, dev = self.B, self.device
        self.groups = guidance_groups(first_logits.shape[0], B, self.s.sampling.uses_cfg)
        canvas = torch.zeros(B, self.local.length + self.width + 1, dtype=torch.long, device=dev)
        at_zero = torch.zeros(B, 1, dtype=torch.long, device=dev)
        first_p = self.targets(first_logits[:, None], at_zero)[:, 0]
        # finite logits, scaled past float's range: a flat image too
        if bool(first_p.isnan().any()):
            s = self.s.sampling
            raise ValueError(
                f"temperature={s.temperature:g} with cfg_scale={s.cfg_scale:g} scales "
                "the logits past float's range: raise the temperature (or lower the cfg); "
                "for the most likely token every time, use greedy sampling"
            )
        canvas[:, 0] = sample(first_p, self.gen)
        n = torch.ones(B, dtype=torch.long, device=dev)
        first = self.plan if self.chooser is None else self.chooser.choice
        window = self.drafter.start(n, canvas, self.gen, first.window - 1)
        loop = Loop(
            canvas,
            n,
            [1] * B,
            [[1] * B],
            torch.ones(B, dtype=torch.long, device=dev),
            window,
            Recorder(max(self.width - 1, 1), dev),
        )
        if self.s.compile:
            hold_in_place(*self.written(loop))
        return loop

    def done(self, loop: Loop) -> bool:
        return all(c >= self.local.free_end for c in loop.n_host)

    def iterate(self, loop: Loop) -> None:
        """plan -> step (forward, targets, verify, commit, re-draft) -> record; one read back."""
        plan = self.plan if self.chooser is None else self.chooser.choose(loop.it)
        window = loop.window
        if plan.window - 1 != window.slots:  # auto changed plans: the drafts follow
            window = self.drafter.resize(window, plan.window - 1, loop.n, loop.canvas, self.gen)
        # how far each row may accept drafts: to the end of the image grid, nothing outside it
        end, (lo, hi) = self.local.free_end, self.local.span
        limit_host = [
            min(plan.window - 1, max(hi - c, 0)) if lo <= c < end else 0 for c in loop.n_host
        ]
        limit, active = torch.tensor(limit_host, device=self.device), loop.n < end
        reach = max(limit_host)
        t0 = self.clock.now()
        if plan.tree.on and reach > 0:
            out = self.tree_step(loop, plan, window, limit, active, reach)
        else:
            out = self.chain_step(loop, plan, window, limit, active)
        self.record(loop, plan, active, t0, out)

    # --- a chain's step: the plan's full window in one forward (one shape per plan) ---------------
    def chain_step(
        self, loop: Loop, plan: Plan, window: Window, limit: Tensor, active: Tensor
    ) -> Outcome:
        at = loop.n[:, None] + self.offsets[: plan.window]
        logits = self.forward(loop.canvas, at)
        t1 = self.clock.now()
        # the step's randomness in the generator's order: the verification's, then the drafts'
        u = accept_uniforms(self.B, plan.window - 1, self.gen, self.device)
        draws = self.drafter.draws(self.B, window.slots, self.gen, self.device)
        args = (loop.rec, logits, at, window, loop.canvas, loop.n, limit, active, *u, draws)
        if self.graph is not None:  # compiled.py
            m, n, window = self.graph(*args)
        elif self.passes.steps:  # recorded as a CUDA graph, captured.py
            m, n, window = self.passes.step(self.after_forward, args, self.written(loop))
        else:
            p, m = self.verify(*args[:-1])  # timed apart from the re-draft (its draws last)
            t2, n = self.clock.now(), loop.n + m
            window = self.redraft(window, p, m, n, active, loop.canvas, draws)
            return Outcome(m, n, window, plan.window, t1, t2)
        return Outcome(m, n, window, plan.window, t1, self.clock.now(), one_graph=True)

    def forward(self, canvas: Tensor, at: Tensor) -> Tensor:
        """The logits predicting positions at [B, w], over the last committed token and the w - 1
        drafts after it (the canvas holds them)."""
        positions = (at - 1).clamp(max=self.local.length - 1)
        tokens = self.local.vocab[canvas.gather(1, at - 1)]
        return self.passes.forward(self.rows(tokens), self.rows(positions))

    def after_forward(
        self,
        rec: Recorder,
        logits: Tensor,
        at: Tensor,
        window: Window,
        canvas: Tensor,
        n: Tensor,
        limit: Tensor,
        active: Tensor,
        u: Tensor,
        u_next: Tensor,
        draws,
    ) -> tuple[Tensor, Tensor, Window]:
        """`verify`, then the re-draft (draws: Drafter.draws) -> (tokens committed [B], the new
        counts [B], the next window): what compile or a CUDA graph takes as one."""
        p, m = self.verify(rec, logits, at, window, canvas, n, limit, active, u, u_next)
        n = n + m
        return m, n, self.drafter.redraft(window, p, m, n, active, canvas, draws)

    def verify(
        self,
        rec: Recorder,
        logits: Tensor,
        at: Tensor,
        window: Window,
        canvas: Tensor,
        n: Tensor,
        limit: Tensor,
        active: Tensor,
        u: Tensor,
        u_next: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """Targets, `accept` (uniforms: verify.accept_uniforms), the commit and its statistics ->
        (p [B, w, V], tokens committed [B]). Pure but for the canvas and the statistics."""
        w = at.shape[1]
        p = self.targets(logits, at)  # [B, w, V]
        k, nxt, accepted = accept(
            window.tokens[:, : w - 1], window.q[:, : w - 1], p, limit, self.verifier, u, u_next
        )
        m = self.commit(canvas, n, active, k, nxt)
        self.observe(rec, window, p, k, accepted, limit, m)
        return p, m

    # --- a draft tree's step (tree.py): reach + 1 slots; p along the path taken -------------------
    def tree_step(
        self, loop: Loop, plan: Plan, window: Window, limit: Tensor, active: Tensor, reach: int
    ) -> Outcome:
        """The accepted alternative is written to the canvas and its branch's cache entries kept."""
        canvas, n, w, local = loop.canvas, loop.n, reach + 1, self.local
        shape = tree_shape(w, plan.tree, self.device)
        cand = propose(
            window, canvas, n, local, shape, plan.tree.guesses, self.same_noise, self.gen
        )
        inputs = tree_inputs(canvas.gather(1, (n - 1)[:, None])[:, 0], window.tokens, cand, shape)
        positions = self.rows(((n - 1)[:, None] + shape.offsets).clamp(max=local.length - 1))
        tokens = self.rows(local.vocab[inputs])
        logits = self.passes.forward_tree(tokens, positions, shape.ancestors, w)
        t1 = self.clock.now()
        p_all = self.targets(logits, n[:, None] + shape.offsets)  # [B, N, V]
        out = verify_tree(
            window.tokens[:, : w - 1],
            window.q[:, : w - 1],
            p_all,
            cand,
            shape,
            limit,
            self.verifier,
            self.gen,
        )
        choice = out.choice.clamp(max=shape.alts - 1)
        pick, at = (out.level * shape.alts + choice)[:, None], (n + out.level)[:, None]
        taken = cand.tokens.flatten(1).gather(1, pick)
        canvas.scatter_(1, at, taken.where(out.took[:, None], canvas.gather(1, at)))
        self.adapter.adopt(tokens, positions, w, self.rows(out.branch))
        p = p_all.gather(1, out.path[..., None].expand(-1, -1, p_all.shape[-1]))
        m = self.commit(canvas, n, active, out.k, out.next)
        self.observe(loop.rec, window, p, out.k, out.accepted, limit, m)
        t2, n = self.clock.now(), n + m
        draws = self.drafter.draws(self.B, window.slots, self.gen, self.device)
        window = self.redraft(window, p, m, n, active, canvas, draws)
        tree = (out.tried, out.took, cand.guess[choice])
        return Outcome(m, n, window, shape.nodes, t1, t2, tree=tree)

    # --- the pieces both steps share --------------------------------------------------------------
    def targets(self, logits: Tensor, at: Tensor) -> Tensor:
        """Model logits [R, N, V_model] predicting positions at [B, N] -> p [B, N, V]."""
        s, local = self.s.sampling, self.local
        mixed = cfg_mix(local.local_logits(logits), s, self.groups)
        return target_probs(mixed, local.mask_at(at.clamp(max=local.length + self.width)), s)

    def rows(self, t: Tensor) -> Tensor:
        """Per-image tensor -> per model row (CFG runs a group of rows per condition kind)."""
        return t if self.groups == 1 else torch.cat([t] * self.groups)

    def commit(self, canvas: Tensor, n: Tensor, active: Tensor, k: Tensor, nxt: Tensor) -> Tensor:
        """Write the token after the k accepted drafts -> tokens committed per row [B]; in a row
        that commits none it lands past the row's end, where nothing reads it."""
        at = n + k
        canvas.scatter_(1, at[:, None], nxt[:, None])
        return k + (active & (at < self.local.free_end))

    def observe(
        self,
        rec: Recorder,
        window: Window,
        p: Tensor,
        k: Tensor,
        accepted: Tensor,
        limit: Tensor,
        m: Tensor,
    ) -> None:
        """Statistics and VP auto's scores: they look at what verification decided, never steer
        it."""
        slots = self.offsets[: p.shape[1]]
        rec.entropy += (torch.special.entr(p).sum(-1) * (slots < m[:, None])).sum()
        d = accepted.shape[1]
        if d == 0:
            return
        verified = slots[:d] < torch.minimum(k + 1, limit)[:, None]
        rec.outcomes(verified, accepted, window.rose[:, :d])
        if self.drafter.vp is not None:  # fused drafts were re-drafted from a target, none fresh
            fused = verified & window.fused[:, :d]
            rec.vp_effect(p[:, :d], window.q[:, :d], window.history.prev[:, :d], fused)
            if self.drafter.auto is not None:
                self.drafter.auto.observe(p[:, :d], window.candidates[:, :, :d], fused)

    def record(self, loop: Loop, plan: Plan, active: Tensor, t0: float, out: Outcome) -> None:
        """The loop's state and statistics after a step; auto's record of what the plan
        committed."""
        rec = loop.rec
        rec.scored.append(out.scored)
        rec.committed.append(out.m)
        if out.tree is not None:
            rec.tree_outcome(*out.tree)
        loop.n, loop.window, loop.it = out.n, out.window, loop.it + 1
        loop.row_passes = loop.row_passes + active
        before, loop.n_host = loop.n_host, out.n.tolist()  # the one read back
        if self.chooser is not None:
            loop.plans[plan] = loop.plans.get(plan, 0) + 1
            if min(before) >= self.warm:
                won = sum(b - a for a, b in zip(before, loop.n_host)) / self.B
                self.chooser.record(plan, won)
        loop.trace.append(loop.n_host)
        rec.phases(t0, out.forward_end, out.verify_end, self.clock.now(), out.one_graph)

    def written(self, loop: Loop) -> list[Tensor]:
        """The tensors a step writes into: the canvas, the statistics and VP auto's scores."""
        auto = self.drafter.auto
        return [loop.canvas, *loop.rec.accumulators, *(() if auto is None else auto.accumulators)]

    def _progress(self, progress: ProgressFn | None, n_host: list[int], canvas: Tensor) -> None:
        if progress is None:
            return
        done = [min(c, self.local.length) for c in n_host]
        grid = self.local.grid
        known = grid[None] < torch.tensor(done, device=grid.device)[:, None, None]
        progress(sum(done), self.B * self.local.length, torch.where(known, canvas[:, grid], -1))


def guidance_groups(rows: int, images: int, cfg: bool) -> int:
    """The row groups the prefill ran (cond, then with cfg uncond, and for an edit guided by its
    reference apart a third: cfg_mix), or the error that says an adapter's rows do not add up."""
    groups = rows // images
    allowed = (2, 3) if cfg else (1,)
    if groups * images != rows or groups not in allowed:
        raise ValueError(
            f"the model adapter prefilled {rows} rows for {images} images with cfg "
            f"{'on' if cfg else 'off'}: it must give {' or '.join(str(g * images) for g in allowed)}"
        )
    return groups
