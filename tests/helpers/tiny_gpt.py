"""A tiny causal transformer on the engine's StaticKVCache, wrapped as an adapter: class-token
prefix, null class for CFG, a raster layout with row ends. Random weights; for cache and loop
tests."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from sjdvp_core.engine.adapter import ModelAdapter, TokenLayout
from sjdvp_core.models.kv_cache import StaticKVCache, causal_mask


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.n1, self.n2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.cache = None

    def forward(self, x, positions, mask):
        B, W, C = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, W, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        if self.cache is not None:
            k, v = self.cache.update(positions, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(y.transpose(1, 2).reshape(B, W, C))
        return x + self.mlp(self.n2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=12, classes=3, dim=32, heads=4, layers=2, max_len=64):
        super().__init__()
        self.tok, self.cls = nn.Embedding(vocab, dim), nn.Embedding(classes + 1, dim)  # last = null
        self.pos = nn.Embedding(max_len, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)
        self.max_len, self.heads, self.dim = max_len, heads, dim

    def setup_caches(self, rows):
        for b in self.blocks:
            b.cache = StaticKVCache(rows, self.heads, self.max_len, self.dim // self.heads)

    def forward(self, x, positions, cached=True):
        """x [R, W, C] embeddings at absolute positions [R, W]."""
        h = x + self.pos(positions)
        mask = (
            causal_mask(positions, self.max_len)
            if cached
            else positions[:, None, :, None] >= positions[:, None, None, :]
        )
        for b in self.blocks:
            cache, b.cache = b.cache, (b.cache if cached else None)
            h = b(h, positions, mask)
            b.cache = cache
        return self.head(h)


class TinyGPTAdapter(ModelAdapter):
    """Prefix: one class token at position 0; generated position j sits at absolute j + 1. No draft
    trees (the base class says so)."""

    family = "tiny GPT"

    def __init__(self, height=3, width=4, seed=0):
        torch.manual_seed(seed)
        self.model = self.module = TinyGPT().eval()
        self.device = torch.device("cpu")
        self.layout = TokenLayout.raster(torch.arange(2, 12), height, width, row_end=1, suffix=[0])

    def start(self, conditions, negatives, cfg, scratch=0):
        null = self.model.cls.num_embeddings - 1
        classes = list(conditions) + ([null] * len(conditions) if cfg else [])
        self.model.setup_caches(len(classes))
        x = self.model.cls(torch.tensor(classes))[:, None]
        logits = self.model(x, torch.zeros(len(classes), 1, dtype=torch.long))
        return self.layout, logits[:, 0]

    def forward(self, tokens, positions):
        return self.model(self.model.tok(tokens), positions + 1)

    def decode_image(self, codes):
        return codes[..., None].float().expand(*codes.shape, 3) / 10
