"""Verification Prediction (Shan et al. 2026, "SJD-VP"): drafts informed by probability history.

Every not-yet-committed position keeps, across the Jacobi iterations that scored it, an exponentially
weighted average of its target probabilities pbar, its previous observation, and per token a count of
consecutive increases. When a carried position is re-drafted from its new target p, VP samples from
    log p'(v) = log p(v) + lambda * M(v) * S(v)  on the top-k_vp candidates of p, renormalised,
with S = clip(log p - log pbar_prev, 0, s_max) and M(v) = 1 iff p(v) rose in each of the last N
observations. The draft is stored with q = p', so the exact verifier stays lossless. Histories are kept
per window slot, aligned with the draft positions, and shifted as the window slides.
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from .settings import VPSettings

EPS = 1e-10


def shift_slots(t: Tensor, shift: Tensor, width: int, fill=0) -> Tensor:
    """Per row b, new slot s <- old slot shift[b] + s (fill where that runs past the old slots).
    t [B, S_old, ...] -> [B, width, ...]."""
    B, S_old = t.shape[:2]
    idx = shift[:, None] + torch.arange(width, device=t.device)              # [B, width]
    valid = idx < S_old
    idx = idx.clamp(max=S_old - 1).view(B, width, *([1] * (t.dim() - 2))).expand(B, width, *t.shape[2:])
    out = t.gather(1, idx)
    mask = valid.view(B, width, *([1] * (t.dim() - 2)))
    return torch.where(mask, out, torch.full_like(out, fill))


class History:
    """Probability history of the window's undecided positions: slots [B, S] with S = W - 1."""

    def __init__(self, batch: int, slots: int, vocab: int, device):
        self.pbar = torch.zeros(batch, slots, vocab, device=device)
        self.prev = torch.zeros(batch, slots, vocab, device=device)
        self.growth = torch.zeros(batch, slots, vocab, dtype=torch.int16, device=device)
        self.seen = torch.zeros(batch, slots, dtype=torch.long, device=device)

    def padded(self, width: int) -> "History":
        """A view with `width` slots (extra slots empty), to align with a window's observations."""
        out = History.__new__(History)
        pad = width - self.seen.shape[1]
        out.pbar, out.prev, out.growth = (torch.nn.functional.pad(t, (0, 0, 0, pad))
                                          for t in (self.pbar, self.prev, self.growth))
        out.seen = torch.nn.functional.pad(self.seen, (0, pad))
        return out

    def observe(self, p: Tensor, observed: Tensor, beta: float) -> Tensor:
        """Fold observations p [B, S, V] into observed slots [B, S]; return the new growth counts."""
        seen = (self.seen > 0)[..., None]
        rose = seen & (p > self.prev)
        growth = torch.where(rose, self.growth + 1, torch.zeros_like(self.growth))
        pbar = torch.where(seen, beta * self.pbar + (1 - beta) * p, p)
        obs = observed[..., None]
        self.growth = torch.where(obs, growth, self.growth)
        self.pbar = torch.where(obs, pbar, self.pbar)
        self.prev = torch.where(obs, p, self.prev)
        self.seen = self.seen + observed.long()
        return growth

    def shift(self, shift: Tensor, width: int) -> "History":
        out = History.__new__(History)
        out.pbar, out.prev, out.growth, out.seen = (shift_slots(t, shift, width)
                                                    for t in (self.pbar, self.prev, self.growth, self.seen))
        return out


def fuse(p: Tensor, pbar_prev: Tensor, growth: Tensor, eligible: Tensor, s: VPSettings) -> Tensor:
    """p [B, S, V] -> p' [B, S, V]. pbar_prev is the history before this observation, growth the
    counts after it; eligible [B, S] marks slots that may be fused (history, not forced).

    strength > 0: the paper's extrapolation, boosting tokens that kept rising by their log gain.
    strength < 0: shrinkage toward the history, log p' = (1 - a) log p + a log pbar with a = |strength|
    (capped at 1) and pbar the history including this observation; it helps where probabilities
    mean-revert across iterations. Either way p' stays inside p's support. ("auto" is AutoStrength's.)"""
    if s.auto:
        raise ValueError("fuse() needs a numeric strength; strength='auto' is chosen per run by AutoStrength")
    return fuse_many(p, pbar_prev, growth, eligible, s, [s.strength])[0]


