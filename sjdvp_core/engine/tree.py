"""Draft trees: several candidates at the window's weakest slots, all scored in one forward pass.

At the first `depth` slots the window holds `width` candidates: the draft, spatial guesses (the
cells left of and above it, ours), further draws from q without replacement (Gumbel-top-k with the
coupling noise, as Kool et al. 2019 extend SCD's coupling to ranks). Trees at the weak slots follow
SJD-PAC (Kang et al., CVPR 2026, arXiv 2603.18599). Verification is recursive rejection sampling
(SpecInfer; Jeon et al.), exact: the proof is in docs/method.md, "Draft trees"."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor
from torch.nn import functional as F

from .drafting import gumbel_noise
from .settings import TreeSettings
from .target import residual, sample
from .verify import Verifier, accept, accept_uniforms, first_rejection
from .window import LocalLayout, Window, gather_slot


@dataclass(frozen=True)
class TreeShape:
    """The nodes one forward pass scores for a window of w. Node 0 is the last committed token and
    node i (1 <= i < w) the draft of slot i - 1: the main chain, at offsets 0 .. w - 1 from the
    last committed position. Then, for each branching slot j < levels and alternative a < alts, a
    block: the alternative at slot j (offset j + 1, child of main node j), then the drafts of
    slots j + 1, j + 2, ... (a chain)."""

    w: int
    levels: int  # branching slots
    alts: int  # alternatives per branching slot (width - 1)
    source: (
        Tensor  # [N] where each node's token comes from, in cat([committed, drafts, alternatives])
    )
    offsets: Tensor  # [N] position offset from the last committed token
    ancestors: Tensor  # [N, N] bool: node i attends to node j (itself included)
    blocks: Tensor  # [levels, alts, Lmax] node ids of each block, padded with its last node
    length: Tensor  # [levels] nodes per block at each level

    @property
    def nodes(self) -> int:
        return self.source.numel()

    def to(self, device) -> "TreeShape":
        return TreeShape(
            self.w,
            self.levels,
            self.alts,
            *(
                t.to(device)
                for t in (self.source, self.offsets, self.ancestors, self.blocks, self.length)
            ),
        )


@lru_cache(maxsize=256)
def _shape(w: int, width: int, depth: int, branch: int) -> TreeShape:
    levels, alts = min(depth, w - 1), width - 1
    parent, offsets, source = [-1] + list(range(w - 1)), list(range(w)), list(range(w))
    lengths = [w - 1 - j if branch == 0 else min(w - 1 - j, 1 + branch) for j in range(levels)]
    blocks = torch.zeros(levels, alts, max(lengths, default=1), dtype=torch.long)
    for j in range(levels):
        for a in range(alts):
            first = len(parent)
            for t in range(lengths[j]):
                node = first + t
                parent.append(j if t == 0 else node - 1)
                offsets.append(j + 1 + t)
                # the alternative, then draft j + t
                source.append(w + j * alts + a if t == 0 else 1 + j + t)
                blocks[j, a, t:] = node
    N = len(parent)
    ancestors = torch.eye(N, dtype=torch.bool)
    for i in range(1, N):
        ancestors[i] |= ancestors[parent[i]]
    return TreeShape(
        w,
        levels,
        alts,
        torch.tensor(source),
        torch.tensor(offsets),
        ancestors,
        blocks,
        torch.tensor(lengths, dtype=torch.long),
    )


def tree_shape(w: int, tree: TreeSettings, device) -> TreeShape:
    return _shape_on(w, tree.width, tree.depth, tree.branch, str(device))


@lru_cache(maxsize=256)
def _shape_on(w, width, depth, branch, device) -> TreeShape:
    return _shape(w, width, depth, branch).to(device)


def scratch_nodes(window: int, tree: TreeSettings) -> int:
    """Cache slots a decode's trees need past the sequence (the nodes beyond the main chain)."""
    return (
        _shape(window, tree.width, tree.depth, tree.branch).nodes - window
        if tree.on and window > 1
        else 0
    )


@dataclass
class Candidates:
    """The alternatives at the branching slots: tokens [B, levels, alts], the distribution each was
    drawn from q [B, levels, alts, V], valid [B, levels, alts] (an invalid one is never accepted
    and leaves the residual as it is), guess [alts] whether it is a spatial guess."""

    tokens: Tensor
    q: Tensor
    valid: Tensor
    guess: Tensor


def propose(
    window: Window,
    canvas: Tensor,
    n: Tensor,
    local: LocalLayout,
    shape: TreeShape,
    guesses: bool,
    same_noise: bool,
    gen: torch.Generator,
) -> Candidates:
    """The alternatives to each branching slot's draft. canvas holds the committed tokens and the
    drafts from n on. same_noise: the drafts are the argmax of log q + the window's noise
    (coupled drafting as drawn), so further draws continue that ranking; otherwise they use fresh
    noise."""
    L, dev = shape.levels, n.device
    B, V = n.shape[0], local.size
    q0, x0 = window.q[:, :L], window.tokens[:, :L]
    positions = n[:, None] + torch.arange(L, device=dev)
    taken = F.one_hot(x0, V).bool()
    tokens, qs, valid = [], [], []
    sources = (local.left, local.above)[: shape.alts] if guesses else ()
    free = local.forced_at(positions) < 0
    for table in sources:  # a cell's neighbours are committed or drafts on the path before it
        src = table[positions]
        y = canvas.gather(1, src.clamp_min(0))
        ok = free & (src >= 0) & (y < local.num_image) & ~taken.gather(-1, y[..., None])[..., 0]
        taken |= F.one_hot(y, V).bool() & ok[..., None]
        tokens.append(y), qs.append(F.one_hot(y, V).float()), valid.append(ok)
    draws = shape.alts - len(tokens)
    if draws:
        noise = window.noise[:, :L] if same_noise else gumbel_noise((B, L, V), gen, dev)
        scores = (torch.log(q0).to(noise.dtype) + noise).masked_fill(taken, float("-inf"))
        top = scores.topk(draws, dim=-1)
        for i in range(draws):
            y = top.indices[..., i]
            rest = q0.masked_fill(taken, 0.0)
            mass = rest.sum(-1, keepdim=True)
            (
                tokens.append(y),
                qs.append(rest / mass.clamp_min(1e-30)),
                valid.append(top.values[..., i].isfinite()),
            )
            taken |= F.one_hot(y, V).bool()
    guess = torch.arange(shape.alts, device=dev) < len(sources)
    return Candidates(torch.stack(tokens, -1), torch.stack(qs, 2), torch.stack(valid, -1), guess)


