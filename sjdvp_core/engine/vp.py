"""Verification Prediction (SJD-VP, Zhang, Shan et al. 2026, arXiv 2603.27115): drafts informed by
history.

Every undecided position keeps its targets' exponentially weighted mean pbar, its last observation,
and per token a count of consecutive rises. A re-draft samples log p'(v) = log p(v) + lambda M(v)
S(v) on p's top candidates, S = clip(log p - log pbar_prev, 0, s_max), M(v) = 1 where p(v) rose in
each of the last N observations; stored with q = p', so the exact verifier stays lossless.
docs/method.md gives the method."""

from __future__ import annotations

import functools
from typing import Sequence

import torch
from torch import Tensor

from .devices import wide_float
from .settings import VPSettings

EPS = 1e-10
MAX_SHIFT = 80.0  # exp(80) x the largest probability stays finite in float32


def fuse(
    p: Tensor,
    pbar_prev: Tensor,
    pbar: Tensor,
    growth: Tensor,
    eligible: Tensor,
    s: VPSettings,
    weights: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """p [B, S, V] -> p' [B, S, V]. pbar_prev is the history before this observation, pbar and growth
    the history after it; eligible [B, S] marks slots that may be fused (history, not forced).

    strength > 0: the paper's extrapolation, boosting tokens that kept rising by their log gain.
    strength < 0: shrinkage toward the history, log p' = (1 - a) log p + a log pbar with a =
    |strength| (capped at 1) and pbar the history including this observation; it helps where
    probabilities mean-revert across iterations. Either way p' stays inside p's support. ("auto"
    is AutoStrength's.)"""
    if s.auto:
        raise ValueError(
            "fuse() needs a numeric strength; strength='auto' is chosen per run by AutoStrength"
        )
    return fuse_many(p, pbar_prev, pbar, growth, eligible, s, [s.strength], weights)[0]


def fuse_many(
    p: Tensor,
    pbar_prev: Tensor,
    pbar: Tensor,
    growth: Tensor,
    eligible: Tensor,
    s: VPSettings,
    strengths: Sequence[float],
    weights: tuple[Tensor, Tensor] | None = None,
) -> Tensor:
    """fuse() for several strengths at once (the other knobs from s) -> [C, B, S, V]; the top-k, the
    log-gain score and the shrink direction are computed once for all of them. weights: the
    strengths' weights (`strength_weights`), which a decode makes once.

    Fusion moves only the top-k_vp entries of p, so only they are computed: p' = p * g / Z with g
    the gain exp(shift) on those entries and 1 elsewhere, Z = 1 + sum(top * (g - 1)) (p sums to
    1). The vocabulary-wide work is one scatter and one division per strength, not a log-softmax;
    a strength of 0 and a slot with nothing fused keep p's own values exactly (g = 1 and Z = 1)."""
    k = min(s.top_k, p.shape[-1])
    top, idx = p.topk(k, dim=-1)  # [B, S, k]
    fused = (top > 0) & eligible[..., None]
    up, down = weights if weights is not None else strength_weights(strengths, p.device)
    shifts = []  # log p' - log p + log Z: [C, B, S, k] each
    if any(c > 0 for c in strengths):
        score = (torch.log(top + EPS) - torch.log(pbar_prev.gather(-1, idx) + EPS)).clamp(
            0, s.max_score
        )
        shifts.append(
            up * torch.where(fused & (growth.gather(-1, idx) >= s.growth_steps), score, 0.0)
        )
    # fused tokens have top > 0: the log is finite where the shrink is kept
    if any(c < 0 for c in strengths):
        shifts.append(
            down * torch.where(fused, torch.log(pbar.gather(-1, idx) + EPS) - torch.log(top), 0.0)
        )
    shift = (
        functools.reduce(torch.add, shifts) if shifts else top.new_zeros(up.shape[0], *top.shape)
    )
    # a shrink's gain is at most 1 / top (history <= 1): capped where top is near float's smallest
    # (no overflow)
    moved = top * torch.exp(shift.clamp(max=MAX_SHIFT))
    norm = 1 + (moved - top).sum(-1, keepdim=True)  # Z [C, B, S, 1]
    return p.expand(moved.shape[0], *p.shape).scatter(-1, idx.expand_as(moved), moved) / norm


def strength_weights(strengths: Sequence[float], device) -> tuple[Tensor, Tensor]:
    """[C, 1, 1, 1] each: every strength's weight of the boost (c > 0: c) and of the shrinkage (c <
    0: |c|, at most 1); both 0 for strength 0, which leaves p as it is."""
    up = torch.tensor([max(c, 0.0) for c in strengths], device=device).view(-1, 1, 1, 1)
    return up, torch.tensor([min(1.0, max(-c, 0.0)) for c in strengths], device=device).view(
        -1, 1, 1, 1
    )


class AutoStrength:
    """VP's "auto" mode: keeps the strength (among AUTO_STRENGTHS) whose drafts would have passed
    verification most often so far in this run, scored off-policy on every verified VP draft.

    Once the new target p of a drafted position is known, the exact verifier's acceptance
    probability of a draft from candidate c is sum(min(p, q_c)); that is also the expected
    acceptance under coupled drafting, whose noise at a position is independent of both p and q_c
    (scoring the draft each candidate would have made with the realised noise has the same mean
    and more variance). No exploration is needed, and the choice is lossless: it only depends on
    positions that verification has already committed, never on the randomness of drafts still
    waiting. Scores stay on the device: choosing reads no value back to the host."""

    def __init__(self, vp: VPSettings, candidates: tuple[float, ...], device):
        self.vp, self.strengths = vp, candidates
        self.score = torch.zeros(len(candidates), dtype=wide_float(device), device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.plain = torch.tensor(candidates.index(0.0) if 0.0 in candidates else 0, device=device)
        # made once: a compiled step sees constants
        self.weights = strength_weights(candidates, device)

    @property
    def accumulators(self) -> tuple[Tensor, Tensor]:
        """The device tensors `observe` adds into."""
        return self.score, self.count

    @property
    def best(self) -> Tensor:
        """Index of the strength to draft with; strength 0 (plain drafting) until there is
        evidence."""
        return torch.where(self.count == 0, self.plain, self.score.argmax())

    def fuse(
        self, p: Tensor, pbar_prev: Tensor, pbar: Tensor, growth: Tensor, eligible: Tensor
    ) -> Tensor:
        """Every candidate's fused distribution [C, B, S, V]."""
        return fuse_many(
            p, pbar_prev, pbar, growth, eligible, self.vp, self.strengths, self.weights
        )

    def chosen(self, candidates: Tensor) -> Tensor:
        # no host read (an index tensor is one)
        return candidates.index_select(0, self.best.view(1))[0]

    def observe(self, p: Tensor, candidates: Tensor, verified: Tensor) -> None:
        """p [B, w, V]: the targets the drafts in slots [B, w] were just verified against;
        candidates [C, B, w, V] the distributions each strength would have drafted them from;
        verified [B, w] marks verified VP drafts."""
        accept = torch.minimum(p, candidates).sum(-1)  # [C, B, w]
        self.score += accept.mul(verified).sum((1, 2))
        self.count += verified.sum()

    def summary(self) -> dict:
        rates = (self.score / self.count.clamp_min(1)).tolist()
        return {
            "vp_auto_strength": self.strengths[int(self.best)],
            "vp_auto_judged": int(self.count),
            "vp_auto_rates": {str(c): round(r, 4) for c, r in zip(self.strengths, rates)},
        }
