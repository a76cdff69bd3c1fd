"""LlamaGen's autoregressive transformer (Sun et al. 2024), written for this engine.

After "Autoregressive Model Beats Diffusion" (github.com/FoundationVision/LlamaGen): Llama-style
blocks behind a class or caption prefix, with 2D rotary embeddings. Module names follow the
official checkpoints, so their state dicts load by key; the KV cache is written by position
(sjdvp_core.models.kv_cache), so Jacobi rollback is free and batch rows may sit at different
positions. The blocks, the prefix and the RoPE layout: docs/families.md, "LlamaGen"."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..kv_cache import StaticKVCache, additive_mask, tree_mask, window_mask
from ..placement import weights_device


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass
class GPTConfig:
    dim: int = 768
    n_layer: int = 12
    n_head: int = 12
    n_kv_head: int | None = None
    multiple_of: int = 256  # SwiGLU hidden size is rounded up to this
    ffn_dim_multiplier: float | None = None
    ffn_dim: int | None = (
        None  # explicit SwiGLU hidden size (read off a checkpoint); overrides the above
    )
    rope_base: float = 10000.0
    norm_eps: float = 1e-5
    model_type: str = "c2i"  # c2i: class prefix; t2i: T5 caption prefix
    num_classes: int = 1000  # c2i; the embedding has one more row, the null class
    caption_dim: int = 2048  # t2i: FLAN-T5-XL hidden size
    cls_token_num: int = 1  # prefix length: 1 (c2i) or 120 (t2i)
    vocab_size: int = 16384  # VQ codebook size
    block_size: int = 256  # image tokens, a perfect square
    dropout: float = 0.0  # training only (token, residual and FFN dropout)

    def __post_init__(self):
        if self.model_type not in ("c2i", "t2i"):
            raise ValueError(f"model_type={self.model_type!r} must be 'c2i' or 't2i'")
        if math.isqrt(self.block_size) ** 2 != self.block_size:
            raise ValueError(
                f"block_size={self.block_size} must be a perfect square (the token grid)"
            )
        if self.dim % self.n_head or (self.dim // self.n_head) % 4:
            raise ValueError(
                f"dim={self.dim} / n_head={self.n_head} must give a head size divisible by 4"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_kv_head or self.n_head

    @property
    def grid(self) -> int:
        return math.isqrt(self.block_size)

    @property
    def ffn_hidden(self) -> int:
        if self.ffn_dim is not None:
            return self.ffn_dim
        hidden = int(2 * 4 * self.dim / 3)
        if self.ffn_dim_multiplier is not None:
            hidden = int(self.ffn_dim_multiplier * hidden)
        return find_multiple(hidden, self.multiple_of)

    def to_dict(self) -> dict:
        return asdict(self)


# name -> (n_layer, n_head, dim), as released
GPT_SIZES = {
    "GPT-B": (12, 12, 768),
    "GPT-L": (24, 16, 1024),
    "GPT-XL": (36, 20, 1280),
    "GPT-XXL": (48, 24, 1536),
    "GPT-XXXL": (48, 40, 2560),
    "GPT-1B": (22, 32, 2048),
    "GPT-3B": (24, 32, 3200),
    "GPT-7B": (32, 32, 4096),
}


# --- condition embedders ----------------------------------------------------------------------
class LabelEmbedder(nn.Module):
    def __init__(self, num_classes: int, dim: int):
        super().__init__()
        self.num_classes = num_classes
        self.embedding_table = nn.Embedding(num_classes + 1, dim)  # last row: the null class

    def forward(self, labels: Tensor) -> Tensor:
        return self.embedding_table(labels)[:, None]  # [B, 1, C]


class CaptionMLP(nn.Module):
    def __init__(self, in_dim: int, dim: int):
        super().__init__()
        self.fc1 = nn.Linear(in_dim, dim, bias=False)
        self.fc2 = nn.Linear(dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class CaptionEmbedder(nn.Module):
    def __init__(self, caption_dim: int, dim: int, tokens: int):
        super().__init__()
        self.cap_proj = CaptionMLP(caption_dim, dim)
        self.register_buffer("uncond_embedding", torch.zeros(tokens, caption_dim))

    def forward(self, captions: Tensor) -> Tensor:
        return self.cap_proj(captions)  # [B, T, C]


# --- blocks -------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(
            x
        ) * self.weight


class FeedForward(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.w1 = nn.Linear(c.dim, c.ffn_hidden, bias=False)
        self.w3 = nn.Linear(c.dim, c.ffn_hidden, bias=False)
        self.w2 = nn.Linear(c.ffn_hidden, c.dim, bias=False)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.w2(F.silu(self.w1(x)) * self.w3(x)))


def apply_rope(x: Tensor, rope: Tensor) -> Tensor:
    """x [B, S, H, D]; rope [B, S, D/2, 2] (cos, sin) rotating interleaved pairs (x[2i], x[2i+1]):
    each pair times cos + i sin, one complex product: bit for bit the rotation in real ops, in a
    fifth of its time on the CPU (the demo's q and k at 16 tokens, 11 against 51 us)."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    turn = torch.view_as_complex(rope.float())[:, :, None]
    return torch.view_as_real(pairs * turn).flatten(-2).type_as(x)


def rope_table_2d(c: GPTConfig) -> Tensor:
    """[cls_token_num + grid^2, head_dim/2, 2]: per cell the first head_dim/4 pairs rotate by its
    row and the last head_dim/4 by its column. The prefix rows are (cos, sin) = (0, 0), as in the
    official code (its table is zero-padded): prefix queries and keys are zeroed, only their
    values count."""
    quarter = c.head_dim // 4
    freqs = 1.0 / (c.rope_base ** (torch.arange(quarter).float() * 2 / (c.head_dim // 2)))
    idx = torch.arange(c.grid).float()
    rows = (idx[:, None, None] * freqs).expand(c.grid, c.grid, quarter)
    cols = (idx[None, :, None] * freqs).expand(c.grid, c.grid, quarter)
    angles = torch.cat([rows, cols], -1).flatten(0, 1)  # [grid^2, head_dim/2]
    table = torch.stack([angles.cos(), angles.sin()], -1)
    return torch.cat([torch.zeros(c.cls_token_num, 2 * quarter, 2), table])


class Attention(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.c = c
        self.wqkv = nn.Linear(c.dim, (c.n_head + 2 * c.kv_heads) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.dim, c.dim, bias=False)
        self.drop = nn.Dropout(c.dropout)
        self.kv_cache: StaticKVCache | None = None

    def forward(self, x: Tensor, rope: Tensor, slots: Tensor | None, mask: Tensor | None) -> Tensor:
        B, S, _ = x.shape
        c, kv = self.c, self.c.kv_heads * self.c.head_dim
        qk, v = self.wqkv(x).split([c.dim + kv, kv], dim=-1)
        # q and k at once
        qk = apply_rope(qk.view(B, S, c.n_head + c.kv_heads, c.head_dim), rope).transpose(1, 2)
        q, k = qk.split([c.n_head, c.kv_heads], dim=1)  # [B, H, S, D]
        v = v.view(B, S, c.kv_heads, c.head_dim).transpose(1, 2)
        # the slots the mask covers: those written so far (see LlamaGenGPT.keys)
        if self.kv_cache is not None:
            k, v = (t[:, :, : mask.shape[-1]] for t in self.kv_cache.update(slots, k, v))
        if c.kv_heads != c.n_head:
            k = k.repeat_interleave(c.n_head // c.kv_heads, dim=1)
            v = v.repeat_interleave(c.n_head // c.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None)
        return self.drop(self.wo(y.transpose(1, 2).reshape(B, S, c.dim)))


class TransformerBlock(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.attention = Attention(c)
        self.feed_forward = FeedForward(c)
        self.attention_norm = RMSNorm(c.dim, c.norm_eps)
        self.ffn_norm = RMSNorm(c.dim, c.norm_eps)

    def forward(self, x, rope, slots, mask):
        h = x + self.attention(self.attention_norm(x), rope, slots, mask)
        return h + self.feed_forward(self.ffn_norm(h))


# --- the model ----------------------------------------------------------------------------------
class LlamaGenGPT(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.config = c
        self.cls_embedding = (
            LabelEmbedder(c.num_classes, c.dim)
            if c.model_type == "c2i"
            else CaptionEmbedder(c.caption_dim, c.dim, c.cls_token_num)
        )
        self.tok_embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.tok_dropout = nn.Dropout(c.dropout)
        self.layers = nn.ModuleList(TransformerBlock(c) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = nn.Linear(c.dim, c.vocab_size, bias=False)
        self.register_buffer("rope", rope_table_2d(c), persistent=False)
        self.prefix_valid: Tensor | None = None  # [R, S] keys a row may attend to (t2i padding)
        self.cache_len = self.max_len  # cache slots: the sequence, then draft-tree scratch slots
        self.apply(self._init_weights)
        nn.init.zeros_(self.output.weight)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        """LlamaGen's initialisation (N(0, 0.02), zero head): with PyTorch's N(0, 1) embedding
        default the rarely seen class rows barely move from their random start in a short
        training run."""
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    @property
    def max_len(self) -> int:
        return self.config.cls_token_num + self.config.block_size

    def embed_condition(self, cond: Tensor) -> Tensor:
        """Class ids [B] (null = num_classes) or caption features [B, T, caption_dim] -> [B, T,
        C]."""
        return self.cls_embedding(cond)

    def setup_caches(
        self, rows: int, dtype=None, prefix_valid: Tensor | None = None, scratch: int = 0
    ) -> None:
        """Allocate the per-layer caches for rows sequences, with `scratch` slots past the sequence
        for draft-tree branches; prefix_valid [R, cls_token_num] masks condition padding (a t2i
        caption is left-padded)."""
        dtype = dtype or self.output.weight.dtype
        device = weights_device(self.output)
        c = self.config
        self.cache_len = self.max_len + scratch
        for layer in self.layers:  # each where its layer computes (a device map may split them)
            layer.attention.kv_cache = StaticKVCache(
                rows, c.kv_heads, self.cache_len, c.head_dim, dtype, weights_device(layer)
            )
        self.prefix_valid = None
        if prefix_valid is not None:
            self.prefix_valid = torch.ones(rows, self.cache_len, dtype=torch.bool, device=device)
            self.prefix_valid[:, : c.cls_token_num] = prefix_valid.to(device)

    def release_caches(self) -> None:
        for layer in self.layers:
            layer.attention.kv_cache = None
        self.prefix_valid = None

    def caches(self) -> list[StaticKVCache]:
        return [layer.attention.kv_cache for layer in self.layers]

    def keys(self, slots: Tensor) -> int:
        """How many cache slots a forward writing at slots [R, N] attends over. On the CPU, those up
        to the last slot written, as no query sees past it (attention's time there grows with the
        keys); reading that slot costs nothing there. Elsewhere the whole cache: one shape for
        every window, and no wait for the device."""
        return int(slots.max()) + 1 if slots.device.type == "cpu" else self.cache_len

    def _valid(self, keys: int) -> Tensor | None:
        return None if self.prefix_valid is None else self.prefix_valid[:, :keys]

    def _run(
        self,
        h: Tensor,
        positions: Tensor,
        cached: bool,
        slots: Tensor | None = None,
        mask: Tensor | None = None,
    ) -> Tensor:
        """Embeddings at absolute positions (RoPE); with the cache, written at slots (the positions
        unless given) under mask (causal over the slots unless given; its last dimension says how
        many cache slots attention reads, `keys`), made additive once for every layer."""
        rope = self.rope[positions]  # [B, S, D/2, 2]
        if cached:
            slots = positions if slots is None else slots
            if mask is None:
                keys = self.keys(slots)
                mask = window_mask(slots, keys, self._valid(keys))
            mask = additive_mask(mask, h.dtype)
        for layer in self.layers:
            h = layer(h, rope, slots if cached else None, mask)
        return self.output(self.norm(h)).float()

    def prefill(self, cond_embeddings: Tensor) -> Tensor:
        """Condition embeddings [R, T, C] at positions 0..T-1 -> logits [R, V] for image token 0."""
        R, T, _ = cond_embeddings.shape
        positions = torch.arange(T, device=cond_embeddings.device).expand(R, -1)
        return self._run(cond_embeddings, positions, cached=True)[:, -1]

    def decode(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Image tokens [R, W] at absolute positions [R, W] -> logits [R, W, V]."""
        return self._run(self.tok_embeddings(tokens), positions, cached=True)

    def decode_tree(
        self, tokens: Tensor, positions: Tensor, slots: Tensor, ancestors: Tensor
    ) -> Tensor:
        """A draft tree: tokens [R, N] at absolute positions [R, N], written at cache slots [R, N];
        node i attends to the cache before the first node's slot and to its ancestors (ancestors
        [N, N] bool, see kv_cache.tree_mask) -> logits [R, N, V]."""
        keys = self.keys(slots)
        mask = tree_mask(slots, ancestors, keys, self._valid(keys))
        return self._run(
            self.tok_embeddings(tokens), positions, cached=True, slots=slots, mask=mask
        )

    def forward(self, cond_embeddings: Tensor, tokens: Tensor) -> Tensor:
        """Training: prefix [B, T, C] + image tokens [B, N] (teacher forcing, no cache) ->
        logits [B, N, V] for image tokens 0..N-1 (the last prefix position predicts token 0)."""
        h = self.tok_dropout(torch.cat([cond_embeddings, self.tok_embeddings(tokens[:, :-1])], 1))
        positions = torch.arange(h.shape[1], device=h.device).expand(h.shape[0], -1)
        logits = self._run(h, positions, cached=False)
        return logits[:, self.config.cls_token_num - 1 :]
