"""The automatic window (and draft tree): what each iteration's forward scores.

Each iteration runs the plan (a chain window, or one with a capped draft tree at its first slot)
with the most expected committed tokens per second, tau(plan) / t(nodes(plan)): t from the device's
pass cost (cost.py), tau from this model's acceptance profile (calibration.acceptance_profile)
scaled to this prompt by what its drafts actually won. The choice reads only past commits, never the
drafts it is about to verify, so every token keeps its exact law. docs/speed.md, "The automatic
window and tree", says why."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .cost import PassCost, monotone
from .settings import MAX_WINDOW, DecodeSettings, TreeSettings
from .tree import scratch_nodes

MOST_FACTOR = (
    3.0  # the state is sized for windows whose pass costs at most this many 1-token passes
)
EVERY = 4  # iterations a choice holds
HYSTERESIS = 1.03  # a new plan must promise this much more per second than the one running
TIE = 0.005  # rates this close are a tie, which the plan scoring the most takes (`best`)
PRIOR = 8.0  # pseudo-tokens of evidence that g = 1 (the example's acceptance) before any is seen
# how far a decode's acceptance may stray from the example's (g) when plans are kept
G_RANGE = (
    0.5,
    2.0,
)
# image tokens the drafts mature over before acceptance is counted (profile and decode alike)
WARM = 32
LADDER = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
# capped trees: 6x1/4 takes the most steps per node measured (benchmarks/results/trees_branch.md);
# longer branches and a wider first slot take fewer passes where the device scores their extra nodes
# almost for free, under a GPU's knee (benchmarks/results/trees_budget.md). The profile and the
# device's cost decide between them.
TREES = (
    TreeSettings(width=6, depth=1, branch=4),
    TreeSettings(width=6, depth=1, branch=8),
    TreeSettings(width=8, depth=1, branch=6),
)
TREE_FROM = 16  # trees are tried at windows this wide or wider
CHAIN = TreeSettings()


def warmed(span: tuple[int, int]) -> int:
    """Where counting starts in a grid spanning these positions: WARM tokens in (a quarter, if
    shorter)."""
    lo, hi = span
    return min(lo + WARM, lo + (hi - lo) // 4)


def most_tokens(cost: PassCost, cap: int) -> int:
    """The largest window auto may pick (its state is allocated at this size): a pass costing more
    than MOST_FACTOR x t(1) needs more than that many tokens per pass to pay; the demo commits at
    most about 4. Never past the cost's last point: what it says beyond is a straight line from
    its last two points, not a price."""
    return max(2, cost.largest_within(MOST_FACTOR, min(cap, cost.tokens[-1]))) if cap > 1 else 1


@dataclass(frozen=True)
class Plan:
    """One choice: the tokens the chain scores per row (window) and the draft tree at its first
    slot."""

    window: int
    tree: TreeSettings = CHAIN

    @property
    def nodes(self) -> int:
        """Tokens one pass scores per row."""
        return self.window + scratch_nodes(self.window, self.tree)

    @property
    def label(self) -> str:
        t = self.tree
        return f"{self.window}" + (f"+{t.width}x{t.depth}/{t.branch}" if t.on else "")

    def to_json(self) -> dict:
        return {"window": self.window, "tree": asdict(self.tree)}

    @classmethod
    def from_json(cls, d: dict) -> "Plan":
        return cls(d["window"], TreeSettings(**d["tree"]))


def candidate_plans(
    cost: PassCost, most: int, tree: TreeSettings = CHAIN, auto_tree: bool = False
) -> list[Plan]:
    """The plans worth measuring and choosing from on a device with this cost, widest first: windows
    of the ladder up to most (and most itself), each with the user's tree, and with TREES where
    auto_tree; a plan is dropped when another that scores at least as much of the same kind costs
    no more. Not when the other costs a little more: a plan that commits a little less for a
    little less may still be the better rate."""
    windows = sorted({w for w in LADDER if w < most} | {most}, reverse=True)
    plans = [Plan(w, tree) for w in windows]
    if auto_tree:
        plans += [
            Plan(w, t)
            for w in windows
            if w >= TREE_FROM
            for t in TREES
            if t != tree and cost.relative(Plan(w, t).nodes) <= MOST_FACTOR
        ]
    return [
        plan
        for plan in plans
        if not any(
            o is not plan and _covers(o, plan) and cost(o.nodes) <= cost(plan.nodes) for o in plans
        )
    ]


def _covers(a: Plan, b: Plan) -> bool:
    """a scores everything b does, with the same kind of tree: a window at least as wide, branches
    at least as long (0: to the window's end), and a differs from b."""
    same = replace(a.tree, branch=0) == replace(b.tree, branch=0)
    return (
        same
        and a != b
        and a.window >= b.window
        and (a.tree.branch or MAX_WINDOW) >= (b.tree.branch or MAX_WINDOW)
    )


def largest_tree(plans: list[Plan]) -> TreeSettings:
    """The tree whose scratch nodes bound every plan's (what the model's cache and the memory
    estimate hold)."""
    trees = [p for p in plans if p.tree.on]
    return max(trees, key=lambda p: p.nodes - p.window).tree if trees else CHAIN


@dataclass(frozen=True)
class Profile:
    """Committed tokens per pass per image (steady state) with each plan, measured on an example
    image."""

    plans: tuple[Plan, ...]
    committed: tuple[float, ...]
    source: str

    def __post_init__(self):
        if len(self.plans) != len(self.committed) or not self.plans or min(self.committed) < 1:
            raise ValueError("Profile: one committed count (at least 1) per plan")

    def of(self, plan: Plan) -> float:
        return self.committed[self.plans.index(plan)]

    def to_json(self) -> dict:
        return {
            "plans": [p.to_json() for p in self.plans],
            "committed": list(self.committed),
            "source": self.source,
        }

    @classmethod
    def from_json(cls, d: dict) -> "Profile":
        return cls(tuple(Plan.from_json(p) for p in d["plans"]), tuple(d["committed"]), d["source"])

    def fitted(self) -> "Profile":
        """The committed counts fitted non-decreasing in the window among plans with the same tree
        (`monotone`): a wider window's front drafts have matured over more iterations and it
        offers more of them, so it never commits less in expectation, while a few seeds' counts
        can say otherwise, and auto would buy the noise."""
        committed = list(self.committed)
        for tree in {p.tree for p in self.plans}:
            same = sorted(
                (i for i, p in enumerate(self.plans) if p.tree == tree),
                key=lambda i: self.plans[i].window,
            )
            for i, c in zip(same, monotone([self.committed[i] for i in same])):
                committed[i] = c
        return replace(self, committed=tuple(committed))


def allocated(settings: DecodeSettings, profile: Profile | None) -> Plan:
    """The widest plan a decode may run, what its canvas, drafts and the model's scratch nodes are
    sized for: the user's window and tree, or with the automatic window (profile) its widest
    contender and largest tree."""
    if profile is None:
        return Plan(settings.window.size, settings.window.tree)
    return Plan(max(p.window for p in profile.plans), largest_tree(list(profile.plans)))


def rate(profile: Profile, cost: PassCost, plan: Plan, g: float) -> float:
    """Expected committed tokens per second with this plan, for a decode whose drafts win g times
    the tokens past the first that the profile's example did."""
    return (1 + g * (profile.of(plan) - 1)) / cost(plan.nodes)


def best(profile: Profile, cost: PassCost, g: float) -> Plan:
    """The plan with the best rate at g; of plans within TIE of it, the one that scores the most.
    Under a GPU's knee a wider plan costs a hair more, and the fitted profile gives it the
    narrower one's count where a few seeds cannot tell them apart (`Profile.fitted` pools them),
    though a wider window never commits less: the hair would otherwise choose the narrower."""
    rates = {p: rate(profile, cost, p, g) for p in profile.plans}
    top = max(rates.values())
    return max(
        (p for p in profile.plans if rates[p] >= (1 - TIE) * top), key=lambda p: (p.nodes, rates[p])
    )


def contenders(profile: Profile, cost: PassCost) -> Profile:
    """The profile's plans that are the best for some g in G_RANGE (the chooser's rate is linear in
    g, so these are the upper envelope over that range; found on a fine grid of g). Only they can
    be chosen, and the decode's memory (the canvas, a tree's scratch cache slots, the memory
    estimate) is sized for the widest of them rather than for every candidate measured; each
    iteration's window state is its own plan's (Drafter.resize)."""
    lo, hi = G_RANGE
    kept = {best(profile, cost, lo + (hi - lo) * i / 64) for i in range(65)}
    chosen = [p for p in profile.plans if p in kept]
    return Profile(tuple(chosen), tuple(profile.of(p) for p in chosen), profile.source)


class PlanChooser:
    """Picks the plan for each iteration from the profile, scaled by what this decode's drafts
    win."""

    def __init__(self, cost: PassCost, profile: Profile):
        self.cost, self.profile = cost, profile
        # tokens past the first per pass: seen, and the profile's
        self.won, self.expected = (
            PRIOR,
            PRIOR,
        )
        self.choice = self.best()

    def rate(self, plan: Plan) -> float:
        """Expected committed tokens per second with this plan, at this decode's acceptance so
        far."""
        return rate(self.profile, self.cost, plan, self.won / self.expected)

    def best(self) -> Plan:
        return best(self.profile, self.cost, self.won / self.expected)

    def record(self, plan: Plan, committed: float) -> None:
        """An iteration with this plan, after the warm-up (`warmed`), committed this many tokens
        per image."""
        self.won += committed - 1
        self.expected += self.profile.of(plan) - 1

    def choose(self, iteration: int) -> Plan:
        """The plan for this iteration."""
        if iteration > EVERY and (iteration - 1) % EVERY == 0:
            best = self.best()
            if self.rate(best) > HYSTERESIS * self.rate(self.choice):
                self.choice = best
        return self.choice
