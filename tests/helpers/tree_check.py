"""The check every adapter's tree forward must pass: a draft tree scored in one forward gives, node
for node, the logits of the chain forwards along each of its branches, and after adopt() the
accepted branch's cache entries are where a chain forward would have written them."""

from __future__ import annotations

import torch

from sjdvp_core import TreeSettings
from sjdvp_core.engine.tree import tree_shape


def branch_paths(shape) -> list[list[int]]:
    """Each leaf's path from node 0 (the nodes it attends to, in order)."""
    anc = shape.ancestors
    leaves = [i for i in range(shape.nodes) if not anc[i + 1 :, i].any()]
    return [anc[i].nonzero().flatten().tolist() for i in leaves]


TREE = TreeSettings(width=3, depth=2)


@torch.inference_mode()
def assert_tree_matches_chains(
    adapter, prompts, cfg: bool, w: int = 5, tree=TREE, seed: int = 0, atol: float = 1e-4
) -> None:
    g = torch.Generator().manual_seed(seed)
    shape = tree_shape(w, tree, "cpu")
    layout, first = adapter.start(prompts, None, cfg, scratch=shape.nodes - w)
    R, K = first.shape[0], layout.image_tokens.numel()

    def image_tokens(*size):
        return layout.image_tokens[torch.randint(0, K, size, generator=g)]

    # a committed prefix of a different length per row, written by one chain forward
    start = torch.arange(R) % 3 + 1
    prefix = image_tokens(R, int(start.max()) + 1)
    adapter.forward(prefix, torch.arange(prefix.shape[1]).expand(R, -1))
    tokens = image_tokens(R, shape.nodes)
    positions = (start - 1)[:, None] + shape.offsets.to(torch.long)
    tokens[:, 0] = prefix.gather(1, (start - 1)[:, None])[:, 0]  # node 0: the last committed token
    logits = adapter.forward_tree(tokens, positions, shape.ancestors, w)
    for path in branch_paths(shape):
        chain = adapter.forward(tokens[:, path], positions[:, path])
        assert torch.allclose(logits[:, path], chain, atol=atol), path
    # adopt a branch: the next token scored after it sees the branch as a chain would
    path = branch_paths(shape)[-1]
    adapter.forward_tree(tokens, positions, shape.ancestors, w)
    adapter.adopt(tokens, positions, w, torch.tensor(path).expand(R, -1))
    nxt = image_tokens(R, 1)
    after = adapter.forward(nxt, positions[:, path[-1:]] + 1)
    full = adapter.forward(
        torch.cat([tokens[:, path], nxt], 1),
        torch.cat([positions[:, path], positions[:, path[-1:]] + 1], 1),
    )
    assert torch.allclose(after[:, 0], full[:, -1], atol=atol)
    adapter.finish()
