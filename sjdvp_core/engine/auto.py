"""The automatic window: how many tokens each iteration's forward scores.

It keeps the window that maximises committed tokens per second, tau(w) / t(w): t from the device's pass
cost (cost.py), tau(w) the tokens this decode committed per pass while it used w. The windows are a
ladder down from the largest worth allocating (`most_tokens`), each rung at most half the one above and
cheaper per pass by CHEAPER (a wider window commits at least as many tokens per pass, so a narrower one
that costs the same can only lose: on a GPU below its knee the ladder is a single rung); each choice
holds for EVERY iterations. It starts widest (a wide window's drafts mature fastest) and steps down the ladder while
each step gives more tokens per second, then keeps the best window measured (a decode is a few dozen
choices long: a bandit that tries every window, UCB1 for one, spent a third of the demo's passes on
windows that lose). The first EVERY iterations (random drafts, always rejected) are not counted. Two
acceptance models were tried first and dropped: per-slot rates priced for the next iteration alone fell to
a window of 1 after the first (rejected) random drafts and never verified again, and a steady-state model
from acceptance by draft age predicted about 2.4 tokens per pass for wide windows where the demo commits
3.5 (acceptance is correlated along the chain).

The choice reads only how many tokens past iterations committed, never the randomness of the drafts it
is about to verify, so every committed token keeps its exact law (the tests check it with chi-square,
chain and tree). At least one draft is scored (w >= 2): if plain AR is what the device favours, the method
to pick is AR.
"""
from __future__ import annotations

from .cost import PassCost

MOST_FACTOR = 3.0   # the state is sized for windows whose pass costs at most this many 1-token passes
EVERY = 4           # iterations a choice holds
CHEAPER = 1.05      # a narrower window is tried only where its pass costs this much less


def most_tokens(cost: PassCost, cap: int) -> int:
    """The largest window auto may pick (its state is allocated at this size): a pass costing more than
    MOST_FACTOR x t(1) needs more than that many tokens per pass to pay; the demo commits at most about 3.5
    (benchmarks/results/latency.md)."""
    return max(2, cost.largest_within(MOST_FACTOR, cap)) if cap > 1 else 1


class WindowChooser:
    def __init__(self, cost: PassCost, most: int):
        self.cost, self.ladder = cost, [most]
        for w in range(most // 2, 1, -1):
            if 2 * w <= self.ladder[-1] and cost(w) * CHEAPER <= cost(self.ladder[-1]):
                self.ladder.append(w)
        self.passes = dict.fromkeys(self.ladder, 0)
        self.tokens = dict.fromkeys(self.ladder, 0.0)
        self.choice, self.descending = most, True

    def rate(self, w: int) -> float:
        """Measured tokens per second (per image) with window w."""
        return self.tokens[w] / self.passes[w] / self.cost(w)

    def record(self, iteration: int, window: int, committed: float) -> None:
        """An iteration with this window committed this many tokens per image."""
        if iteration > EVERY and window in self.passes:
            self.passes[window] += 1
            self.tokens[window] += committed

    def choose(self, iteration: int) -> int:
        """The window for this iteration."""
        if iteration <= EVERY or (iteration - 1) % EVERY or not self.passes[self.choice]:
            return self.choice
        i = self.ladder.index(self.choice)
        if self.descending and i + 1 < len(self.ladder) and (i == 0 or self.rate(self.choice) > self.rate(
                self.ladder[i - 1])):
            self.choice = self.ladder[i + 1]
            return self.choice
        self.descending = False
        self.choice = max((w for w in self.ladder if self.passes[w]), key=self.rate)
        return self.choice
