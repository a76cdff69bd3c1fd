"""Verification Prediction (SJD-VP, Zhang, Shan et al. 2026, arXiv 2603.27115): drafts informed by probability history.

Every not-yet-committed position keeps, across the Jacobi iterations that scored it, an exponentially
weighted average of its target probabilities pbar, its previous observation, and per token a count of
consecutive increases. When a carried position is re-drafted from its new target p, VP samples from
    log p'(v) = log p(v) + lambda * M(v) * S(v)  on the top-k_vp candidates of p, renormalised,
with S = clip(log p - log pbar_prev, 0, s_max) and M(v) = 1 iff p(v) rose in each of the last N
observations. The draft is stored with q = p', so the exact verifier stays lossless. Histories are kept
per window slot, aligned with the draft positions, and shifted as the window slides.
"""
from __future__ import annotations

import functools
from typing import Sequence

import torch
from torch import Tensor

from .devices import wide_float
from .settings import VPSettings
from .window import History

EPS = 1e-10
MAX_SHIFT = 80.0     # exp(80) x the largest probability stays finite in float32


def fuse(p: Tensor, pbar_prev: Tensor, pbar: Tensor, growth: Tensor, eligible: Tensor, s: VPSettings,
         weights: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """p [B, S, V] -> p' [B, S, V]. pbar_prev is the history before this observation, pbar and growth
    the history after it; eligible [B, S] marks slots that may be fused (history, not forced).

    strength > 0: the paper's extrapolation, boosting tokens that kept rising by their log gain.
    strength < 0: shrinkage toward the history, log p' = (1 - a) log p + a log pbar with a = |strength|
    (capped at 1) and pbar the history including this observation; it helps where probabilities
    mean-revert across iterations. Either way p' stays inside p's support. ("auto" is AutoStrength's.)"""
    if s.auto:
        raise ValueError("fuse() needs a numeric strength; strength='auto' is chosen per run by AutoStrength")
    up, down = weights if weights is not None else strength_weights([s.strength], p.device)
    return fuse_many(p, pbar_prev, pbar, growth, eligible, s, [s.strength], (up[0], down[0]))


def fuse_many(p: Tensor, pbar_prev: Tensor, pbar: Tensor, growth: Tensor, eligible: Tensor, s: VPSettings,
              strengths: Sequence[float], weights: tuple[Tensor, Tensor] | None = None) -> Tensor:
    """fuse() for several strengths at once (the other knobs from s) -> [C, B, S, V]; the top-k, the
    log-gain score and the shrink direction are computed once for all of them. weights: the strengths'
    weights (`strength_weights`, [C, 1, 1, 1] each), which a decode makes once; one strength's weights without
    their first axis ([1, 1, 1]) give its distribution alone, [B, S, V].

    Fusion moves only the top-k_vp entries of p, so only they are computed: p' = p * g / Z with g the gain
    exp(shift) on those entries and 1 elsewhere, Z = 1 + sum(top * (g - 1)) (p sums to 1). The vocabulary-wide
    work is one scatter and one division per strength, not a log-softmax; a strength of 0 and a slot with nothing
    fused keep p's own values exactly (g = 1 and Z = 1)."""
    k = min(s.top_k, p.shape[-1])
    top, idx = p.topk(k, dim=-1)                           # [B, S, k]
    fused = (top > 0) & eligible[..., None]
    up, down = weights if weights is not None else strength_weights(strengths, p.device)
    shifts = []                                            # log p' - log p + log Z: [C, B, S, k] each
    if any(c > 0 for c in strengths):
        score = (torch.log(top + EPS) - torch.log(pbar_prev.gather(-1, idx) + EPS)).clamp(0, s.max_score)
        shifts.append(up * torch.where(fused & (growth.gather(-1, idx) >= s.growth_steps), score, 0.0))
    if any(c < 0 for c in strengths):   # fused tokens have top > 0: the log is finite where the shrink is kept
        shifts.append(down * torch.where(fused, torch.log(pbar.gather(-1, idx) + EPS) - torch.log(top), 0.0))
    if not shifts:
        return p.expand(*up.shape[:-3], *p.shape)
    shift = functools.reduce(torch.add, shifts)
    # a shrink's gain is at most 1 / top (history <= 1): capped where top is near float's smallest (no overflow)
    moved = top * torch.exp(shift.clamp(max=MAX_SHIFT))
    norm = 1 + (moved - top).sum(-1, keepdim=True)         # Z [C, B, S, 1]
    return p.expand(*moved.shape[:-1], -1).scatter(-1, idx.expand_as(moved), moved) / norm


def strength_weights(strengths: Sequence[float], device) -> tuple[Tensor, Tensor]:
    """[C, 1, 1, 1] each: every strength's weight of the boost (c > 0: c) and of the shrinkage (c < 0: |c|,
    at most 1); both 0 for strength 0, which leaves p as it is."""
    up = torch.tensor([max(c, 0.0) for c in strengths], device=device).view(-1, 1, 1, 1)
    return up, torch.tensor([min(1.0, max(-c, 0.0)) for c in strengths], device=device).view(-1, 1, 1, 1)


AUDIT_EVERY = 4   # VP's statistics and auto's scores look at one iteration in this many (`audits`)


def audits(iteration: int) -> bool:
    """Whether verification at this iteration audits the drafts it verifies: scores what each candidate strength
    would have drafted (auto) and VP's effect (statistics). Iteration 3 is the first whose drafts can be fused
    (a draft is fused from a position's second observation on). Sampling one iteration in AUDIT_EVERY keeps
    this scoring, which works on every candidate's distribution over the vocabulary, a small share of VP's step."""
    return iteration % AUDIT_EVERY == 3 % AUDIT_EVERY


def overlap(p: Tensor, q: Tensor) -> Tensor:
    """sum(min(p, q)) over the vocabulary: the exact verifier's probability of accepting a draft from q."""
    return torch.minimum(p, q).sum(-1)


class AutoStrength:
    """VP's "auto" mode: drafts with the strength (among AUTO_STRENGTHS) whose drafts would have passed
    verification most often so far in this run, scored off-policy on the verified VP drafts of audited
    iterations (`audits`).

    Once the new target p of a drafted position is known, the exact verifier's acceptance probability
    of a draft from candidate c is sum(min(p, q_c)); that is also the expected acceptance under coupled
    drafting, whose noise at a position is independent of both p and q_c. No exploration is needed, and
    the choice is lossless: it only depends on positions that verification has already committed, never on
    the randomness of drafts still waiting. An audit rebuilds every candidate's distribution from the
    position's history as it stood when the draft was made (`observe`), so nothing per candidate is kept
    between iterations. The scores stay on the device; the host learns the best strength with the loop's
    one read after an audit (`choose`), so each re-draft fuses with one strength, known before the step."""

    def __init__(self, vp: VPSettings, candidates: tuple[float, ...], device):
        self.vp, self.strengths = vp, candidates
        self.score = torch.zeros(len(candidates), dtype=wide_float(device), device=device)
        self.count = torch.zeros((), dtype=torch.long, device=device)
        self.plain = candidates.index(0.0) if 0.0 in candidates else 0
        self.weights = strength_weights(candidates, device)   # made once: a compiled step sees constants
        self.each = [(self.weights[0][c], self.weights[1][c]) for c in range(len(candidates))]   # ... alone
        self.choice = self.plain          # the host's index of the strength re-drafts use: plain until evidence

    @property
    def accumulators(self) -> tuple[Tensor, Tensor]:
        """The device tensors `observe` adds into."""
        return self.score, self.count

    @property
    def best(self) -> Tensor:
        """Index of the strength with the best score so far; strength 0 (plain drafting) until there is evidence."""
        return torch.where(self.count == 0, self.plain, self.score.argmax())

    def choose(self, best: int) -> None:
        """The strength later re-drafts use (`best`, read back by the loop after an audit)."""
        self.choice = best

    def chosen(self) -> tuple[float, tuple[Tensor, Tensor]]:
        """The strength re-drafts use, and its weights (`strength_weights`, made once)."""
        return self.strengths[self.choice], self.each[self.choice]

    def observe(self, p: Tensor, history: History, fused: Tensor) -> Tensor:
        """p [B, w, V]: the targets the window's first w drafts were just verified against; history their
        History (before this observation), fused [B, w] the verified fused drafts -> every candidate's
        acceptance sum(min(p, q_c)) [C, B, w], added into the scores where fused.

        The drafts were fused from the last observation (history.prev), the history after it (pbar, growth)
        and the one before it, which the mean's update gives back: pbar = beta pbar_before + (1 - beta) prev.
        (A slot's history changes only when it is observed, and every observed slot is re-drafted.)"""
        beta = self.vp.beta
        before = ((history.pbar - (1 - beta) * history.prev) / beta).clamp_min(0)
        candidates = fuse_many(history.prev, before, history.pbar, history.growth, fused, self.vp, self.strengths,
                               self.weights)
        accept = overlap(p, candidates)                                                # [C, B, w]
        self.score += accept.mul(fused).sum((1, 2))
        self.count += fused.sum()
        return accept

    def summary(self) -> dict:
        rates = (self.score / self.count.clamp_min(1)).tolist()
        return {"vp_auto_strength": self.strengths[int(self.best)],
                "vp_auto_rates": {str(c): round(r, 4) for c, r in zip(self.strengths, rates)}}
