"""MoVQGAN (Zheng et al. 2022, "MoVQ"; Sber AI's github.com/ai-forever/MoVQGAN).

Lumina-mGPT 2.0 draws its image tokens from the 270M model's codebook (16,384 codes, f8) and decodes
them with it: taming's VQGAN decoder with every GroupNorm modulated by the quantized codes. Its
encoder (taming's, plain GroupNorm) tokenises an edit's reference. The architecture is read from
the checkpoint's tensor shapes, so each release loads through one path. Our own code; the decoder
checked against Lumina-mGPT 2.0's copy by golden numerics. The layers, the releases and the
upstream files: docs/families.md, "Lumina-mGPT 2.0"."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import CheckpointError, load_decoder, read_state_dict
from ..llamagen.vq import AttnBlock as PlainAttnBlock
from ..llamagen.vq import Downsample, Upsample, swish
from ..llamagen.vq import ResnetBlock as PlainResnetBlock
from ..lumina.vqgan import ChameleonVQGAN

HINT = (
    "the MoVQGAN checkpoint Lumina-mGPT 2.0 decodes with (keys like decoder.conv_in.weight, "
    "quantize.embedding.weight)"
)
UNUSED_PREFIXES = ("loss.",)  # training losses
ENCODING = ("encoder.", "quant_conv.")  # the encoding side (MoVQEncoder)
GROUPS = 32


@dataclass(frozen=True)
class MoVQConfig:
    """What the decoder's shapes say: codebook, per-level widths (level 0 = full resolution), blocks
    per level (the decoder runs num_res_blocks + 1), the levels with attention, and whether each
    SpatialNorm has its extra 3x3 convolution of the codes (add_conv)."""

    n_embed: int = 16384
    embed_dim: int = 4
    z_channels: int = 4
    channels: tuple = (256, 512, 512, 1024)  # ch 256 x ch_mult (1, 2, 2, 4): the 270M release
    blocks: int = 3
    attn_levels: tuple = (3,)  # attn_resolutions [32] at resolution 256: the lowest level
    add_conv: bool = False
    out_ch: int = 3

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.channels) - 1)


class SpatialNorm(nn.Module):
    def __init__(self, ch: int, zq_ch: int, add_conv: bool):
        super().__init__()
        self.norm_layer = nn.GroupNorm(GROUPS, ch, eps=1e-6)
        self.conv = nn.Conv2d(zq_ch, zq_ch, 3, padding=1) if add_conv else None
        self.conv_y = nn.Conv2d(zq_ch, ch, 1)
        self.conv_b = nn.Conv2d(zq_ch, ch, 1)

    def forward(self, f: Tensor, zq: Tensor) -> Tensor:
        zq = F.interpolate(zq, size=f.shape[-2:], mode="nearest")
        if self.conv is not None:
            zq = self.conv(zq)
        return self.norm_layer(f) * self.conv_y(zq) + self.conv_b(zq)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, c: MoVQConfig):
        super().__init__()
        self.norm1 = SpatialNorm(cin, c.embed_dim, c.add_conv)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = SpatialNorm(cout, c.embed_dim, c.add_conv)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: Tensor, zq: Tensor) -> Tensor:
        h = self.conv1(swish(self.norm1(x, zq)))
        h = self.conv2(swish(self.norm2(h, zq)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    def __init__(self, ch: int, c: MoVQConfig):
        super().__init__()
        self.norm = SpatialNorm(ch, c.embed_dim, c.add_conv)
        self.q, self.k, self.v, self.proj_out = (nn.Conv2d(ch, ch, 1) for _ in range(4))

    def forward(self, x: Tensor, zq: Tensor) -> Tensor:
        B, C, H, W = x.shape
        h = self.norm(x, zq)
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))  # [B, HW, C]
        # memory-efficient at 96 x 96
        y = F.scaled_dot_product_attention(q[:, None], k[:, None], v[:, None])[:, 0]
        return x + self.proj_out(y.transpose(1, 2).reshape(B, C, H, W))


class Mid(nn.Module):
    def __init__(self, ch: int, c: MoVQConfig):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = (
            ResnetBlock(ch, ch, c),
            AttnBlock(ch, c),
            ResnetBlock(ch, ch, c),
        )

    def forward(self, h: Tensor, zq: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(h, zq), zq), zq)


class UpLevel(nn.Module):
    """Residual blocks (each followed by attention where the level has it), then 2x nearest
    upsampling."""

    def __init__(self, cin: int, cout: int, c: MoVQConfig, attn: bool, upsample: bool):
        super().__init__()
        self.block = nn.ModuleList(
            ResnetBlock(cin if i == 0 else cout, cout, c) for i in range(c.blocks)
        )
        self.attn = nn.ModuleList(AttnBlock(cout, c) for _ in range(c.blocks if attn else 0))
        self.upsample = Upsample(cout) if upsample else None

    def forward(self, h: Tensor, zq: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            h = block(h, zq)
            if len(self.attn):
                h = self.attn[i](h, zq)
        return h if self.upsample is None else self.upsample(h)


class Decoder(nn.Module):
    def __init__(self, c: MoVQConfig):
        super().__init__()
        n, chans = len(c.channels), c.channels
        self.conv_in = nn.Conv2d(c.z_channels, chans[-1], 3, padding=1)
        self.mid = Mid(chans[-1], c)
        # `up` is indexed by level (0 = full resolution) as in the checkpoint, and run from the top
        # level down
        self.up = nn.ModuleList(
            UpLevel(chans[min(i + 1, n - 1)], chans[i], c, i in c.attn_levels, i > 0)
            for i in range(n)
        )
        self.norm_out = SpatialNorm(chans[0], c.embed_dim, c.add_conv)
        self.conv_out = nn.Conv2d(chans[0], c.out_ch, 3, padding=1)

    def forward(self, z: Tensor, zq: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z), zq)
        for level in reversed(self.up):
            h = level(h, zq)
        return self.conv_out(swish(self.norm_out(h, zq)))


class MoVQGAN(ChameleonVQGAN):
    """Codebook and post-quant convolution as taming's VQGAN; the decoder modulated by the codes."""

    decoder_class = Decoder

    def decode_code(self, codes: Tensor) -> Tensor:
        """codes [B, h, w] -> images [B, 3, f h, f w] (f8 for the releases), nominally in [-1, 1].
        The decoder sees the code vectors twice: through post_quant_conv as its input, and raw as
        the map that modulates every norm."""
        zq = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # [B, D, h, w]
        return self.decoder(self.post_quant_conv(zq), zq)


