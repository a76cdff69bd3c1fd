"""What a decode measured: forward passes, acceptance, where and when tokens were committed, timing,
VP's effect and the momentum statistic that says whether VP's premise holds on this model."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .devices import wide_float
from .window import FLAT, ROSE

MIN_TIMED = 8  # iterations a decode needs before its times say anything about the pass cost


@dataclass
class DecodeStats:
    length: int  # generated tokens per image (L)
    window: int
    forward_passes: int = 0  # NFE, prefill included; one CFG-doubled batch counts once
    ar_passes: int = 0  # what plain AR needs for the same image: one per token up to the
    # last image cell (forced tokens after it take none)
    row_forward_passes: Tensor | None = None  # [B] NFE until each image was complete
    committed_per_iter: list = field(default_factory=list)  # one [B] tensor per iteration
    commit_iter: Tensor | None = None  # [B, L] iteration at which each position was committed
    slot_verified: Tensor | None = None  # [W-1] drafts verified at each window slot
    slot_accepted: Tensor | None = None
    # VP's effect, in exact-verifier acceptance probability (sum of min(p, q)) of carried drafts
    vp_drafts: int = 0
    vp_expected_accept: float = 0.0  # with the fused q actually used
    plain_expected_accept: float = 0.0  # had the draft come from the unfused p
    vp_auto: dict | None = None  # VP auto mode: the strength it settled on, each candidate's rate
    auto_plans: dict | None = (
        None  # automatic window: iterations run with each plan (engine/auto.py)
    )
    # momentum: acceptance of carried drafts whose probability rose at their last observation or not
    rose_verified: int = 0
    rose_accepted: int = 0
    flat_verified: int = 0
    flat_accepted: int = 0
    entropy_sum: float = 0.0  # entropy (nats) of the target p at each committed position
    tokens_scored: int = 0  # tokens fed through the model per image, prefill excluded (a window
    # of w costs w of them: about one token's time below the knee, docs/speed.md)
    # tokens each iteration's forward scored per row
    scored_per_iter: list = field(default_factory=list)
    # each iteration's wall time, read back included
    iteration_seconds: list = field(default_factory=list)
    pass_cost: object = None  # the engine/cost.PassCost of this device, where the decode had one
    profile: object = None  # the auto.Profile an automatic window chose by
    precision: str = ""  # the weights' precision where a loader chose it (ModelAdapter.precision)
    passes: str = ""  # how the model's passes ran: captured (shapes, seconds) or eager and why
    # draft trees: branching slots where the draft was rejected (so alternatives were tried), and
    # how often a spatial guess or a further draw from q was accepted there
    tree_tried: int = 0
    tree_guess_accepted: int = 0
    tree_draw_accepted: int = 0
    time_forward: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_step: float = (
        0.0  # compiled chain steps: verification and drafting in one graph, not split
    )
    time_total: float = 0.0

    @property
    def step_compression(self) -> float:
        """The headline figure: AR's forward passes / this decode's (for a batch, until its
        slowest image)."""
        return self.ar_passes / self.forward_passes

    @property
    def mean_accepted(self) -> float:
        """Tokens committed per forward pass, per image (prefill excluded); for a batch over its
        passes, which run until its slowest image is done (as step_compression: the mean of each
        image's own rate read higher than the batch achieved)."""
        return (self.ar_passes - 1) / max(1, self.forward_passes - 1)

    @property
    def drafts_verified(self) -> int:
        """Drafts verified: none under AR, whose acceptance is no figure."""
        return int(self.slot_verified.sum()) if self.slot_verified is not None else 0

    @property
    def acceptance_rate(self) -> float:
        verified = self.drafts_verified
        return int(self.slot_accepted.sum()) / verified if verified else 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Tokens each forward pass scored per image, on average (1 for AR)."""
        return self.tokens_scored / max(1, self.forward_passes - 1)

    def estimated_speedup(self, cost=None) -> float:
        """Wall-clock speed-up over plain AR on the device whose pass cost is cost (engine/cost.py):
        AR's passes of one token against this decode's passes at what each scored (the prefill,
        the same for both, left out). An estimate: it is the measured step count priced by the
        cost table (default: the decode's own)."""
        cost = cost or self.pass_cost
        spent = sum(cost(k) for k in self.scored_per_iter)
        return (self.ar_passes - 1) * cost(1) / spent if spent else 1.0

    @property
    def pass_cost_drift(self) -> float | None:
        """This decode's iterations against the pass cost it chose by: the median over iterations of
        the wall time over t(k) at the k it scored (1: as the cost says; None without a cost or
        with under MIN_TIMED iterations). The median leaves out a process's one-time costs (the
        first iterations, compiling a plan's step), which a calibration's warm-up leaves out too."""
        if self.pass_cost is None or len(self.iteration_seconds) < MIN_TIMED:
            return None
        return statistics.median(
            t / self.pass_cost(k) for t, k in zip(self.iteration_seconds, self.scored_per_iter)
        )

    @property
    def mean_entropy(self) -> float:
        """Mean entropy of the target distribution the committed tokens were decided by."""
        return self.entropy_sum / max(
            1, int(self.row_forward_passes.numel()) * (self.ar_passes - 1)
        )

    @property
    def vp_gain(self) -> float | None:
        """Expected-acceptance ratio of fused drafts over the plain drafts they replaced."""
        if not self.vp_drafts or self.plain_expected_accept <= 0:
            return None
        return self.vp_expected_accept / self.plain_expected_accept

    def momentum(self) -> dict:
        """Acceptance when the drafted token had just risen vs not, and the risen share of
        accepts."""

        def rate(a, n):
            return a / n if n else float("nan")

        accepted = self.rose_accepted + self.flat_accepted
        return {
            "accept_if_rose": rate(self.rose_accepted, self.rose_verified),
            "accept_if_not": rate(self.flat_accepted, self.flat_verified),
            "rose_share_of_accepted": rate(self.rose_accepted, accepted),
        }

    def summary(self) -> dict:
        out = {
            "length": self.length,
            "window": self.window,
            "forward_passes": self.forward_passes,
            "step_compression": round(self.step_compression, 4),
            "mean_accepted": round(self.mean_accepted, 4),
            "acceptance_rate": round(self.acceptance_rate, 4) if self.drafts_verified else None,
            "mean_entropy": round(self.mean_entropy, 4),
            "tokens_per_forward": round(self.tokens_per_forward, 4),
            "time_total_s": round(self.time_total, 4),
            "time_forward_s": round(self.time_forward, 4),
            "time_draft_s": round(self.time_draft, 4),
            "time_verify_s": round(self.time_verify, 4),
            "time_step_s": round(self.time_step, 4),
        }
        # JSON has no NaN
        out.update({k: None if math.isnan(v) else round(v, 4) for k, v in self.momentum().items()})
        if self.tree_tried:
            out.update(
                tree_tried=self.tree_tried,
                tree_guess_accepted=self.tree_guess_accepted,
                tree_draw_accepted=self.tree_draw_accepted,
            )
        if (drift := self.pass_cost_drift) is not None:
            out["pass_cost_drift"] = round(drift, 3)
        if self.vp_gain is not None:
            out["vp_expected_gain"] = round(self.vp_gain, 4)
        if self.vp_auto is not None:
            out.update(self.vp_auto)
        return out


class Recorder:
    """What a decode counts and times while it runs. Counts stay on the device (reading one back
    each iteration would stall the loop); `into` reads them once, at the end. It observes
    outcomes and never steers the run."""

    def __init__(self, slots: int, device):
        acc = wide_float(device)
        # drafts per (window slot, Window.rose class, outcome: 0 not verified, 1 rejected, 2
        # accepted)
        self.outcome_counts = torch.zeros(slots, 3, 3, dtype=torch.long, device=device)
        # each slot's first cell in outcome_counts
        self.cells = torch.arange(slots, device=device) * 9
        self.one = torch.ones((), dtype=torch.long, device=device)
        # fused drafts, their sum min(p, q), the plain q's
        self.vp = torch.zeros(3, dtype=acc, device=device)
        # [1], not a scalar: torch.compile guards a 0-d float input on its value, a read back to the
        # host per step
        self.entropy = torch.zeros(1, dtype=acc, device=device)
        # tried, guess accepted, draw accepted
        self.tree = torch.zeros(3, dtype=torch.long, device=device)
        self.committed: list[Tensor] = []  # [B] per iteration
        self.scored: list[int] = []  # tokens fed through the model per row, per iteration
        # forward, verify, draft, both as one compiled step (seconds, when timed)
        self.times = [
            0.0,
            0.0,
            0.0,
            0.0,
        ]

    @property
    def accumulators(self) -> tuple[Tensor, ...]:
        """The device tensors the step adds into."""
        return self.outcome_counts, self.vp, self.entropy, self.tree

    def phases(self, t0: float, t1: float, t2: float, t3: float, one_graph: bool = False) -> None:
        """One iteration's clock readings: forward t0..t1, verification t1..t2, drafting t2..t3;
        one_graph: a compiled step did both in one graph, t1..t2, counted as such (t2..t3 is then
        the loop's own work)."""
        self.times[0] += t1 - t0
        if one_graph:
            self.times[3] += t2 - t1
        else:
            self.times[1] += t2 - t1
            self.times[2] += t3 - t2

    def outcomes(self, verified: Tensor, accepted: Tensor, rose: Tensor) -> None:
        """Verified drafts [B, w] per window slot and which were accepted, by whether their
        probability rose at the observation they were re-drafted from (rose: Window.rose's
        classes), for the momentum statistic. One accumulation into a table of counts, which
        `into` reduces once."""
        outcome = verified.long() + (verified & accepted)
        cell = self.cells[: verified.shape[1]] + rose * 3 + outcome
        self.outcome_counts.view(-1).index_put_((cell.flatten(),), self.one, accumulate=True)

    def vp_effect(self, p: Tensor, q: Tensor, plain: Tensor, fused: Tensor) -> None:
        """Expected exact-verifier acceptance sum(min(p, q)) of verified fused drafts (fused [B,
        w]), with the fused q and with the plain distribution they replaced."""
        overlap = torch.minimum(p, torch.stack([q, plain])).sum(-1)  # [2, B, w]
        self.vp += torch.cat([fused[None], overlap]).mul(fused).sum((1, 2))

    def tree_outcome(self, tried: Tensor, took: Tensor, guess: Tensor) -> None:
        """Per row [B]: whether the draft at a branching slot was rejected, so alternatives were
        tried, and whether one was accepted there, a spatial guess (guess) or a draw."""
        self.tree += torch.stack([tried.sum(), (took & guess).sum(), (took & ~guess).sum()])

    def into(self, stats: DecodeStats) -> DecodeStats:
        counts = self.outcome_counts.cpu()
        stats.slot_verified, stats.slot_accepted = (
            counts[:, :, 1:].sum((1, 2)),
            counts[:, :, 2].sum(1),
        )
        stats.rose_verified, stats.flat_verified = counts[:, [ROSE, FLAT], 1:].sum((0, 2)).tolist()
        stats.rose_accepted, stats.flat_accepted = counts[:, [ROSE, FLAT], 2].sum(0).tolist()
        drafts, stats.vp_expected_accept, stats.plain_expected_accept = self.vp.tolist()
        stats.vp_drafts = int(drafts)
        stats.entropy_sum = float(self.entropy[0])
        stats.tree_tried, stats.tree_guess_accepted, stats.tree_draw_accepted = self.tree.tolist()
        stats.committed_per_iter = (
            [m.cpu() for m in torch.stack(self.committed).unbind()] if self.committed else []
        )
        stats.scored_per_iter, stats.tokens_scored = list(self.scored), sum(self.scored)
        stats.time_forward, stats.time_verify, stats.time_draft, stats.time_step = self.times
        return stats
