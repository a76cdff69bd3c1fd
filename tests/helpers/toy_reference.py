"""Independent references on the toy model: plain AR decoding by full recompute, and the exact
distribution over all sequences by enumeration; and the VP settings the law tests on it share."""

from __future__ import annotations

import itertools

import torch

from benchmarks.toy import ToyGridAdapter

# VP that fuses often on the toys' few codes (a single rise is enough, the top 4 are candidates), so
# its drafts are far from q: a law test with it catches a verifier that does not use the fused q
STRONG_VP = dict(growth_steps=1, top_k=4, beta=0.5)


def mixed_image_logits(toy: ToyGridAdapter, tokens, cls, cfg_scale):
    """Image-token logits [N, L, K] (codebook order) for every position, CFG mixed."""
    n = tokens.shape[0]
    cond = toy.full_logits(tokens, toy.colours([cls] * n))[..., toy.image_tokens]
    if cfg_scale == 1.0:
        return cond
    uncond = toy.full_logits(tokens, toy.colours([None] * n))[..., toy.image_tokens]
    return uncond + cfg_scale * (cond - uncond)


def image_probs(logits, top_k=0, temperature=1.0, greedy=False, top_p=1.0):
    if greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    logits = logits / temperature
    if top_k:
        kth = logits.topk(top_k, -1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:  # keep tokens, most likely first, until the kept mass exceeds top_p
        ranked, order = probs.sort(-1, descending=True)
        before = ranked.cumsum(-1) - ranked
        ranked = torch.where(before > top_p, 0.0, ranked)
        probs = torch.zeros_like(probs).scatter(-1, order, ranked)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def ar_greedy(toy: ToyGridAdapter, cls, cfg_scale=1.0):
    """Greedy AR by full recompute: [L] vocabulary ids."""
    forced = toy.layout.forced
    tokens = torch.where(forced >= 0, forced, 0)[None].clone()
    for j in range(toy.layout.length):
        if forced[j] < 0:
            logits = mixed_image_logits(toy, tokens, cls, cfg_scale)[0, j]
            tokens[0, j] = toy.image_tokens[logits.argmax()]
    return tokens[0]


def exact_distribution(toy: ToyGridAdapter, cls, cfg_scale=1.0, top_k=0, top_p=1.0):
    """All image-code sequences [N, cells] and their exact probabilities [N]."""
    K, cells = toy.image_tokens.numel(), toy.layout.grid.numel()
    codes = torch.tensor(list(itertools.product(range(K), repeat=cells)))
    forced = toy.layout.forced
    tokens = torch.where(forced >= 0, forced, 0).expand(codes.shape[0], -1).clone()
    grid = toy.layout.grid.flatten()
    tokens[:, grid] = toy.image_tokens[codes]
    # logits at position j come from full_logits(... )[:, j] (the toy predicts position j directly)
    probs = image_probs(mixed_image_logits(toy, tokens, cls, cfg_scale), top_k, top_p=top_p)
    per_cell = probs[:, grid].gather(-1, codes[..., None]).squeeze(-1)
    return codes, per_cell.prod(-1)


def chi2_pvalue(counts, expected, min_expected=5.0):
    """Pearson chi-square goodness of fit, pooling cells with small expectation."""
    small = expected < min_expected
    obs = torch.cat([counts[~small], counts[small].sum()[None]]).double()
    exp = torch.cat([expected[~small], expected[small].sum()[None]]).double()
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.double), stat / 2))


def code_index(codes, K):
    """[N, cells] codes -> [N] index into the enumeration order of exact_distribution."""
    weights = K ** torch.arange(codes.shape[1] - 1, -1, -1)
    return (codes * weights).sum(-1)