def fuse_many(p: Tensor, pbar_prev: Tensor, growth: Tensor, eligible: Tensor, s: VPSettings,
              strengths: Sequence[float]) -> Tensor:
    """fuse() for several strengths at once (the other knobs from s) -> [C, B, S, V]; the top-k, the
    log-gain score and the shrink direction are computed once for all of them."""
    k = min(s.top_k, p.shape[-1])
    kth = p.topk(k, dim=-1).values[..., -1:]
    fused = (p >= kth) & (p > 0) & eligible[..., None]
    logp = torch.log(p).masked_fill(p <= 0, float("-inf"))
    zero = torch.zeros((), device=p.device)
    boost = shrink = None
    if any(c > 0 for c in strengths):
        score = (torch.log(p + EPS) - torch.log(pbar_prev + EPS)).clamp(0, s.max_score)
        boost = torch.where(fused & (growth >= s.growth_steps), score, zero)
    if any(c < 0 for c in strengths):
        pbar = s.beta * pbar_prev + (1 - s.beta) * p
        shrink = torch.where(fused, torch.log(pbar + EPS) - logp.clamp_min(-1e30), zero)
    out = []
    for c in strengths:
        if c == 0:
            out.append(p)
        else:
            out.append((logp + (c * boost if c > 0 else min(1.0, -c) * shrink)).softmax(-1))
    return torch.stack(out)


class AutoStrength:
    """VP's "auto" mode: keeps the strength (among AUTO_STRENGTHS) whose drafts would have passed
    verification most often so far in this run, scored off-policy on every verified VP draft.

    Once the new target p of a drafted position is known, the exact verifier's acceptance probability
    of a draft from candidate c is sum(min(p, q_c)); that is also the expected acceptance under coupled
    drafting, whose noise at a position is independent of both p and q_c (scoring the draft each
    candidate would have made with the realised noise has the same mean and more variance). No
    exploration is needed, and the choice is lossless: it only depends on positions that verification
    has already committed, never on the randomness of drafts still waiting."""

    def __init__(self, vp: VPSettings, candidates: tuple[float, ...]):
        self.vp, self.strengths = vp, candidates
        self.score = torch.zeros(len(candidates), dtype=torch.float64)
        self.count = 0
        self.q: Tensor | None = None        # [C, B, S, V] candidates behind the current drafts

    @property
    def best(self) -> int:
        """Index of the strength to draft with; strength 0 (plain drafting) until there is evidence."""
        if self.count == 0:
            return self.strengths.index(0.0) if 0.0 in self.strengths else 0
        return int(self.score.argmax())

    def fuse(self, p: Tensor, pbar_prev: Tensor, growth: Tensor, eligible: Tensor, redraw: Tensor,
             shift: Tensor) -> Tensor:
        """Every candidate's fused distribution for the slots being re-drafted (redraw [B, S]; the
        other slots keep theirs, shifted with the window by `shift`); returns the chosen one."""
        new = fuse_many(p, pbar_prev, growth, eligible, self.vp, self.strengths)
        old = torch.zeros_like(new) if self.q is None else \
            torch.stack([shift_slots(q, shift, p.shape[1]) for q in self.q])
        self.q = torch.where(redraw[None, ..., None], new, old)   # slots not scored now hold no target
        return new[self.best]

    def observe(self, p: Tensor, verified: Tensor) -> None:
        """p [B, w, V]: the targets the drafts in slots [B, w] were just verified against; verified
        [B, w] marks verified VP drafts."""
        if self.q is None or not bool(verified.any()):
            return
        accept = torch.minimum(p, self.q[:, :, :p.shape[1]]).sum(-1)                  # [C, B, w]
        self.score += torch.where(verified, accept, 0.0).sum((1, 2)).double().cpu()
        self.count += int(verified.sum())

    def summary(self) -> dict:
        rates = (self.score / max(1, self.count)).tolist()
        return {"vp_auto_strength": self.strengths[self.best],
                "vp_auto_rates": {str(c): round(r, 4) for c, r in zip(self.strengths, rates)}}
