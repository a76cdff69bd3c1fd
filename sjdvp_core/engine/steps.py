"""One Jacobi iteration's step, once the plan is chosen: a chain's (`ChainStep`) or a draft tree's (`TreeStep`),
with one interface, (loop, plan, window, limit, active, reach) -> `Outcome`: forward, targets, verification,
the commit, the re-draft. The loop (loop.py) chooses the plan, runs the step and records its outcome.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch
from torch import Tensor

from .adapter import ModelAdapter
from .auto import Plan
from .captured import Passes
from .compiled import compiled
from .drafting import Drafter
from .settings import DecodeSettings
from .stats import Recorder
from .tree import propose, tree_inputs, tree_shape, verify_tree
from .verify import Verifier, accept, accept_uniforms
from .window import LocalLayout, Window


@dataclass
class Loop:
    """The loop's state between iterations."""
    canvas: Tensor          # [B, L + W + 1] committed tokens, then drafts
    n: Tensor               # [B] committed tokens
    n_host: list[int]       # their host copy
    trace: list[list[int]]  # n_host after every iteration (the prefill's first), for DecodeStats.commit_iter
    row_passes: Tensor      # [B] forward passes until each image was complete
    window: Window          # the drafts
    rec: Recorder
    it: int = 1
    plans: dict = field(default_factory=dict)   # auto: iterations per plan


class Decoder(Protocol):
    """What a step uses of its decode (loop.JacobiDecoder): the model, the rules, the shared pieces."""
    adapter: ModelAdapter
    passes: Passes
    s: DecodeSettings
    drafter: Drafter
    verifier: Verifier
    local: LocalLayout
    gen: torch.Generator
    device: torch.device
    B: int
    steps: Tensor
    same_noise: bool
    redraft: Callable[..., Window]
    clock: object

    def targets(self, logits: Tensor, at: Tensor) -> Tensor: ...

    def rows(self, t: Tensor) -> Tensor: ...

    def written(self, loop: Loop) -> list[Tensor]: ...

    def commit(self, canvas: Tensor, n: Tensor, active: Tensor, k: Tensor, nxt: Tensor) -> Tensor: ...

    def observe(self, rec: Recorder, window: Window, p: Tensor, k: Tensor, accepted: Tensor, limit: Tensor,
                m: Tensor) -> None: ...


@dataclass
class Outcome:
    """What one step decided."""
    m: Tensor               # [B] tokens committed
    n: Tensor               # [B] the new counts
    window: Window          # the next drafts
    scored: int             # tokens the forward scored per row
    forward_end: float      # the clock when the forward had finished
    verify_end: float       # ... and verification (with one_graph: verification and the re-draft)
    one_graph: bool = False  # verification and the re-draft ran as one compiled graph (timed as one)
    tree: tuple[Tensor, Tensor, Tensor] | None = None   # per row: alternatives tried, one taken, a guess


