"""The model's pass replayed as a CUDA graph, as gpt-fast, vLLM and SGLang run their decode steps.

An eager pass of a large model waits for the host to launch its kernels one by one; recorded once
per input shape and replayed, the launches cost one call. A shape is recorded at its second pass,
and its first replay is checked against the eager pass (else the model runs eagerly, the reason
logged once and reported). Graphs live as long as one decode: they hold the addresses of its KV
cache. docs/gpu.md, "The captured pass", says more."""

from __future__ import annotations

import dataclasses
import logging
import time
import weakref
from typing import Callable

import torch
from torch import Tensor

from .compiled import copied
from .settings import PASS_MODES

log = logging.getLogger("sjdvp")

RECORD_AT = 2  # the pass of a shape that records it
# model -> why
_FAILED: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()


class CudaGraph:
    """One shape's function recorded on CUDA, in a memory pool shared by a decode's graphs (as vLLM
    shares one). The tensors of its arguments are copied into static buffers, except the `held`
    ones (ids of tensors it writes in place, which keep their address for the decode); reset()
    undoes what the warm-up run wrote into them."""

    def __init__(
        self,
        fn: Callable,
        args: tuple,
        pool,
        held: frozenset[int] = frozenset(),
        reset: Callable[[], None] = lambda: None,
    ):
        self.args = static(args, held)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*self.args)
        torch.cuda.current_stream().wait_stream(side)
        reset()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn(*self.args)

    def __call__(self, *args):
        fill(self.args, args)
        self.graph.replay()
        return self.out


GRAPHS: dict[str, type] = {"cuda": CudaGraph}  # device type -> how a pass is recorded there


def eager_reason(adapter, mode: str) -> str | None:
    """Why this adapter's passes run eagerly under mode (a PASS_MODES; None: they are recorded).
    auto records on CUDA for unquantised or int8 weights; captured also tries bitsandbytes'
    kernels; eager never records."""
    if mode not in PASS_MODES:
        raise ValueError(f"passes={mode!r}: choose one of {list(PASS_MODES)}")
    device = torch.device(adapter.device)
    if mode == "eager":
        return "eager, as asked"
    if device.type not in GRAPHS:
        return f"eager: no CUDA graphs on the {device.type.upper() if device.type == 'cpu' else device.type}"
    if getattr(adapter, "device_map", None):
        return "eager: the model is placed by a device map (split over GPUs or offloaded)"
    if adapter.module in _FAILED:
        return _FAILED[adapter.module]
    if mode == "auto" and _bitsandbytes(adapter.module):
        return "eager: bitsandbytes' quantised kernels (choose captured to try recording them)"
    return None


def pass_kind(adapter, mode: str) -> str:
    """'captured' or 'eager': what a pass-cost measurement is keyed by."""
    return "eager" if eager_reason(adapter, mode) else "captured"


def _bitsandbytes(module: torch.nn.Module) -> bool:
    return any(type(m).__module__.startswith("bitsandbytes") for m in module.modules())


# --- arguments as trees of tensors (tuples, dataclasses such as the Window; other objects pass as t
def static(obj, held: frozenset[int]):
    """obj with every tensor in it cloned, but those whose id is in held."""
    if isinstance(obj, Tensor):
        return obj if id(obj) in held else obj.clone()
    if isinstance(obj, (tuple, list)):
        return type(obj)(static(v, held) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(
            obj, **{f.name: static(getattr(obj, f.name), held) for f in _fields(obj)}
        )
    return obj


def fill(into, obj) -> None:
    """Copy obj's tensors into the same places of into (static's result for an argument of the
    same shapes)."""
    if isinstance(into, Tensor):
        if into is not obj:
            into.copy_(obj)
    elif isinstance(into, (tuple, list)):
        for a, b in zip(into, obj):
            fill(a, b)
    elif dataclasses.is_dataclass(into) and not isinstance(into, type):
        for f in _fields(into):
            fill(getattr(into, f.name), getattr(obj, f.name))


def leaves(obj) -> list[Tensor]:
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for v in obj for t in leaves(v)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in _fields(obj) for t in leaves(getattr(obj, f.name))]
    return []


def shapes(obj) -> tuple:
    """What a recording of a function of obj depends on: its tensors' shapes and dtypes, where
    None stands."""
    if isinstance(obj, Tensor):
        return (tuple(obj.shape), obj.dtype)
    if isinstance(obj, (tuple, list)) or (
        dataclasses.is_dataclass(obj) and not isinstance(obj, type)
    ):
        items = (
            obj if isinstance(obj, (tuple, list)) else [getattr(obj, f.name) for f in _fields(obj)]
        )
        return tuple(shapes(v) for v in items)
    return obj if isinstance(obj, (int, float, bool, str)) else (obj is None, type(obj).__name__)


def _fields(obj):
    return [f for f in dataclasses.fields(obj) if f.init]


