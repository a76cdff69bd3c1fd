"""A toy image model whose exact distribution is computable: the engine's test bench.

Tokens are codes on a levels x levels lattice of colours in [0, 1]^2 (the "codebook"). A cell's
next- token logits are -sharpness * |e_v - mu|^2 plus a fixed random per-cell bias, where mu blends
the codes of the cell to the left and above with the class's colour. So nearby codes are similar
(LANTERN's and GSD's premise), there is real context dependence, and rows end with a forced row-end
token and the image with an end-of-image token, like the real families. The "cache" is the token
buffer, written by position, so rollback behaves as in a static KV cache."""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from sjdvp_core.engine.adapter import ModelAdapter, TokenLayout
from sjdvp_core.engine.settings import SamplingSettings

ROW_END, END_OF_IMAGE = 0, 1


class ToyGridAdapter(ModelAdapter):
    family = "toy"
    example_condition = 0
    trees = True

    def __init__(
        self,
        height: int = 4,
        width: int = 4,
        levels: int = 4,
        *,
        row_end: bool = True,
        sharpness: float = 12.0,
        num_classes: int = 4,
        noise: float = 0.5,
        seed: int = 0,
        device: str = "cpu",
    ):
        self.device = torch.device(device)
        self.h, self.w, self.sharpness = height, width, sharpness
        g = torch.Generator().manual_seed(seed)
        axis = torch.linspace(0, 1, levels)
        self._codebook = torch.stack(torch.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
        K = self._codebook.shape[0]
        # vocabulary: 0 row end, 1 end of image, then the K codes in a shuffled order
        self.image_tokens = 2 + torch.randperm(K, generator=g)
        self.vocab_size = K + 2
        self.layout = TokenLayout.raster(
            self.image_tokens,
            height,
            width,
            row_end=ROW_END if row_end else None,
            suffix=[END_OF_IMAGE],
        )
        self.class_colours = torch.rand(num_classes, 2, generator=g)
        self.bias = noise * torch.randn(self.layout.length + 1, K, generator=g)
        L = self.layout.length
        cell_of = torch.full((L + 1,), -1, dtype=torch.long)
        cell_of[self.layout.grid.flatten()] = torch.arange(height * width)
        rows, cols = cell_of.div(width, rounding_mode="floor"), cell_of % width
        self.left = torch.where(
            (cell_of >= 0) & (cols > 0), self.layout.grid.flatten()[(cell_of - 1).clamp(0)], -1
        )
        self.up = torch.where(
            (cell_of >= 0) & (rows > 0), self.layout.grid.flatten()[(cell_of - width).clamp(0)], -1
        )
        self.code_of = torch.full((self.vocab_size,), -1, dtype=torch.long)
        self.code_of[self.image_tokens] = torch.arange(K)
        self._buffer = None
        self._colour = None
        self.module = self.image_decoder = torch.nn.Module()  # no weights to move
        self.default_sampling = SamplingSettings(cfg_scale=2.0, top_k=20)

    # --- the model -----------------------------------------------------------------------------
    def logits_for(self, buffer: Tensor, targets: Tensor, colour: Tensor) -> Tensor:
        """Logits [R, W, V] for target positions [R, W], reading neighbours from buffer [R, L]."""
        emb = self._codebook

        def neighbour(table):
            pos = table[targets.clamp(max=self.layout.length)]
            code = self.code_of[buffer.gather(1, pos.clamp(min=0))]
            ok = (pos >= 0) & (code >= 0)
            return torch.where(ok[..., None], emb[code.clamp(min=0)], 0.0), ok.float()[..., None]

        (el, wl), (eu, wu) = neighbour(self.left), neighbour(self.up)
        mu = (el * wl + eu * wu + colour[:, None]) / (wl + wu + 1)
        d2 = ((emb[None, None] - mu[:, :, None]) ** 2).sum(-1)  # [R, W, K]
        image = -self.sharpness * d2 + self.bias[targets.clamp(max=self.layout.length)]
        out = torch.zeros(*targets.shape, self.vocab_size)
        out[..., self.image_tokens] = image
        return out

    def full_logits(self, tokens: Tensor, colour: Tensor) -> Tensor:
        """Reference recompute: logits [B, L, V] for every position given the whole sequence."""
        targets = torch.arange(self.layout.length).expand(tokens.shape[0], -1)
        return self.logits_for(tokens, targets, colour)

    def colours(self, conditions: Sequence[Any]) -> Tensor:
        """Class id -> its colour; None -> the mean colour (the unconditional branch)."""
        mean = self.class_colours.mean(0)
        return torch.stack([mean if c is None else self.class_colours[int(c)] for c in conditions])

    # --- the adapter interface -----------------------------------------------------------------
    def start(self, conditions, negatives, cfg: bool, scratch: int = 0):
        rows = (
            list(conditions)
            + (list(negatives) if negatives is not None else [None] * len(conditions)) * cfg
        )
        self._colour = self.colours(rows)
        self._buffer = torch.zeros(len(rows), self.layout.length + 1, dtype=torch.long)
        first = self.logits_for(
            self._buffer, torch.zeros(len(rows), 1, dtype=torch.long), self._colour
        )
        return self.layout, first[:, 0]

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        self._buffer.scatter_(1, positions, tokens)
        return self.logits_for(self._buffer, positions + 1, self._colour)

    def forward_tree(
        self, tokens: Tensor, positions: Tensor, ancestors: Tensor, chain: int
    ) -> Tensor:
        """By recompute: every node reads its own copy of the buffer with its ancestors written in
        (a tree's ancestors cover every position from the first node's to the node's own)."""
        R, N = tokens.shape
        self._buffer.scatter_(1, positions[:, :chain], tokens[:, :chain])
        L1 = self._buffer.shape[1]
        # [R, N, L + 2]
        own = torch.cat([self._buffer, self._buffer[:, :1]], 1)[:, None].repeat(1, N, 1)
        # node j's token at its position in the buffer of every node it is an ancestor of (others: a
        # spare column)
        at = torch.where(ancestors[None], positions[:, None, :], L1)  # [R, N, N]
        own.scatter_(2, at, tokens[:, None, :].expand(R, N, N))
        own = own[..., :L1]
        logits = self.logits_for(
            own.flatten(0, 1), (positions + 1).reshape(-1, 1), self._colour.repeat_interleave(N, 0)
        )
        return logits.view(R, N, -1)

    def adopt(self, tokens: Tensor, positions: Tensor, chain: int, nodes: Tensor) -> None:
        self._buffer.scatter_(1, positions.gather(1, nodes), tokens.gather(1, nodes))

    def cache_bytes(
        self, rows: int, scratch: int = 0, prompt: int | None = None, itemsize: int | None = None
    ) -> int:
        return rows * (self.layout.length + 1) * 8

    def codebook(self) -> Tensor:
        return self._codebook

    def decode_image(self, codes: Tensor, pixels=None, cell: int = 8) -> Tensor:
        e = self._codebook[codes.cpu()]  # [B, h, w, 2]
        rgb = torch.stack([e[..., 0], e[..., 1], 1 - (e[..., 0] + e[..., 1]) / 2], -1)
        return rgb.repeat_interleave(cell, 1).repeat_interleave(cell, 2)


class ToyTrendAdapter(ToyGridAdapter):
    """A toy with other Jacobi dynamics: each cell is pulled toward the mean code of the previous
    `reach` cells, a long context that converges gradually as the prefix is committed, so a
    draft's probability tends to keep drifting the way it went (mild momentum) where the grid
    toy's, like the demo model's, jitters back (mean reversion). Used to show VP's auto strength
    choosing differently per model."""

    def __init__(self, reach: int = 48, **kw):
        super().__init__(**kw)
        self.reach = reach
        self.default_sampling = SamplingSettings()

    def logits_for(self, buffer: Tensor, targets: Tensor, colour: Tensor) -> Tensor:
        emb = self._codebook
        pos = targets[..., None] - 1 - torch.arange(self.reach)  # [R, W, reach]
        code = self.code_of[buffer.gather(1, pos.clamp(min=0).flatten(1)).view_as(pos)]
        ok = (pos >= 0) & (code >= 0)
        e = torch.where(ok[..., None], emb[code.clamp(min=0)], 0.0)
        mu = (e.sum(2) + colour[:, None]) / (ok.sum(2, keepdim=True) + 1)
        image = (
            -self.sharpness * ((emb[None, None] - mu[:, :, None]) ** 2).sum(-1)
            + self.bias[targets.clamp(max=self.layout.length)]
        )
        out = torch.zeros(*targets.shape, self.vocab_size)
        out[..., self.image_tokens] = image
        return out
