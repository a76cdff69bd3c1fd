"""The automatic window: before every iteration, how many tokens the forward scores.

It maximises expected committed tokens per second: expected tokens from this decode's running per-slot
acceptance (slot j's rate among drafts verified there, i.e. all before it accepted), cost from the
device's pass cost t(k) (cost.py). A window of w scores the last committed token and w - 1 drafts and
commits 1 + sum_{i < w} prod_{j <= i} a_j tokens in expectation. The choice reads only counts of
verifications already made, never the randomness of the drafts it is about to verify, so every committed
token keeps its exact law (the tests check it with chi-square, chain and tree). A slot's rate starts at
the pooled rate of all slots (PRIOR pseudo-verifications), so slots not verified yet are neither ignored
nor trusted.
"""
from __future__ import annotations

from .cost import PassCost

PRIOR = 2.0          # pseudo-verifications per slot at the pooled acceptance rate
MOST_FACTOR = 3.0    # the state is sized for windows whose pass costs at most this many 1-token passes


def most_tokens(cost: PassCost, cap: int) -> int:
    """The largest window auto may pick (its state is allocated at this size): beyond MOST_FACTOR x t(1)
    a pass would need more than that many tokens committed per pass to pay, which per-slot acceptance
    rarely gives (benchmarks/results/latency.md)."""
    return max(2, cost.largest_within(MOST_FACTOR, cap)) if cap > 1 else 1


class WindowChooser:
    def __init__(self, cost: PassCost, most: int):
        self.most = most
        self.seconds = [cost(k) for k in range(1, most + 1)]

    def expected(self, verified: list[int], accepted: list[int]) -> list[float]:
        """Expected committed tokens of windows 1 .. most, from the per-slot counts."""
        pooled = (sum(accepted) + 1) / (sum(verified) + 2)
        out, run = [1.0], 1.0
        for j in range(self.most - 1):
            run *= (accepted[j] + PRIOR * pooled) / (verified[j] + PRIOR)
            out.append(out[-1] + run)
        return out

    def choose(self, verified: list[int], accepted: list[int]) -> int:
        rates = [e / t for e, t in zip(self.expected(verified, accepted), self.seconds)]
        return 1 + max(range(self.most), key=rates.__getitem__)
