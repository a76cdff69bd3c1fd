"""Meta's Chameleon VQGAN image tokenizer, decoding side (the taming-transformers VQGAN of Esser et al.
2021 in Meta's Chameleon release, github.com/facebookresearch/chameleon). Lumina-mGPT 1.0 draws its
image tokens from this codebook, and transformers' ChameleonVQVAE has only the encoder, so the
decoder is written here. Module names follow the official vqgan.ckpt (a Lightning checkpoint,
weights under "state_dict") and the architecture is read from the official vqgan.yaml, so Meta's two
files load as is. The encoder is left out: generation only decodes."""

from __future__ import annotations

import os
from dataclasses import dataclass

import yaml
from torch import Tensor, nn

from ..checkpoint import CheckpointError, load_decoder, read_state_dict
from ..llamagen.vq import AttnBlock, ResnetBlock, Upsample, swish

CONFIG_FILE = "vqgan.yaml"
WEIGHT_FILES = ("vqgan.ckpt", "vqgan.safetensors")  # Meta's file, or its state dict converted
VQGAN_HINT = "Meta's Chameleon VQGAN checkpoint (keys like decoder.conv_in.weight, quantize.embedding.weight)"
# encoding side and Lightning's training losses
UNUSED_PREFIXES = (
    "encoder.",
    "quant_conv.",
    "loss.",
)
GROUPS = 32  # taming's GroupNorm


@dataclass(frozen=True)
class VQGANConfig:
    """vqgan.yaml's model.params: n_embed, embed_dim and the ddconfig fields the decoder uses."""

    n_embed: int = 8192  # codebook size
    embed_dim: int = 256  # code vector width
    ch: int = 128
    ch_mult: tuple = (1, 1, 2, 2, 4)  # f16: 512 px <-> 32 x 32 codes
    num_res_blocks: int = 2  # the decoder runs one more per level
    attn_resolutions: tuple = ()  # feature-map sizes (at `resolution`) that get attention
    z_channels: int = 256
    resolution: int = 512
    out_ch: int = 3

    @property
    def downsample(self) -> int:
        return 2 ** (len(self.ch_mult) - 1)


