"""The target distribution p: logits -> probabilities, vectorised over [B, W, V], in fp32.

Order: CFG mix -> structural forcing and image-vocabulary restriction (one additive mask) ->
temperature -> top-k -> top-p. Temperature comes before the truncations as in LlamaGen's sampler and
transformers' warpers (top-k is unaffected by the order; top-p is not, and this is the order those
models were tuned with). Each stage returns a new tensor. Greedy decoding turns p into a one-hot on
the argmax."""

from __future__ import annotations

import torch
from torch import Tensor

from .devices import wide_float
from .settings import SamplingSettings

NEG_INF = float("-inf")


def cfg_mix(logits: Tensor, s: SamplingSettings, groups: int) -> Tensor:
    """[groups * B, W, V] -> [B, W, V]. One group: as is. Two (cond, uncond): uncond + cfg *
    (cond - uncond). Three (full, part, uncond: an edit guided by the text and the reference apart,
    ShareGPT-4o-Image's Janus-4o): cond = (full + image_cfg * part) / (1 + image_cfg) first."""
    logits = logits.float()
    if groups == 1:
        return logits
    *conds, uncond = logits.chunk(groups, dim=0)
    cond = conds[0]
    if groups == 3:
        w = s.image_cfg_scale
        cond = (cond + w * conds[1]) / (1 + w)
    return uncond + s.cfg_scale * (cond - uncond)


def structure_mask(forced: Tensor, num_image: int, size: int) -> Tensor:
    """forced [...] local id or -1 -> [..., size] additive mask (0 kept, -inf dropped): a forced
    slot keeps only its token, a free slot only image tokens (local ids < num_image)."""
    vocab = torch.arange(size, device=forced.device)
    keep = torch.where(forced[..., None] >= 0, vocab == forced[..., None], vocab < num_image)
    return torch.zeros(keep.shape, device=forced.device).masked_fill(~keep, NEG_INF)


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = logits.topk(k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    """Keep the most likely tokens up to and including the first whose cumulative mass exceeds top_p
    (at least one), as LlamaGen's and transformers' nucleus filters do."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(-1)
    drop_sorted = (probs.cumsum(-1) - probs) > top_p  # mass before this token already exceeds top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, NEG_INF)


def process_logits(logits: Tensor, mask: Tensor, s: SamplingSettings) -> Tensor:
    """Mixed logits [B, W, V] and their structure_mask -> filtered logits: forcing and image
    restriction, temperature, top-k, top-p."""
    logits = logits + mask
    if s.greedy:
        return logits
    if s.temperature != 1.0:
        logits = logits / s.temperature
    return top_p_filter(top_k_filter(logits, s.top_k), s.top_p)


def target_probs(logits: Tensor, mask: Tensor, s: SamplingSettings) -> Tensor:
    """Mixed logits [B, W, V] and their structure_mask -> p [B, W, V] (fp32, rows sum to 1)."""
    logits = process_logits(logits, mask, s)
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return logits.softmax(-1)


def uniform(shape, generator: torch.Generator, device) -> Tensor:
    """Uniforms on [0, 1) for `draw`, through the run's generator, in the device's wide float."""
    return torch.rand(shape, generator=generator, device=device, dtype=wide_float(device))


def draw(probs: Tensor, u: Tensor) -> Tensor:
    """One draw per row of probs [..., V] by inverting its CDF at u [...] (uniforms, see `uniform`):
    the first token whose cumulative mass exceeds u times the row's total. A token of probability
    0 is never drawn, and the count stays below V: u < 1 puts u times the total (rounded) below
    the total. A pure function of its inputs, so the step that calls it can be compiled
    (torch.compile and CUDA graphs take no torch.Generator); the cumulative sum runs in u's dtype
    (float64 but on mps)."""
    cdf = probs.cumsum(-1, dtype=u.dtype)
    return (cdf <= u[..., None] * cdf[..., -1:]).sum(-1)


def sample(probs: Tensor, generator: torch.Generator) -> Tensor:
    """One draw per row of probs [..., V] -> [...], through the run's generator."""
    return draw(probs, uniform(probs.shape[:-1], generator, probs.device))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """norm(max(0, p - q)), the exact speculative-sampling residual. It inherits p's processing: its
    support lies inside p's (forced, image-only, top-k/top-p kept). Re-running top-k/top-p on it, as
    the SJD reference code does, would bias the output, so we don't. If p == q the residual is empty
    (rejection then has probability 0); fall back to p so no NaN can appear."""
    r = (p - q).clamp_min(0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, r / mass.clamp_min(1e-30), p)