class ChainStep:
    """The plan's full window in one forward, even where the image's end leaves fewer drafts (one shape per
    plan), then `accept` and the re-draft: everything after the forward is one function, compiled with compile
    (compiled.py), or recorded as a CUDA graph with the passes (captured.py)."""

    def __init__(self, decoder: Decoder):
        self.d = decoder
        self.graph = compiled(self.after_forward, "step") if decoder.s.compile else None

    def __call__(self, loop: Loop, plan: Plan, window: Window, limit: Tensor, active: Tensor,
                 reach: int) -> Outcome:
        d = self.d
        at = loop.n[:, None] + d.steps[:plan.window]
        logits = self.forward(loop.canvas, at)
        t1 = d.clock.now()
        # the step's randomness in the generator's order: the verification's, then the drafts'
        u = accept_uniforms(d.B, plan.window - 1, d.gen, d.device)
        draws = d.drafter.draws(d.B, window.slots, d.gen, d.device)
        if self.graph is not None or d.passes.steps:   # compiled, or recorded as a CUDA graph (captured.py)
            args = (loop.rec, logits, at, window, loop.canvas, loop.n, limit, active, *u, draws)
            m, n, window = self.graph(*args) if self.graph is not None else \
                d.passes.step(self.after_forward, args, d.written(loop))
            return Outcome(m, n, window, plan.window, t1, d.clock.now(), one_graph=True)
        p, m = self.verify(loop.rec, logits, at, window, loop.canvas, loop.n, limit, active, *u)
        t2, n = d.clock.now(), loop.n + m
        return Outcome(m, n, d.redraft(window, p, m, n, active, loop.canvas, draws), plan.window, t1, t2)

    def forward(self, canvas: Tensor, at: Tensor) -> Tensor:
        """The model's logits predicting positions at [B, w]: over the last committed token and the w - 1 drafts
        after it (the canvas holds them)."""
        d = self.d
        positions = (at - 1).clamp(max=d.local.length - 1)
        return d.passes.forward(d.rows(d.local.vocab[canvas.gather(1, at - 1)]), d.rows(positions))

    def after_forward(self, rec: Recorder, logits: Tensor, at: Tensor, window: Window, canvas: Tensor, n: Tensor,
                      limit: Tensor, active: Tensor, u: Tensor, u_next: Tensor, draws) -> tuple[Tensor, Tensor, Window]:
        """`verify` then the re-draft (draws: Drafter.draws) -> (tokens committed [B], the new counts [B], the
        next window): the compiled graph."""
        p, m = self.verify(rec, logits, at, window, canvas, n, limit, active, u, u_next)
        n = n + m
        return m, n, self.d.drafter.redraft(window, p, m, n, active, canvas, draws)

    def verify(self, rec: Recorder, logits: Tensor, at: Tensor, window: Window, canvas: Tensor, n: Tensor,
               limit: Tensor, active: Tensor, u: Tensor, u_next: Tensor) -> tuple[Tensor, Tensor]:
        """Targets, `accept` (uniforms u [B, w - 1], u_next [B]: verify.accept_uniforms), the commit and its
        statistics -> (p [B, w, V], tokens committed [B]). Pure but for the canvas and the statistics it writes."""
        d, w = self.d, at.shape[1]
        p = d.targets(logits, at)                                                                 # [B, w, V]
        k, nxt, accepted = accept(window.tokens[:, :w - 1], window.q[:, :w - 1], p, limit, d.verifier, u, u_next)
        m = d.commit(canvas, n, active, k, nxt)
        d.observe(rec, window, p, k, accepted, limit, m)
        return p, m


class TreeStep:
    """The same over a draft tree (tree.py), scoring `reach` + 1 slots; p is along the path taken. The accepted
    alternatives are written to the canvas and their branch's cache entries kept."""

    def __init__(self, decoder: Decoder):
        self.d = decoder

    def __call__(self, loop: Loop, plan: Plan, window: Window, limit: Tensor, active: Tensor,
                 reach: int) -> Outcome:
        d, canvas, n, w = self.d, loop.canvas, loop.n, reach + 1
        shape, local = tree_shape(w, plan.tree, d.device), d.local
        cand = propose(window, canvas, n, local, shape, plan.tree.guesses, d.same_noise, d.gen)
        inputs = tree_inputs(canvas.gather(1, (n - 1)[:, None])[:, 0], window.tokens, cand, shape)
        positions = d.rows(((n - 1)[:, None] + shape.offsets).clamp(max=local.length - 1))
        tokens = d.rows(local.vocab[inputs])
        logits = d.passes.forward_tree(tokens, positions, shape.ancestors, w)
        t1 = d.clock.now()
        p_all = d.targets(logits, n[:, None] + shape.offsets)                                  # [B, N, V]
        out = verify_tree(window.tokens[:, :w - 1], window.q[:, :w - 1], p_all, cand, shape, limit, d.verifier,
                          d.gen)
        choice = out.choice.clamp(max=shape.alts - 1)
        pick, at = (out.level * shape.alts + choice)[:, None], (n + out.level)[:, None]
        canvas.scatter_(1, at, cand.tokens.flatten(1).gather(1, pick).where(out.took[:, None], canvas.gather(1, at)))
        d.adapter.adopt(tokens, positions, w, d.rows(out.branch))
        p = p_all.gather(1, out.path[..., None].expand(-1, -1, p_all.shape[-1]))
        m = d.commit(canvas, n, active, out.k, out.next)
        d.observe(loop.rec, window, p, out.k, out.accepted, limit, m)
        t2, n = d.clock.now(), n + m
        window = d.redraft(window, p, m, n, active, canvas, d.drafter.draws(d.B, window.slots, d.gen, d.device))
        return Outcome(m, n, window, shape.nodes, t1, t2, tree=(out.tried, out.took, cand.guess[choice]))
