"""Side-by-side timing, one way for the command line and every benchmark: the contenders take turns in
every round, after untimed warm-up rounds, and each is summarised by its median, so that a drift of
the machine's speed (clocks, other load) moves them all alike and one slow run does not decide a
ratio. On a GPU each run is bracketed by synchronisations, so it is timed to the end of its kernels.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping

import torch


@dataclass
class Timed:
    """One contender's runs: the seconds of each timed run and what the last run returned."""

    seconds: list[float] = field(default_factory=list)
    result: Any = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def to_json(self) -> dict:
        """The timing fields of a benchmark's JSON row."""
        return {
            "seconds": round(self.median, 4),
            "runs_s": [round(s, 4) for s in self.seconds],
            "repeats": len(self.seconds),
        }


def synchronize(device=None) -> Callable[[], None]:
    """What waits for a device's queued work: CUDA's synchronize, nothing on a CPU."""
    on_cuda = (
        torch.device(device).type == "cuda" if device is not None else torch.cuda.is_available()
    )
    return torch.cuda.synchronize if on_cuda else (lambda: None)


def interleaved(
    runs: Mapping[Hashable, Callable[[], Any]], repeats: int, warmup: int = 1, device=None
) -> dict[Hashable, Timed]:
    """Every run of `runs` once per round, in order, for `warmup` untimed rounds and then `repeats`
    timed ones -> per key its Timed (the seconds of its timed runs, its last result)."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats}: time each contender at least once")
    sync = synchronize(device)
    out = {key: Timed() for key in runs}
    for round_ in range(warmup + repeats):
        for key, run in runs.items():
            sync()
            t = time.perf_counter()
            out[key].result = run()
            sync()
            if round_ >= warmup:
                out[key].seconds.append(time.perf_counter() - t)
    return out