def read_vqgan_yaml(path: str) -> VQGANConfig:
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file; expected Meta's Chameleon vqgan.yaml")
    try:
        with open(path, encoding="utf8") as f:
            params = yaml.safe_load(f)["model"]["params"]  # safe_load: plain dicts and lists only
        dd = params["ddconfig"]
        return VQGANConfig(
            n_embed=int(params["n_embed"]),
            embed_dim=int(params["embed_dim"]),
            ch=int(dd["ch"]),
            ch_mult=tuple(dd["ch_mult"]),
            num_res_blocks=int(dd["num_res_blocks"]),
            attn_resolutions=tuple(dd.get("attn_resolutions") or ()),
            z_channels=int(dd["z_channels"]),
            resolution=int(dd["resolution"]),
            out_ch=int(dd.get("out_ch", 3)),
        )
    except (yaml.YAMLError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(
            f"{path}: is not a VQGAN config with model.params.{{n_embed, embed_dim, ddconfig}} "
            f"({type(e).__name__}: {e}); use the vqgan.yaml of Meta's Chameleon release"
        ) from e


class Mid(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.block_1, self.block_2 = ResnetBlock(ch, ch, GROUPS), ResnetBlock(ch, ch, GROUPS)
        self.attn_1 = AttnBlock(ch, GROUPS)

    def forward(self, h: Tensor) -> Tensor:
        return self.block_2(self.attn_1(self.block_1(h)))


class UpLevel(nn.Module):
    """Residual blocks (each followed by attention where configured), then 2x nearest upsampling."""

    def __init__(self, cin: int, cout: int, blocks: int, attn: bool, upsample: bool):
        super().__init__()
        self.block = nn.ModuleList(
            ResnetBlock(cin if i == 0 else cout, cout, GROUPS) for i in range(blocks)
        )
        self.attn = nn.ModuleList(AttnBlock(cout, GROUPS) for _ in range(blocks if attn else 0))
        self.upsample = Upsample(cout) if upsample else None

    def forward(self, h: Tensor) -> Tensor:
        for i, block in enumerate(self.block):
            h = block(h)
            if len(self.attn):
                h = self.attn[i](h)
        return h if self.upsample is None else self.upsample(h)


class Decoder(nn.Module):
    def __init__(self, c: VQGANConfig):
        super().__init__()
        n = len(c.ch_mult)
        top = c.ch * c.ch_mult[-1]
        self.conv_in = nn.Conv2d(c.z_channels, top, 3, padding=1)
        self.mid = Mid(top)
        # `up` is indexed by level (0 = full resolution) as in the checkpoint, and run from the top
        # level down
        res = [c.resolution // 2**i for i in range(n)]
        chans = [c.ch * m for m in c.ch_mult]
        self.up = nn.ModuleList(
            UpLevel(
                chans[min(i + 1, n - 1)],
                chans[i],
                c.num_res_blocks + 1,
                res[i] in c.attn_resolutions,
                i > 0,
            )
            for i in range(n)
        )
        self.norm_out = nn.GroupNorm(GROUPS, chans[0], eps=1e-6)
        self.conv_out = nn.Conv2d(chans[0], c.out_ch, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(swish(self.norm_out(h)))


class Codebook(nn.Module):
    def __init__(self, c: VQGANConfig):
        super().__init__()
        # plain vectors: nearest is by L2, no normalising
        self.embedding = nn.Embedding(c.n_embed, c.embed_dim)


class ChameleonVQGAN(nn.Module):
    """taming's VQGAN, decoding side: codebook, post-quant convolution, decoder (MoVQGAN swaps
    the decoder)."""

    decoder_class = Decoder

    def __init__(self, c: VQGANConfig):
        super().__init__()
        self.config = c
        self.quantize = Codebook(c)
        self.post_quant_conv = nn.Conv2d(c.embed_dim, c.z_channels, 1)
        self.decoder = self.decoder_class(c)

    def codebook(self) -> Tensor:
        return self.quantize.embedding.weight

    def decode_code(self, codes: Tensor) -> Tensor:
        """codes [B, h, w] -> images [B, 3, 16h, 16w] (f16), nominally in [-1, 1]."""
        z = self.quantize.embedding(codes).permute(0, 3, 1, 2)  # [B, D, h, w]
        return self.decoder(self.post_quant_conv(z))


def vqgan_files(folder: str) -> tuple[str | None, str | None]:
    """(config, weights) paths in `folder`, None where absent."""
    config = os.path.join(folder, CONFIG_FILE)
    weights = [
        os.path.join(folder, f) for f in WEIGHT_FILES if os.path.isfile(os.path.join(folder, f))
    ]
    return (config if os.path.isfile(config) else None), (weights[0] if weights else None)


def load_vqgan(folder: str) -> ChameleonVQGAN:
    """vqgan.yaml + vqgan.ckpt from `folder`; the message for missing files says where they come
    from."""
    config_path, path = vqgan_files(folder)
    missing = [f for f, p in ((CONFIG_FILE, config_path), (WEIGHT_FILES[0], path)) if p is None]
    if missing:
        raise CheckpointError(
            f"{folder}: {' and '.join(missing)} missing. Lumina-mGPT decodes images with Meta's "
            "Chameleon VQGAN: copy vqgan.yaml and vqgan.ckpt from the tokenizer/ folder of Meta's "
            "Chameleon release (ai.meta.com/resources/models-and-libraries/chameleon-downloads) "
            f"into {folder}"
        )
    config = read_vqgan_yaml(config_path)
    state, _ = read_state_dict(path, VQGAN_HINT)
    state = {k: v for k, v in state.items() if not k.startswith(UNUSED_PREFIXES)}
    return load_decoder(lambda: ChameleonVQGAN(config), state, path, VQGAN_HINT)
