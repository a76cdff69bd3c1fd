"""The memory table (README.md's Models section and docs/memory.md): what each release needs at each
precision, and which cards it fits.

Each release's own architecture (its config's sizes) is built on the meta device, so no weight is read or
allocated, and the estimator auto uses (models.memory.need: the weights at that precision + a default
decode's KV cache, forward transients and loop state) is run on it. Where this table and a loaded model
disagree, the loaded model is right: tests/test_memory.py checks the estimator against measured peaks, and
tests/test_memory_table.py checks each architecture here against its release's download size.

    python tools/memory_table.py            # print the table (markdown)
    python tools/memory_table.py --write    # and put it in README.md and docs/memory.md, between their markers
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from typing import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sjdvp_core.engine.adapter import TokenLayout  # noqa: E402
from sjdvp_core.models.emu3 import adapter as emu3  # noqa: E402
from sjdvp_core.models.glm_image import adapter as glm  # noqa: E402
from sjdvp_core.models.hf_adapter import HFAdapter  # noqa: E402
from sjdvp_core.models.janus import adapter as janus  # noqa: E402
from sjdvp_core.models.lumina import adapter as lumina  # noqa: E402
from sjdvp_core.models.lumina2 import adapter as lumina2  # noqa: E402
from sjdvp_core.models.memory import Need, need, pixel_weight_need  # noqa: E402

CARDS_GB = (8, 12, 16, 24, 48, 80)
PRECISIONS = ("bf16", "int8", "nf4")
RESERVE = 1.0e9       # what a card keeps for the CUDA context and the framework (ComfyUI's own reserve is ~1 GB)
BEGIN, END = "<!-- memory table: python tools/memory_table.py --write -->", "<!-- end of memory table -->"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = (os.path.join(REPO, "README.md"), os.path.join(REPO, "docs", "memory.md"))   # each holds the table


class Shape(HFAdapter):
    """A transformers release's model on the meta device at its default image: what the estimator reads
    (config, layout, blocks, image decoder, module), no tokenizer and no weights."""

    def __init__(self, model, lm, layout: TokenLayout, decoder, sampling, logits_width: int | None = None):
        HFAdapter.__init__(self, model, lm, lm.config, layout, pad_id=0, device="meta")
        self.image_decoder, self.sampling, self._width = decoder, sampling, logits_width
        if not any(m is decoder for m in model.modules()):
            self.module = torch.nn.ModuleDict({"model": model, "decoder": decoder})

    @property
    def default_sampling(self):
        return self.sampling

    @property
    def logits_width(self) -> int:
        return self._width or self.text_config.vocab_size


def _raster(codes: int, rows: int, cols: int, row_end: bool, suffix: int) -> TokenLayout:
    """A layout of the release's length (the ids are placeholders: the estimator reads only counts)."""
    return TokenLayout.raster(torch.arange(codes), rows, cols, row_end=codes if row_end else None,
                              suffix=range(codes + 1, codes + 1 + suffix))


