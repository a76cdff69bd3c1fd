"""What one Jacobi iteration costs as a function of the tokens its forward scores per row (PassCost):
measured on the device at hand (calibration.py, which caches it on disk), or modelled from a model's
shape and a named device's datasheet (sjdvp_core/datasheet.py's `roofline`, for the benchmarks). The
model behind it, and its floor: docs/speed.md, "The cost of a pass"."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)  # tokens per row measured or modelled


@dataclass(frozen=True)
class PassCost:
    """t(k): seconds of one iteration (forward plus the engine's step) scoring k tokens per row, at
    the grid points `tokens`; linear in between and past the last point (compute-bound there)."""

    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str  # "measured on <device>" or "roofline: <model> on <device>"
    engine: tuple[float, ...] = ()  # of which the engine's own step, where measured

    def __post_init__(self):
        if (
            len(self.tokens) != len(self.seconds)
            or not self.tokens
            or self.tokens[0] != 1
            or list(self.tokens) != sorted(set(self.tokens))
            or min(self.seconds) <= 0
        ):
            raise ValueError(
                "PassCost: tokens must start at 1 and ascend, with a positive time for each"
            )

    def __call__(self, k: float) -> float:
        ks, ts = self.tokens, self.seconds
        if len(ks) == 1:
            return ts[0] * k
        i = next((j for j in range(1, len(ks)) if k <= ks[j]), len(ks) - 1)
        a, b = ks[i - 1], ks[i]
        return max(ts[0], ts[i - 1] + (ts[i] - ts[i - 1]) * (k - a) / (b - a))

    def relative(self, k: float) -> float:
        """t(k) / t(1): what a pass scoring k tokens per row costs in single-token passes."""
        return self(k) / self(1)

    def largest_within(self, factor: float, cap: int) -> int:
        """The largest window (tokens per row, at most cap) whose pass costs at most factor x
        t(1)."""
        return max([k for k in range(1, cap + 1) if self.relative(k) <= factor] or [1])

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "PassCost":
        return cls(tuple(d["tokens"]), tuple(d["seconds"]), d["source"], tuple(d.get("engine", ())))


def monotone(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest to values in least squares (isotonic regression by
    pooling adjacent violators): a neighbour pair out of order becomes their mean, and so on
    outward."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, n), (b, m) = blocks[-2], blocks.pop()
            blocks[-1] = [(a * n + b * m) / (n + m), n + m]
    return [mean for mean, count in blocks for _ in range(count)]
