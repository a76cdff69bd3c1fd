"""The model's pass replayed as a CUDA graph, as gpt-fast, vLLM and SGLang run their decode steps.

An eager pass of a large model on a GPU waits for the host to launch its kernels one by one: it costs several
times what reading the weights takes, the same at 1 token as at 256 (benchmarks/results/gpu_check.md).
Recorded once per input shape and replayed, the launches cost one call. Our KV cache is written by position
and a plan's passes keep one shape (a chain is padded to its window), so a decode meets few shapes.

A shape is recorded at its second pass (one met once, such as the image's last short tree, is not worth it):
that pass runs eagerly, once more on a side stream (CUDA's warm-up before a capture), then is recorded with
its inputs in static buffers and replayed once. The replay must give the eager pass's logits (within the
dtype's tolerance) or the model runs eagerly from then on, the reason logged once and reported; so does any
error while recording. A replay writes the cache entries the eager pass wrote, with the same values.
Graphs live as long as one decode: they hold the addresses of its KV cache. Logits a replay returns are
overwritten by the next replay of that shape (the loop reads them before its next pass).
"""
from __future__ import annotations

import logging
import time
import weakref
from typing import Callable

import torch
from torch import Tensor

from .settings import PASS_MODES

log = logging.getLogger("sjdvp")

RECORD_AT = 2                                    # the pass of a shape that records it
_FAILED: "weakref.WeakKeyDictionary[torch.nn.Module, str]" = weakref.WeakKeyDictionary()   # model -> why


class CudaGraph:
    """One shape's pass recorded on CUDA, in a memory pool shared by a decode's graphs (as vLLM shares one)."""

    def __init__(self, fn: Callable[..., Tensor], inputs: tuple[Tensor, ...], pool):
        self.inputs = tuple(x.clone() for x in inputs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = fn(*self.inputs)

    def __call__(self, *inputs: Tensor) -> Tensor:
        for static, x in zip(self.inputs, inputs):
            static.copy_(x)
        self.graph.replay()
        return self.out


GRAPHS: dict[str, type] = {"cuda": CudaGraph}   # device type -> how a pass is recorded there


def eager_reason(adapter, mode: str) -> str | None:
    """Why this adapter's passes run eagerly under mode (a PASS_MODES; None: they are recorded). auto records on
    CUDA for unquantised or int8 weights; captured also tries bitsandbytes' kernels; eager never records."""
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


class Passes:
    """One decode's passes of an adapter: its forward and forward_tree, each shape recorded at its second pass
    where eager_reason allows, eager otherwise. `kind` says which ran, for the report."""

    def __init__(self, adapter, mode: str = "auto"):
        self.adapter, self.why_eager = adapter, eager_reason(adapter, mode)
        self.device = torch.device(adapter.device)
        self.graphs: dict[tuple, Callable[..., Tensor]] = {}
        self.seen: dict[tuple, int] = {}
        self.record_seconds = 0.0
        self.replays = 0
        self.pool = torch.cuda.graph_pool_handle() if self.why_eager is None and self.device.type == "cuda" else None
        weights = next(adapter.module.parameters(), None)
        self.tolerance = 1e-4 if weights is None or weights.dtype == torch.float32 else 2e-2

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """adapter.forward, recorded per shape [R, W]."""
        return self._pass(("chain", *tokens.shape), self.adapter.forward, tokens, positions)

    def forward_tree(self, tokens: Tensor, positions: Tensor, ancestors: Tensor, chain: int) -> Tensor:
        """adapter.forward_tree, recorded per shape [R, N] and chain length."""
        def tree(t: Tensor, p: Tensor, a: Tensor) -> Tensor:
            return self.adapter.forward_tree(t, p, a, chain)
        return self._pass(("tree", *tokens.shape, chain), tree, tokens, positions, ancestors)

    @property
    def kind(self) -> str:
        """What ran, in a line: 'captured: N shapes recorded in S s' or 'eager: why'."""
        if self.why_eager:
            return self.why_eager
        return f"captured: {len(self.graphs)} shapes recorded in {self.record_seconds:.2f} s, {self.replays} replays"

    def _pass(self, key: tuple, fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        graph = self.graphs.get(key)
        if graph is not None:
            self.replays += 1
            return graph(*inputs)
        out = fn(*inputs)
        if self.why_eager is None:
            self.seen[key] = self.seen.get(key, 0) + 1
            if self.seen[key] == RECORD_AT:
                self._record(key, fn, inputs, out)
        return out

    def _record(self, key: tuple, fn: Callable[..., Tensor], inputs: tuple[Tensor, ...], eager: Tensor) -> None:
        """Record the shape and check its first replay against the eager pass that just ran; on any failure
        the model's passes are eager from now on (for this model, in this process), the reason said once."""
        t = time.perf_counter()
        try:
            graph = GRAPHS[self.device.type](fn, inputs, self.pool)
            replayed = graph(*inputs)
            differs = mismatch(replayed, eager, self.tolerance)
        except Exception as e:   # whatever recording raises (an op reading the host, a kernel that cannot): eager
            first = (str(e).strip().splitlines() or [""])[0][:200]
            differs = f"recording failed ({type(e).__name__}: {first})"
        if differs:
            self.why_eager = _FAILED[self.adapter.module] = f"eager: {differs}"
            self.graphs.clear()
            log.warning("sjdvp: %s's pass is not replayed as a CUDA graph here (%s); it runs eagerly: the same "
                        "tokens, slower", self.adapter.family, differs)
            return
        self.graphs[key] = graph
        self.record_seconds += time.perf_counter() - t


def mismatch(replayed: Tensor, eager: Tensor, tolerance: float) -> str | None:
    """Why a replay's logits are not the eager pass's (None: they are, within tolerance x the largest logit)."""
    if replayed.shape != eager.shape:
        return f"the replay's logits are {tuple(replayed.shape)}, the eager pass's {tuple(eager.shape)}"
    diff = float((replayed.float() - eager.float()).abs().max())
    scale = float(eager.float().abs().max())
    if not diff <= tolerance * max(scale, 1.0):      # NaN fails too
        return f"a replay's logits differ from the eager pass's by {diff:.3g} (largest logit {scale:.3g})"
    return None