def _chameleon(vocab: int, decoder_factory, codes: int, grid: int, sampling) -> Shape:
    """Lumina-mGPT 1.0 / 2.0: Chameleon-7B's stack (transformers' ChameleonConfig defaults: hidden 4096,
    32 layers, FFN 11008, 32 heads) with the release's vocabulary; its image decoder is ours, not
    transformers' VQ encoder (dropped, as lumina.py drops it)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration
    with torch.device("meta"):
        model = ChameleonForConditionalGeneration(ChameleonConfig(vocab_size=vocab, vocabulary_map={}))
        model.model.vqmodel = None
        decoder = decoder_factory()
    return Shape(model, model.model, _raster(codes, grid, grid, True, 1), decoder, sampling)


def lumina_768() -> Shape:
    from sjdvp_core.models.lumina.vqgan import ChameleonVQGAN, VQGANConfig
    return _chameleon(65536, lambda: ChameleonVQGAN(VQGANConfig()), 8192, 768 // 16, lumina.SAMPLING)


def lumina2_768() -> Shape:
    """Vocabulary 172032: Lumina-mGPT 2.0's config.json is not readable here; this is the size its 15.78 GB
    of bf16 shards imply with Chameleon-7B's stack (tests/test_memory_table.py holds it to that)."""
    from sjdvp_core.models.lumina2.movqgan import MoVQConfig, MoVQGAN
    return _chameleon(172032, lambda: MoVQGAN(MoVQConfig()), 16384, 768 // 8, lumina2.SAMPLING)


def emu3_gen() -> Shape:
    """Emu3-Gen: transformers' Emu3Config defaults are its sizes (8B: hidden 4096, 32 layers, 8 KV heads,
    FFN 14336, vocabulary 184622; the VQ-VAE with 32768 codes, f8); the default 720 x 720 image."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration
    with torch.device("meta"):
        model = Emu3ForConditionalGeneration(Emu3Config(vocabulary_map={"<image>": 151851}))
    h, w = emu3.token_grid("1:1", emu3.IMAGE_AREA, 8, model.config.text_config.max_position_embeddings)
    return Shape(model, model.model.text_model, _raster(32768, h, w, True, 3),
                 model.model.vqmodel, emu3.SAMPLING)


def janus_pro(hidden: int, layers: int, ffn: int, heads: int) -> Callable[[], Shape]:
    """Janus-Pro as released (deepseek-ai's files): a Llama stack of the given size (vocabulary 102400),
    transformers' JanusConfig defaults for the rest (the 16384-code VQ and its generation head), less what
    janus_original leaves out because generation never runs it (SigLIP tower, aligner, text head, VQ
    encoder); 384 px."""
    def build() -> Shape:
        from transformers import JanusConfig

        from sjdvp_core.models.janus.original import _empty_model
        text = dict(model_type="llama", hidden_size=hidden, num_hidden_layers=layers, intermediate_size=ffn,
                    num_attention_heads=heads, num_key_value_heads=heads, vocab_size=102400)
        model = _empty_model(JanusConfig(text_config=text), torch.bfloat16)
        return Shape(model, model.model.language_model, _raster(16384, 24, 24, False, 0), model.model.vqmodel,
                     janus.SAMPLING, logits_width=16384)
    return build


def llamagen(size: str, kind: str, block: int):
    """Our LlamaGen GPT at a released size (llamagen_gpt.GPT_SIZES) with its VQ-16; t2i with the FLAN-T5-XL
    encoder (24 blocks, width 2048, FFN 5120: google/flan-t5-xl's config)."""
    def build():
        from sjdvp_core.models.llamagen.adapter import LlamaGenAdapter
        from sjdvp_core.models.llamagen.gpt import GPT_SIZES, GPTConfig, LlamaGenGPT
        from sjdvp_core.models.llamagen.vq import LlamaGenVQ, VQConfig
        layers, heads, dim = GPT_SIZES[size]
        extra = dict(cls_token_num=120) if kind == "t2i" else {}
        with torch.device("meta"):
            gpt = LlamaGenGPT(GPTConfig(dim=dim, n_layer=layers, n_head=heads, model_type=kind, block_size=block,
                                        **extra))
            vq = LlamaGenVQ(VQConfig())
            text = _flan_t5_xl() if kind == "t2i" else None
        return LlamaGenAdapter(gpt, vq, text_encoder=text, device="meta", dtype=torch.bfloat16)
    return build


def _flan_t5_xl():
    from transformers import T5Config, T5EncoderModel

    class Encoder:            # what LlamaGenAdapter reads of a T5CaptionEncoder
        model = T5EncoderModel(T5Config(vocab_size=32128, d_model=2048, d_kv=64, d_ff=5120, num_layers=24,
                                        num_heads=32, feed_forward_proj="gated-gelu"))
    return Encoder()


def glm_image() -> Shape:
    """GLM-Image's token stage (transformers' GlmImageConfig defaults, its "GLM-Image style" sizes: the 9B GLM-4
    stack, hidden 4096, 40 layers, 2 KV heads, with the vision encoder and VQ encoder it loads beside), at the
    default 1024 x 1024: a 16 x 16 prior grid, the 32 x 32 image grid, the end token. Its DiT is apart (loaded
    alone after the decode), so not in these rows."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration
    with torch.device("meta"):
        model = GlmImageForConditionalGeneration(GlmImageConfig())
    codes = model.config.vq_config.num_embeddings
    prior, image = torch.arange(256).view(16, 16), 256 + torch.arange(1024).view(32, 32)
    forced = torch.full((256 + 1024 + 1,), -1)
    forced[-1] = codes + 1
    layout = TokenLayout(torch.arange(codes), torch.tensor([codes + 1]), forced, image, (prior,))
    return Shape(model, model.model.language_model, layout, torch.nn.Module(), glm.SAMPLING,
                 logits_width=model.config.text_config.vision_vocab_size)


class PixelShape:
    """A pixel model apart (pixels_apart) on the meta device: what models.memory.pixel_weight_need reads."""

    def __init__(self, image_decoder: torch.nn.Module, blocks: list[torch.nn.Module]):
        self.image_decoder, self.blocks = image_decoder, blocks

    def pixel_blocks(self) -> list[torch.nn.Module]:
        return self.blocks


def glm_image_dit() -> PixelShape:
    """GLM-Image's pixel stage without its VAE: the 7B DiT at the release's sizes (hidden 32 x 128, 30 blocks, glyph
    features of 1472, as FastVideo's GlmImageDiTConfig records them; diffusers' defaults are a smaller model) and
    its glyph encoder, ByT5-small's encoder (google/byt5-small's config). The VAE's config was not to be had here,
    so it is not counted, nor the DiT's activations: its rows are weights only."""
    from diffusers import GlmImageTransformer2DModel
    from transformers import T5Config, T5EncoderModel
    with torch.device("meta"):
        dit = GlmImageTransformer2DModel(num_attention_heads=32, attention_head_dim=128, num_layers=30,
                                         text_embed_dim=1472)
        glyphs = T5EncoderModel(T5Config(vocab_size=384, d_model=1472, d_kv=64, d_ff=3584, num_layers=12,
                                         num_heads=6, feed_forward_proj="gated-gelu"))
    return PixelShape(torch.nn.ModuleDict({"transformer": dit, "text_encoder": glyphs}),
                      list(dit.transformer_blocks))


@dataclass(frozen=True)
class Release:
    name: str            # a catalogue entry's name (or the release's, where the catalogue has none yet)
    build: Callable
    image: str
    pixels: bool = False   # a pixel model apart: its weights alone (it runs after the decode, on its own)


RELEASES = (
    Release("GLM-Image (token stage)", glm_image, "1024 x 1024"),
    Release("GLM-Image (DiT + glyph encoder, weights)", glm_image_dit, "1024 x 1024", pixels=True),
    Release("Lumina-mGPT-7B-768", lumina_768, "768 x 768"),
    Release("Lumina-mGPT-2.0", lumina2_768, "768 x 768"),
    Release("Emu3-Gen", emu3_gen, "720 x 720"),
    Release("Janus-Pro-7B", janus_pro(4096, 30, 11008, 32), "384 x 384"),
    Release("Janus-Pro-1B", janus_pro(2048, 24, 5632, 16), "384 x 384"),
    Release("LlamaGen-t2i-XL-512", llamagen("GPT-XL", "t2i", 1024), "512 x 512"),
    Release("LlamaGen-c2i-XL-384", llamagen("GPT-XL", "c2i", 576), "384 x 384"),
)


def needs(release: Release) -> dict[str, Need]:
    """What the release needs at each precision (bf16 compute), with its default decode."""
    adapter = release.build()
    if release.pixels:
        return {p: Need(p, pixel_weight_need(adapter, p, "bf16"), 0) for p in PRECISIONS}
    return {p: need(adapter, p, "bf16") for p in PRECISIONS}


def fits(total: int) -> str:
    """The smallest listed card that holds `total` bytes beside RESERVE."""
    card = next((gb for gb in CARDS_GB if total + RESERVE <= gb * 1e9), None)
    return f"{card} GB" if card else f"over {CARDS_GB[-1]} GB"


def table() -> str:
    """Markdown: per release, the decode's share and each precision's total with the smallest card it fits."""
    lines = ["| release | image | decode | " + " | ".join(PRECISIONS) + " |",
             "|---|---|---|" + "---|" * len(PRECISIONS)]
    for r in RELEASES:
        n = needs(r)
        cells = " | ".join(f"{n[p].total / 1e9:.1f} GB: {fits(n[p].total)}" for p in PRECISIONS)
        decode = "apart" if r.pixels else f"{n['bf16'].decode / 1e9:.1f} GB"
        lines.append(f"| {r.name} | {r.image} | {decode} | {cells} |")
    return "\n".join(lines)


def readme_with(text: str, readme: str) -> str:
    start, stop = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + text + "\n" + readme[stop:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true",
                        help="put the table in README.md and docs/memory.md between their markers")
    args = parser.parse_args()
    text = table()
    print(text)
    for page in PAGES if args.write else ():
        with open(page, encoding="utf-8") as f:
            old = f.read()
        with open(page, "w", encoding="utf-8") as f:
            f.write(readme_with(text, old))


if __name__ == "__main__":
    main()