def tree_inputs(committed: Tensor, drafts: Tensor, cand: Candidates, shape: TreeShape) -> Tensor:
    """Tokens [B, N] of the tree's nodes: committed [B] last committed token, drafts [B, >= w -
    1]."""
    pool = torch.cat([committed[:, None], drafts[:, : shape.w - 1], cand.tokens.flatten(1)], 1)
    return pool[:, shape.source]


@dataclass
class TreeOutcome:
    # [B] draft slots accepted along the path (an accepted alternative counts as its slot's)
    k: Tensor
    next: Tensor  # [B] the token after them
    # [B, d] each slot's draft accepted on the path taken (not one an alternative replaced)
    accepted: Tensor
    tried: Tensor  # [B] the draft at a branching slot was rejected: alternatives were tried
    took: Tensor  # [B] an alternative was accepted
    level: Tensor  # [B] its slot
    choice: Tensor  # [B] which alternative
    path: Tensor  # [B, w] the node whose target judges each slot on the path taken
    branch: Tensor  # [B, Lmax] the accepted alternative's block (node 0 where none)


def verify_tree(
    drafts: Tensor,
    q: Tensor,
    p: Tensor,
    cand: Candidates,
    shape: TreeShape,
    limit: Tensor,
    verifier: Verifier,
    gen: torch.Generator,
) -> TreeOutcome:
    """The accept step over a tree. drafts [B, d] with q [B, d, V] (d = w - 1), targets p [B, N, V]
    of every node (p[:, i] is the distribution of the position after node i), at most limit[b]
    slots acceptable. The main chain is verified by `accept`; where it stops at a branching slot
    the alternatives are tried in order against the recursive residual; an accepted one continues
    as a chain (accept again) against its own block's targets. See the module docstring for why
    it is exact."""
    B, d = drafts.shape
    dev, w = drafts.device, shape.w
    k, nxt, accepted = accept(
        drafts, q, p[:, :w], limit, verifier, *accept_uniforms(B, d, gen, dev)
    )
    # every level's alternatives, tested against the residual left by the draft and the earlier ones
    r = residual(p[:, : shape.levels], q[:, : shape.levels])
    hits = []
    for a in range(shape.alts):
        xa, qa, ok = cand.tokens[..., a], cand.q[:, :, a], cand.valid[..., a]
        u = torch.rand(ok.shape, generator=gen, device=dev)
        hits.append(ok & (u < verifier.accept_prob(r, qa, xa)))
        r = torch.where(ok[..., None], residual(r, qa), r)
    level = k.clamp(max=shape.levels - 1)
    # first accepted, or alts
    choice = first_rejection(~torch.stack(hits, -1)).gather(1, level[:, None])[:, 0]
    at_level = (k < shape.levels) & (k < limit)
    took = at_level & (choice < shape.alts)
    branch = shape.blocks[level, choice.clamp(max=shape.alts - 1)]  # [B, Lmax]
    # the accepted alternative's chain: drafts of slots level + 1 .. against its block's targets
    slots = (level + 1)[:, None] + torch.arange(branch.shape[1] - 1, device=dev)
    x_b = drafts.gather(1, slots.clamp(max=d - 1))
    q_b = q.gather(1, slots.clamp(max=d - 1)[..., None].expand(-1, -1, q.shape[-1]))
    limit_b = torch.minimum(limit - level - 1, shape.length[level] - 1).clamp_min(0)
    k_b, nxt_b, _ = accept(
        x_b,
        q_b,
        p.gather(1, branch[..., None].expand(-1, -1, p.shape[-1])),
        limit_b,
        verifier,
        *accept_uniforms(B, x_b.shape[1], gen, dev),
    )
    rest = sample(gather_slot(r, level), gen)  # none accepted
    k = torch.where(took, level + 1 + k_b, k)
    nxt = torch.where(took, nxt_b, torch.where(at_level, rest, nxt))
    slot = torch.arange(d, device=dev)
    # the draft at the branching slot was rejected (an alternative passed in its place); the chain's
    # drafts past it were verified against the alternative's block
    accepted = torch.where(took[:, None], (slot < k[:, None]) & (slot != level[:, None]), accepted)
    # the target of each slot on the path: the main chain's, and past an accepted alternative its
    # block's
    step = torch.arange(w, device=dev)[None] - level[:, None] - 1
    in_block = took[:, None] & (step >= 0) & (step < shape.length[level][:, None])
    path = torch.where(
        in_block, branch.gather(1, step.clamp(0, branch.shape[1] - 1)), torch.arange(w, device=dev)
    )
    return TreeOutcome(
        k, nxt, accepted, at_level, took, level, choice, path, torch.where(took[:, None], branch, 0)
    )