class DownLevel(nn.Module):
    """taming's encoder level: residual blocks (each followed by attention where the level has it),
    then a strided 2x downsampling but at the last level."""

    def __init__(self, cin: int, cout: int, blocks: int, attn: bool, downsample: bool):
        super().__init__()
        self.block = nn.ModuleList(
            PlainResnetBlock(cin if i == 0 else cout, cout, GROUPS) for i in range(blocks)
        )
        self.attn = nn.ModuleList(
            PlainAttnBlock(cout, GROUPS) for _ in range(blocks if attn else 0)
        )
        self.downsample = Downsample(cout) if downsample else None

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        return h if self.downsample is None else self.downsample(h)


@dataclass(frozen=True)
class EncoderConfig:
    """What the encoder's shapes say: conv_in's width, per-level widths, blocks per level, the
    levels with attention, the latent and code widths."""

    ch: int
    channels: tuple
    blocks: int
    attn_levels: tuple
    z_channels: int
    embed_dim: int


class MoVQEncoder(nn.Module):
    """The encoding side: taming's encoder (its module names, as the checkpoint's encoder.*), the
    quant_conv, and the nearest codebook entry by squared distance (MoVQ's VectorQuantizer2)."""

    def __init__(self, c: EncoderConfig, codebook: Tensor):
        super().__init__()
        n, chans = len(c.channels), c.channels
        self.encoder = nn.Module()
        e = self.encoder
        e.conv_in = nn.Conv2d(3, c.ch, 3, padding=1)
        e.down = nn.ModuleList(
            DownLevel(
                c.ch if i == 0 else chans[i - 1], chans[i], c.blocks, i in c.attn_levels, i < n - 1
            )
            for i in range(n)
        )
        e.mid = nn.Module()
        e.mid.block_1, e.mid.attn_1, e.mid.block_2 = (
            PlainResnetBlock(chans[-1], chans[-1], GROUPS),
            PlainAttnBlock(chans[-1], GROUPS),
            PlainResnetBlock(chans[-1], chans[-1], GROUPS),
        )
        e.norm_out = nn.GroupNorm(GROUPS, chans[-1], eps=1e-6)
        e.conv_out = nn.Conv2d(chans[-1], c.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(c.z_channels, c.embed_dim, 1)
        self.register_buffer("codebook", codebook.detach().float().clone(), persistent=False)

    def forward(self, pixels: Tensor) -> Tensor:
        """pixels [B, 3, H, W] in [-1, 1] -> codes [B, H / f, W / f]."""
        e = self.encoder
        h = e.conv_in(pixels)
        for level in e.down:
            h = level(h)
        h = e.mid.block_2(e.mid.attn_1(e.mid.block_1(h)))
        z = self.quant_conv(e.conv_out(swish(e.norm_out(h)))).permute(0, 2, 3, 1)
        book = self.codebook.to(z.dtype)
        distances = (z**2).sum(-1, keepdim=True) + (book**2).sum(-1) - 2 * z @ book.T
        return distances.argmin(-1)


def config_from_state(state: dict[str, Tensor], path: str) -> MoVQConfig:
    """The architecture the checkpoint's decoder tensors spell out."""
    try:
        n_embed, embed_dim = state["quantize.embedding.weight"].shape
        levels = sorted({int(m[1]) for k in state if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
        channels = tuple(
            int(state[f"decoder.up.{i}.block.0.conv1.weight"].shape[0]) for i in levels
        )
        blocks = len({k.split(".")[4] for k in state if k.startswith("decoder.up.0.block.")})
        attn = tuple(i for i in levels if f"decoder.up.{i}.attn.0.q.weight" in state)
        return MoVQConfig(
            n_embed=int(n_embed),
            embed_dim=int(embed_dim),
            z_channels=int(state["post_quant_conv.weight"].shape[0]),
            channels=channels,
            blocks=blocks,
            attn_levels=attn,
            add_conv="decoder.norm_out.conv.weight" in state,
            out_ch=int(state["decoder.conv_out.weight"].shape[0]),
        )
    except (KeyError, ValueError) as e:
        raise CheckpointError(
            f"{path}: not a MoVQGAN decoder ({type(e).__name__}: {e}); expected {HINT}"
        ) from e


def encoder_config(state: dict[str, Tensor], path: str) -> EncoderConfig | None:
    """The encoder the checkpoint's encoder.* tensors spell out; None where it holds none."""
    if "encoder.conv_in.weight" not in state or "encoder.down.0.block.0.conv1.weight" not in state:
        return None
    try:
        levels = sorted({int(m[1]) for k in state if (m := re.match(r"encoder\.down\.(\d+)\.", k))})
        return EncoderConfig(
            ch=int(state["encoder.conv_in.weight"].shape[0]),
            channels=tuple(
                int(state[f"encoder.down.{i}.block.0.conv1.weight"].shape[0]) for i in levels
            ),
            blocks=len({k.split(".")[4] for k in state if k.startswith("encoder.down.0.block.")}),
            attn_levels=tuple(i for i in levels if f"encoder.down.{i}.attn.0.q.weight" in state),
            z_channels=int(state["encoder.conv_out.weight"].shape[0]),
            embed_dim=int(state["quant_conv.weight"].shape[0]),
        )
    except (KeyError, ValueError) as e:
        raise CheckpointError(
            f"{path}: its encoder is not MoVQGAN's ({type(e).__name__}: {e}); expected {HINT}"
        ) from e


def load_encoder(state: dict[str, Tensor], codebook: Tensor, path: str) -> MoVQEncoder | None:
    """The encoding side from a checkpoint's tensors (None: it holds none)."""
    config = encoder_config(state, path)
    if config is None:
        return None
    encoding = {k: v for k, v in state.items() if k.startswith(ENCODING)}
    encoder = load_decoder(
        lambda: MoVQEncoder(config, torch.empty(codebook.shape)), encoding, path, HINT
    )
    encoder.codebook = codebook.detach().float().clone()
    return encoder


def load_movqgan(path: str) -> tuple[MoVQGAN, MoVQEncoder | None]:
    """A MoVQGAN checkpoint (.ckpt as released, read with weights_only, or .safetensors): the
    decoding side, and the encoding side where the checkpoint holds it (None: it does not, and
    the model cannot take references)."""
    state, _ = read_state_dict(path, HINT)
    state = {k: v for k, v in state.items() if not k.startswith(UNUSED_PREFIXES)}
    config = config_from_state(state, path)
    if len(config.channels) < 2 or not config.blocks:
        raise CheckpointError(
            f"{path}: its decoder has {len(config.channels)} levels; expected {HINT}"
        )
    decoder = load_decoder(
        lambda: MoVQGAN(config),
        {k: v for k, v in state.items() if not k.startswith(ENCODING)},
        path,
        HINT,
    )
    return decoder, load_encoder(state, decoder.codebook(), path)


def find_movqgan(folder: str, name: str) -> str | None:
    """`name` (.ckpt or a .safetensors conversion) in the model folder, its movqgan/ subfolder, or
    the place upstream's README puts it (movqgan/270M/); None when absent."""
    stem = os.path.splitext(name)[0]
    size = stem.rsplit("_", 1)[-1]
    for place in ("movqgan", os.path.join("movqgan", size), ""):
        for ext in (".ckpt", ".safetensors"):
            path = os.path.join(folder, place, stem + ext)
            if os.path.isfile(path):
                return path
    return None