class Passes:
    """One decode's passes of an adapter (its forward and forward_tree) and its chain steps
    (verification and the re-draft), each shape recorded at its second run where eager_reason
    allows, eager otherwise. `kind` says which ran, for the report."""

    def __init__(self, adapter, mode: str = "auto"):
        self.adapter, self.why_eager = adapter, eager_reason(adapter, mode)
        self.why_step_eager: str | None = None
        self.device = torch.device(adapter.device)
        self.graphs: dict[tuple, Callable] = {}
        self.seen: dict[tuple, int] = {}
        self.record_seconds = 0.0
        self.replays = 0
        self.pool = (
            torch.cuda.graph_pool_handle()
            if self.why_eager is None and self.device.type == "cuda"
            else None
        )
        weights = next(adapter.module.parameters(), None)
        self.tolerance = 1e-4 if weights is None or weights.dtype == torch.float32 else 2e-2

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """adapter.forward, recorded per shape [R, W]."""
        return self._run(("chain", *tokens.shape), self.adapter.forward, (tokens, positions))

    def forward_tree(
        self, tokens: Tensor, positions: Tensor, ancestors: Tensor, chain: int
    ) -> Tensor:
        """adapter.forward_tree, recorded per shape [R, N] and chain length."""

        def tree(t: Tensor, p: Tensor, a: Tensor) -> Tensor:
            return self.adapter.forward_tree(t, p, a, chain)

        return self._run(("tree", *tokens.shape, chain), tree, (tokens, positions, ancestors))

    @property
    def steps(self) -> bool:
        """Whether chain steps are recorded (with the passes; a step that failed to record runs
        eagerly)."""
        return self.why_eager is None and self.why_step_eager is None

    def step(self, fn: Callable, args: tuple, held: list[Tensor]):
        """fn(*args): a chain's step after its forward (steps.ChainStep.after_forward), recorded per
        shape of its arguments. held: the tensors it writes in place (the canvas, the statistics'
        and VP auto's accumulators), used where they are; its outputs are copied out, as the next
        replay overwrites them and the window it returns is the next step's input."""
        key = ("step", shapes(args))
        replay = key in self.graphs
        out = self._run(key, fn, args, held)
        return copied(out) if replay else out

    @property
    def kind(self) -> str:
        """What ran, in a line: 'captured: N shapes of the pass and M of the step recorded in S s, R
        replays' (and why the step ran eagerly, where it did), or 'eager: why'."""
        if self.why_eager:
            return self.why_eager
        steps = sum(k[0] == "step" for k in self.graphs)
        why = f"; the step {self.why_step_eager}" if self.why_step_eager else ""
        return (
            f"captured: {len(self.graphs) - steps} shapes of the pass and {steps} of the step recorded in "
            f"{self.record_seconds:.2f} s, {self.replays} replays{why}"
        )

    def _run(self, key: tuple, fn: Callable, args: tuple, held: list[Tensor] = ()):
        graph = self.graphs.get(key)
        if graph is not None:
            self.replays += 1
            return graph(*args)
        stepping = key[0] == "step"
        if self.steps if stepping else self.why_eager is None:
            self.seen[key] = self.seen.get(key, 0) + 1
        if self.seen.get(key) != RECORD_AT:
            return fn(*args)
        self.seen[key] += 1
        before = [h.clone() for h in held]
        out = fn(*args)
        self._record(key, fn, args, out, held, before)
        return out

    def _record(
        self, key: tuple, fn: Callable, args: tuple, eager, held: list[Tensor], before: list[Tensor]
    ) -> None:
        """Record the shape and check its first replay against the eager run that just happened (its
        outputs, and what it wrote into `held`, which read `before` when it began); the held
        tensors end as the eager run left them. On any failure that kind of run is eager from now
        on, the reason said once: passes for this model (in this process), steps for this decode."""
        t = time.perf_counter()
        after = [h.clone() for h in held]

        def reset():
            for h, b in zip(held, before):
                h.copy_(b)

        try:
            reset()
            graph = GRAPHS[self.device.type](fn, args, self.pool, frozenset(map(id, held)), reset)
            reset()
            replayed = graph(*args)
            differs = next(
                filter(
                    None,
                    (
                        mismatch(a, b, self.tolerance)
                        for a, b in zip(leaves(replayed) + list(held), leaves(eager) + after)
                    ),
                ),
                None,
            )
        except (
            Exception
        ) as e:  # whatever recording raises (an op reading the host, a kernel that cannot): eager
            first = (str(e).strip().splitlines() or [""])[0][:200]
            differs = f"recording failed ({type(e).__name__}: {first})"
        finally:
            for h, a in zip(held, after):
                h.copy_(a)
        if not differs:
            self.graphs[key] = graph
            self.record_seconds += time.perf_counter() - t
        elif key[0] == "step":
            self.why_step_eager = f"eager: {differs}"
            self.graphs = {k: g for k, g in self.graphs.items() if k[0] != "step"}
            log.warning(
                "sjdvp: the engine's step is not replayed as a CUDA graph here (%s); it runs eagerly: the "
                "same tokens, slower",
                differs,
            )
        else:
            self.why_eager = _FAILED[self.adapter.module] = f"eager: {differs}"
            self.graphs.clear()
            log.warning(
                "sjdvp: %s's pass is not replayed as a CUDA graph here (%s); it runs eagerly: the same "
                "tokens, slower",
                self.adapter.family,
                differs,
            )


def mismatch(replayed: Tensor, eager: Tensor, tolerance: float) -> str | None:
    """Why a replay's tensor is not the eager run's (None: it is; floats within tolerance x the
    largest value)."""
    if replayed.shape != eager.shape or replayed.dtype != eager.dtype:
        return (
            f"the replay gave {replayed.dtype} {tuple(replayed.shape)}, the eager run {eager.dtype} "
            f"{tuple(eager.shape)}"
        )
    if not eager.is_floating_point():
        return (
            None
            if torch.equal(replayed, eager)
            else "a replay's integers differ from the eager run's"
        )
    if eager.numel() == 0:
        return None
    diff = float((replayed.double() - eager.double()).abs().max())
    scale = float(eager.double().abs().max())
    if not diff <= tolerance * max(scale, 1.0):  # NaN fails too
        return f"a replay's values differ from the eager run's by {diff:.3g} (largest {scale:.3g})"
    return None
