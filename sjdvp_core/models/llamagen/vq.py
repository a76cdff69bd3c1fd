"""LlamaGen's VQ image tokenizer (VQ-16 / VQ-8; github.com/FoundationVision/LlamaGen), written for
this engine: a VQGAN-style conv encoder and decoder (GroupNorm + swish residual blocks, attention at
the lowest resolution and in the middle) around an l2-normalised codebook. Module names follow the
official checkpoints (vq_ds16_c2i.pt, vq_ds16_t2i.pt, vq_ds8_c2i.pt) so they load by key.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch
from torch import Tensor, nn
from torch.nn import functional as F


@dataclass
class VQConfig:
    codebook_size: int = 16384
    codebook_embed_dim: int = 8
    ch: int = 128
    ch_mult: list = field(default_factory=lambda: [1, 1, 2, 2, 4])  # VQ-16; [1, 2, 2, 4] is VQ-8
    z_channels: int = 256
    num_res_blocks: int = 2  # the decoder has one more per level
    norm_groups: int = 32

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)

    def to_dict(self) -> dict:
        return asdict(self)


def swish(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, cin, eps=1e-6)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, cout, eps=1e-6)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv2(swish(self.norm2(self.conv1(swish(self.norm1(x))))))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, ch: int, groups: int):
        super().__init__()
        self.norm = nn.GroupNorm(groups, ch, eps=1e-6)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x: Tensor) -> Tensor:
        B, C, H, W = x.shape
        h = self.norm(x)
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # [B, HW, C]
        y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(y.transpose(1, 2).reshape(B, C, H, W))


class Downsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, stride=2)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Level(nn.Module):
    """One resolution: residual blocks (each followed by attention at the lowest resolution) and an
    optional resampling step."""

    def __init__(
        self, cin: int, cout: int, blocks: int, attn: bool, groups: int, resample: str | None
    ):
        super().__init__()
        self.res = nn.ModuleList(
            ResnetBlock(cin if i == 0 else cout, cout, groups) for i in range(blocks)
        )
        self.attn = nn.ModuleList(AttnBlock(cout, groups) for _ in range(blocks if attn else 0))
        if resample == "down":
            self.downsample = Downsample(cout)
        elif resample == "up":
            self.upsample = Upsample(cout)

    def forward(self, h: Tensor) -> Tensor:
        for i, res in enumerate(self.res):
            h = res(h)
            if len(self.attn):
                h = self.attn[i](h)
        if hasattr(self, "downsample"):
            h = self.downsample(h)
        if hasattr(self, "upsample"):
            h = self.upsample(h)
        return h


def _mid(ch: int, groups: int) -> nn.ModuleList:
    return nn.ModuleList(
        [ResnetBlock(ch, ch, groups), AttnBlock(ch, groups), ResnetBlock(ch, ch, groups)]
    )


class Encoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        n, g = len(c.ch_mult), c.norm_groups
        chans = [c.ch * m for m in c.ch_mult]
        self.conv_in = nn.Conv2d(3, c.ch, 3, padding=1)
        self.conv_blocks = nn.ModuleList(
            Level(
                c.ch if i == 0 else chans[i - 1],
                chans[i],
                c.num_res_blocks,
                i == n - 1,
                g,
                "down" if i < n - 1 else None,
            )
            for i in range(n)
        )
        self.mid = _mid(chans[-1], g)
        self.norm_out = nn.GroupNorm(g, chans[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(chans[-1], c.z_channels, 3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.conv_blocks:
            h = level(h)
        for block in self.mid:
            h = block(h)
        return self.conv_out(swish(self.norm_out(h)))


class Decoder(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        n, g = len(c.ch_mult), c.norm_groups
        chans = [c.ch * m for m in reversed(c.ch_mult)]  # lowest resolution first
        self.conv_in = nn.Conv2d(c.z_channels, chans[0], 3, padding=1)
        self.mid = _mid(chans[0], g)
        self.conv_blocks = nn.ModuleList(
            Level(
                chans[max(i - 1, 0)],
                chans[i],
                c.num_res_blocks + 1,
                i == 0,
                g,
                "up" if i < n - 1 else None,
            )
            for i in range(n)
        )
        self.norm_out = nn.GroupNorm(g, chans[-1], eps=1e-6)
        self.conv_out = nn.Conv2d(chans[-1], 3, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.conv_in(z)
        for block in self.mid:
            h = block(h)
        for level in self.conv_blocks:
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))


class Quantizer(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        self.embedding = nn.Embedding(c.codebook_size, c.codebook_embed_dim)

    def codebook(self) -> Tensor:
        return F.normalize(self.embedding.weight, dim=-1)

    def nearest(self, z: Tensor) -> Tensor:
        """z [B, D, h, w] -> code indices [B, h, w] (cosine nearest, as l2-normalised)."""
        flat = F.normalize(z.permute(0, 2, 3, 1), dim=-1)
        return (flat @ self.codebook().T).argmax(-1)

    def lookup(self, codes: Tensor) -> Tensor:
        """codes [B, h, w] -> [B, D, h, w]."""
        return self.codebook()[codes].permute(0, 3, 1, 2)


class LlamaGenVQ(nn.Module):
    def __init__(self, c: VQConfig):
        super().__init__()
        self.config = c
        self.encoder = Encoder(c)
        self.decoder = Decoder(c)
        self.quantize = Quantizer(c)
        self.quant_conv = nn.Conv2d(c.z_channels, c.codebook_embed_dim, 1)
        self.post_quant_conv = nn.Conv2d(c.codebook_embed_dim, c.z_channels, 1)

    def encode_latent(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] in [-1, 1] -> pre-quantisation latents [B, D, h, w]."""
        return self.quant_conv(self.encoder(images))

    def encode(self, images: Tensor) -> Tensor:
        return self.quantize.nearest(self.encode_latent(images))

    def decode_latent(self, z: Tensor) -> Tensor:
        return self.decoder(self.post_quant_conv(z))

    def decode_code(self, codes: Tensor) -> Tensor:
        """codes [B, h, w] -> images [B, 3, H, W], nominally in [-1, 1]."""
        return self.decode_latent(self.quantize.lookup(codes))


class VQEncoding(nn.Module):
    """A LlamaGenVQ's encoding side, taken off it (its encoder, quant_conv and a copy of the
    codebook): what a completion edit tokenises its reference with, kept apart from the weights a
    decode holds on the card."""

    def __init__(self, vq: LlamaGenVQ):
        super().__init__()
        self.encoder, self.quant_conv = vq.encoder, vq.quant_conv
        self.quantize = Quantizer(vq.config)
        self.quantize.embedding.weight = nn.Parameter(vq.quantize.embedding.weight.detach().clone())
        vq.encoder = vq.quant_conv = None

    def forward(self, images: Tensor) -> Tensor:
        """images [B, 3, H, W] in [-1, 1] -> codes [B, h, w]."""
        return self.quantize.nearest(self.quant_conv(self.encoder(images)))
