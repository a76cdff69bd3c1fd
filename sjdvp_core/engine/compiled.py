"""The engine's step through torch.compile, where the platform compiles it, and eagerly where it does
not.

A chain's step after its forward (verification and re-drafting) is one pure function of tensors, its
randomness drawn beforehand, so compiling fuses its few hundred small operations into a few kernels.
The first call of each function compiles (seconds); a failure to compile runs the step eagerly, with
one warning. A rounding difference between fused and unfused kernels can flip a rare draw: a seed
reproduces an image with the same `compile` setting. docs/gpu.md, "The engine's own step", says
more."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from typing import Any, Callable

import torch

log = logging.getLogger("sjdvp")

_FAILED: set[str] = set()  # functions whose compilation failed in this process: not tried again
# graphs one function may compile in a process (one per window size and state size, and a few
# settings): torch's default of 8 is fewer than the windows an automatic window's calibration times
RECOMPILES = 64
# torch before 2.6 named the limit cache_size_limit and its error FailOnCacheLimitHit (looked up
# where the new are not)
_LIMIT = (
    "recompile_limit" if hasattr(torch._dynamo.config, "recompile_limit") else "cache_size_limit"
)
_GAVE_UP = (
    torch._dynamo.exc.TorchDynamoException,
    getattr(torch._dynamo.exc, "FailOnRecompileLimitHit", None)
    or torch._dynamo.exc.FailOnCacheLimitHit,
)
GRAPH_MODES = ("reduce-overhead", "max-autotune")  # torch.compile modes that capture CUDA graphs


def compiled(fn: Callable, name: str) -> Callable:
    """fn through torch.compile(fullgraph=True), or fn itself once compiling it has failed
    (logged once)."""
    if name in _FAILED:
        return fn
    setattr(torch._dynamo.config, _LIMIT, max(getattr(torch._dynamo.config, _LIMIT), RECOMPILES))
    mode = os.environ.get("SJDVP_COMPILE_MODE") or None
    try:
        fast = torch.compile(fn, fullgraph=True, mode=mode)
    except RuntimeError as e:  # e.g. a Python version this torch's compiler does not support
        return _give_up(fn, name, e)
    kept = copied if mode in GRAPH_MODES else (lambda out: out)

    @functools.wraps(fn)
    def step(*args):
        if name in _FAILED:
            return fn(*args)
        try:
            out = fast(*args)
        except _GAVE_UP as e:  # it failed to compile (or compiled too many graphs): nothing ran
            return _give_up(fn, name, e)(*args)
        return kept(out)

    return step


def copied(out: Any) -> Any:
    """out with every tensor in it copied: tensors, tuples of them, dataclasses holding them (the
    Window)."""
    if isinstance(out, torch.Tensor):
        return out.clone()
    if isinstance(out, tuple):
        return tuple(copied(v) for v in out)
    if dataclasses.is_dataclass(out):
        return dataclasses.replace(
            out, **{f.name: copied(getattr(out, f.name)) for f in dataclasses.fields(out)}
        )
    return out


def hold_in_place(*tensors: torch.Tensor) -> None:
    """Tell torch.compile that these tensors, which a compiled step writes into, keep their address
    for the decode, so that CUDA graphs capture the step with its writes. A later decode's
    tensors re-record the graph once (past torch's cudagraph_unexpected_rerecord_limit, 128 by
    default, it runs uncaptured). The step computes the same either way."""
    for t in tensors:
        torch._dynamo.mark_static_address(t)


def _give_up(fn: Callable, name: str, error: Exception) -> Callable:
    _FAILED.add(name)
    first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
    log.warning(
        "sjdvp: the engine's %s step does not compile here (%s); it runs without torch.compile "
        "(the same images, slower on a GPU). Turn compile off to skip the attempt.",
        name,
        first_line[:300],
    )
    return fn
