"""The releases' architectures, built from their configs' sizes without reading a weight: on the meta
device for the memory table (tools/memory_table.py: what each precision needs;
tests/models/test_memory_table.py holds each to its release's download size), or on a device with random
weights, at real size or as a tiny stand-in of the same structure, for the GPU check
(benchmarks/gpu_check.py: what a pass costs there, measured).

Each is its family's model driven as that family's adapter drives it (cache, masks, RoPE, the
generated tokens' embedding and head; LlamaGen and GLM-Image through their own adapters), at the
family's default image, with a prompt of PROMPT ids where a tokenizer would make one. A builder
takes (device, dtype, tiny) and says where its sizes come from; tiny keeps the structure (the same
layers, heads in the same proportion, the same layout) at a size a CPU runs in a test."""

from __future__ import annotations

from typing import Callable

import torch

from sjdvp_core.engine.adapter import TokenLayout
from sjdvp_core.engine.settings import SamplingSettings
from sjdvp_core.models.hf_adapter import HFAdapter, dtype_kwarg

PROMPT = 64  # prompt ids before the image, in place of a tokenizer's prompt
TINY_GRID = 6  # a tiny build's image grid side, in tokens
LLAMA_7B = dict(
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
)


class ReleaseShape(HFAdapter):
    """A transformers release's model as the engine drives it, without a tokenizer: the family's
    embedding of generated tokens and head (default: the input embeddings and lm_head), its
    layout and default sampling, a prompt of PROMPT ids; the image decoder (not run here) beside
    it where it is not part of the model."""

    def __init__(
        self,
        model,
        lm,
        layout: TokenLayout,
        sampling: SamplingSettings,
        device,
        head: Callable | None = None,
        embed: Callable | None = None,
        decoder: torch.nn.Module | None = None,
        logits_width: int | None = None,
    ):
        super().__init__(model, lm, lm.config, layout, 0, device)
        self._head = head if head is not None else model.lm_head
        self._embed, self.sampling, self._width = embed, sampling, logits_width
        # the image decoder in float32, as the family adapters keep it (decoding in fp32)
        self.image_decoder = decoder.float() if decoder is not None else torch.nn.Module()
        if decoder is not None and not any(m is decoder for m in model.modules()):
            self.module = torch.nn.ModuleDict({"model": model, "decoder": decoder})

    @property
    def default_sampling(self) -> SamplingSettings:
        return self.sampling

    @property
    def logits_width(self) -> int:
        return self._width or self.text_config.vocab_size

    def prompt_ids(self, conditions, negatives, cfg):
        return [list(range(1, PROMPT + 1))] * (2 * len(conditions) if cfg else len(conditions))

    def embed(self, tokens):
        return self._embed(tokens) if self._embed is not None else super().embed(tokens)

    def head(self, hidden):
        return self._head(hidden)


class JanusEditShape(ReleaseShape):
    """Janus-4o editing with one reference, as the engine drives it: three row groups with cfg, the
    prompt grown by the reference's two blocks of 576 tokens and their four markers, the reference
    towers moved in for the prefill."""

    def row_groups(self, conditions, cfg: bool) -> int:
        return 3 if cfg else 1

    def prompt_ids(self, conditions, negatives, cfg):
        ids = list(range(1, PROMPT + 2 * (576 + 2) + 1))
        return [ids] * (len(conditions) * self.row_groups(conditions, cfg))


class PanelEditShape(ReleaseShape):
    """Lumina-mGPT 2.0 Omni editing: the reference's rows (as many as the image's) in both rows'
    prompts, MoVQGAN's encoder moved in for the prefill."""

    def prompt_ids(self, conditions, negatives, cfg):
        ids = list(range(1, PROMPT + 3 + self.layout.length))  # the image's rows, less its end
        return [ids] * (len(conditions) * (2 if cfg else 1))


def sizes(tiny: bool, **real) -> dict:
    """A text stack's sizes as released, or a tiny stand-in of the same structure (grouped KV
    heads stay grouped)."""
    small = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2
        if real.get("num_key_value_heads", 32) < real["num_attention_heads"]
        else 4,
    )
    return {k: (small.get(k, v) if tiny else v) for k, v in real.items()}


def raster(codes: int, rows: int, cols: int, row_end: bool, suffix: int) -> TokenLayout:
    """A raster layout of the release's length (the ids are placeholders: only counts and places
    are read)."""
    return TokenLayout.raster(
        torch.arange(codes),
        rows,
        cols,
        row_end=codes if row_end else None,
        suffix=range(codes + 1, codes + 1 + suffix),
    )


def _chameleon(
    vocab: int,
    codes: int,
    grid: int,
    decoder: Callable,
    sampling: SamplingSettings,
    device,
    dtype,
    tiny: bool,
    shape: type = ReleaseShape,
    positions: int | None = None,
) -> ReleaseShape:
    """Lumina-mGPT 1.0 / 2.0: Chameleon-7B's stack (transformers' ChameleonConfig defaults: hidden
    4096, 32 layers, FFN 11008, 32 heads, QK-norm) with the release's vocabulary; its image
    decoder is ours (not transformers' VQ, dropped as lumina.py drops it; left out of a tiny
    build)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    g = TINY_GRID if tiny else grid
    config = ChameleonConfig(
        vocab_size=vocab,
        max_position_embeddings=positions or PROMPT + g * (g + 1) + 512,
        qk_layernorm=True,
        vocabulary_map={"<image>": 8711},
        **sizes(tiny, **LLAMA_7B),
    )
    with torch.device(device):
        model = ChameleonForConditionalGeneration._from_config(config, **dtype_kwarg(dtype))
        model.model.vqmodel = None
        image_decoder = None if tiny else decoder()
    return shape(
        model, model.model, raster(codes, g, g, True, 1), sampling, device, decoder=image_decoder
    )


def lumina_mgpt_7b(device="meta", dtype=torch.bfloat16, tiny=False) -> ReleaseShape:
    """Lumina-mGPT-7B-768: vocabulary 65536, 8192 codes, 768 px (48 x 49 tokens with the row
    ends)."""
    from sjdvp_core.models.lumina import adapter as lumina
    from sjdvp_core.models.lumina.vqgan import ChameleonVQGAN, VQGANConfig

    return _chameleon(
        65536,
        8192,
        768 // 16,
        lambda: ChameleonVQGAN(VQGANConfig()),
        lumina.SAMPLING,
        device,
        dtype,
        tiny,
    )


def lumina_mgpt_2(device="meta", dtype=torch.bfloat16, tiny=False) -> ReleaseShape:
    """Lumina-mGPT 2.0 at 768 px (96 x 97 tokens, 16384 codes). Vocabulary 172032: its config.json
    is not readable here; this is the size its 15.78 GB of bf16 shards imply with Chameleon-7B's
    stack (tests/models/test_memory_table.py holds it to that)."""
    from sjdvp_core.models.lumina2 import adapter as lumina2
    from sjdvp_core.models.lumina2.movqgan import MoVQConfig, MoVQGAN

    return _chameleon(
        172032,
        16384,
        768 // 8,
        lambda: MoVQGAN(MoVQConfig()),
        lumina2.SAMPLING,
        device,
        dtype,
        tiny,
    )


def lumina_mgpt_2_omni_edit(device="meta", dtype=torch.bfloat16, tiny=False) -> ReleaseShape:
    """Lumina-mGPT 2.0 Omni editing at 512 x 512 (upstream's i2i panels): 2.0's architecture and
    its 10,240 positions, the reference's 64 x 65 tokens in the prompt, MoVQGAN-270M's encoder
    (ch 256 x (1, 2, 2, 4), two blocks a level, attention at the lowest, as its decoder)."""
    from sjdvp_core.models.lumina2 import adapter as lumina2
    from sjdvp_core.models.lumina2.movqgan import EncoderConfig, MoVQConfig, MoVQEncoder, MoVQGAN

    shape = _chameleon(
        172032,
        16384,
        512 // 8,
        lambda: MoVQGAN(MoVQConfig()),
        lumina2.SAMPLING,
        device,
        dtype,
        tiny,
        PanelEditShape,
        positions=10240,
    )
    c = MoVQConfig()
    with torch.device(device):
        shape.reference_encoder = MoVQEncoder(
            EncoderConfig(c.channels[0], c.channels, 2, c.attn_levels, c.z_channels, c.embed_dim),
            torch.empty(c.n_embed, c.embed_dim),
        )
    return shape


def emu3_gen(device="meta", dtype=torch.bfloat16, tiny=False) -> ReleaseShape:
    """Emu3-Gen: transformers' Emu3Config defaults are its sizes (8B: hidden 4096, 32 layers, 8 KV
    heads, FFN 14336, vocabulary 184622; the VQ-VAE with 32768 codes, f8); the default 720 x 720
    image (90 x 91 tokens)."""
    from transformers import Emu3Config, Emu3ForConditionalGeneration

    from sjdvp_core.models.emu3 import adapter as emu3

    text = sizes(tiny, **LLAMA_7B | dict(intermediate_size=14336, num_key_value_heads=8))
    small_vq = dict(
        codebook_size=64,
        embed_dim=4,
        latent_channels=4,
        base_channels=32,
        channel_multiplier=[1, 2],
        num_res_blocks=1,
        attn_resolutions=[],
        hidden_size=64,
        num_attention_heads=1,
    )
    config = Emu3Config(
        vocabulary_map={"<|extra_200|>": 151846, "<image>": 151851},
        text_config=dict(vocab_size=184622, max_position_embeddings=9216, **text),
        **(dict(vq_config=small_vq) if tiny else {}),
    )
    with torch.device(device):
        model = Emu3ForConditionalGeneration._from_config(config, **dtype_kwarg(dtype))
    h, w = (TINY_GRID, TINY_GRID) if tiny else emu3.token_grid("1:1", emu3.IMAGE_AREA, 8, 9216)
    return ReleaseShape(
        model,
        model.model.text_model,
        raster(32768, h, w, True, 3),
        emu3.SAMPLING,
        device,
        decoder=model.model.vqmodel,
    )


def janus_pro(
    hidden: int, layers: int, ffn: int, heads: int, edit: bool = False
) -> Callable[..., ReleaseShape]:
    """Janus-Pro as released (deepseek-ai's files): a Llama stack of the given size (vocabulary
    102400), its generation aligner and head as wide as the stack, transformers' JanusConfig
    defaults for the rest (the 16384-code VQ, the SigLIP-L understanding tower edits run, held apart
    as the adapter holds it), less the text head janus.original leaves out; 384 px (24 x 24
    tokens). edit: decoding Janus-4o's edits (JanusEditShape)."""

    def build(device="meta", dtype=torch.bfloat16, tiny=False) -> ReleaseShape:
        from transformers import JanusConfig, JanusForConditionalGeneration

        from sjdvp_core.models.janus import adapter as janus
        from sjdvp_core.models.janus.original import without_unused

        text = sizes(
            tiny,
            hidden_size=hidden,
            num_hidden_layers=layers,
            intermediate_size=ffn,
            num_attention_heads=heads,
            num_key_value_heads=heads,
        )
        width = text["hidden_size"]
        vq = dict(projection_dim=width, image_token_embed_dim=width)
        if tiny:
            vq |= dict(
                embed_dim=8,
                num_embeddings=64,
                base_channels=32,
                channel_multiplier=[1, 2],
                num_res_blocks=1,
                latent_channels=8,
            )
        # the understanding tower edits run: transformers' defaults are Janus's SigLIP-L at 384 px
        vision = dict(projection_dim=width)
        if tiny:
            vision |= dict(
                hidden_size=64,
                num_hidden_layers=1,
                num_attention_heads=1,
                image_size=32,
                patch_size=8,
                num_image_tokens=16,
            )
        config = JanusConfig(
            text_config=dict(
                model_type="llama", vocab_size=102400, max_position_embeddings=16384, **text
            ),
            vision_config=vision,
            vq_config=vq,
        )
        with torch.device(device):
            model = without_unused(
                JanusForConditionalGeneration._from_config(config, **dtype_kwarg(dtype))
            )
        g = TINY_GRID if tiny else 24
        codes = config.vq_config.num_embeddings
        towers = janus.ReferenceTowers(
            model.model
        )  # apart from the module, as the adapter keeps them
        shape = (JanusEditShape if edit else ReleaseShape)(
            model,
            model.model.language_model,
            raster(codes, g, g, False, 0),
            janus.SAMPLING,
            device,
            head=model.model.generation_head,
            embed=model.prepare_embeddings_for_image_generation,
            decoder=model.model.vqmodel,
            logits_width=codes,
        )
        shape.reference_encoder = towers
        return shape

    return build


def llamagen(size: str, kind: str, block: int) -> Callable:
    """Our LlamaGen GPT at a released size (llamagen.gpt.GPT_SIZES) with its VQ-16, through its own
    adapter; t2i with the FLAN-T5-XL encoder (24 blocks, width 2048, FFN 5120:
    google/flan-t5-xl's config)."""

    def build(device="meta", dtype=torch.bfloat16, tiny=False):
        from sjdvp_core.models.llamagen.adapter import SAMPLING, LlamaGenAdapter
        from sjdvp_core.models.llamagen.gpt import GPT_SIZES, GPTConfig, LlamaGenGPT
        from sjdvp_core.models.llamagen.vq import LlamaGenVQ, VQConfig

        layers, heads, dim = (2, 4, 64) if tiny else GPT_SIZES[size]
        extra = dict(cls_token_num=120) if kind == "t2i" else {}
        with torch.device(device):
            gpt = LlamaGenGPT(
                GPTConfig(
                    dim=dim,
                    n_layer=layers,
                    n_head=heads,
                    model_type=kind,
                    block_size=TINY_GRID**2 if tiny else block,
                    **extra,
                )
            )
            vq = LlamaGenVQ(
                VQConfig(ch=8, z_channels=8, ch_mult=[1, 1, 2, 2, 4], norm_groups=4)
                if tiny
                else VQConfig()
            )
            text = _flan_t5_xl() if kind == "t2i" else None
        return LlamaGenAdapter(
            gpt, vq, text_encoder=text, sampling=SAMPLING[kind], device=device, dtype=dtype
        )

    return build


def _flan_t5_xl():
    from transformers import T5Config, T5EncoderModel

    class Encoder:  # what LlamaGenAdapter reads of a T5CaptionEncoder
        model = T5EncoderModel(
            T5Config(
                vocab_size=32128,
                d_model=2048,
                d_kv=64,
                d_ff=5120,
                num_layers=24,
                num_heads=32,
                feed_forward_proj="gated-gelu",
            )
        )

    return Encoder()


def glm_image(device="meta", dtype=torch.bfloat16, tiny=False):
    """GLM-Image's token stage (transformers' GlmImageConfig defaults, its "GLM-Image style" sizes:
    the 9B GLM-4 stack, hidden 4096, 40 layers, 2 KV heads, with the vision encoder and VQ it
    loads beside) through its own adapter (3-D RoPE over the prior grid then the image grid), at
    1024 x 1024: 16 x 16 then 32 x 32 tokens and the end token, one row (no CFG). Its DiT is
    apart (glm_image_dit)."""
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    from sjdvp_core.models.glm_image import adapter as glm

    text = dict(
        hidden_size=4096,
        intermediate_size=13696,
        num_hidden_layers=40,
        num_attention_heads=32,
        num_key_value_heads=2,
    )
    rope = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.5,
        "mrope_section": [2, 1, 1] if tiny else [8, 12, 12],
    }
    small = dict(
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32),
        vq_config=dict(embed_dim=16, num_embeddings=64, latent_channels=32),
    )
    config = GlmImageConfig(
        text_config=dict(rope_parameters=rope, **sizes(tiny, **text)), **(small if tiny else {})
    )
    with torch.device(device):
        model = GlmImageForConditionalGeneration._from_config(config, **dtype_kwarg(dtype))
    side = 96 if tiny else 1024

    class Grids:  # what GlmImageAdapter asks of the processor here: the grids of a size
        def __call__(self, text, target_h, target_w):
            return {
                "image_grid_thw": torch.tensor(
                    [[1, target_h // 32, target_w // 32], [1, target_h // 64, target_w // 64]]
                )
            }

        def apply_chat_template(self, messages, processor_kwargs=None):
            raise NotImplementedError("a release shape's prompt is PROMPT ids")

    class Shape(glm.GlmImageAdapter):
        def prompt_ids(self, conditions, negatives, cfg):
            return [list(range(1, PROMPT + 1))] * len(conditions)

        def prompt_length(self, conditions, negatives, cfg):
            return None if conditions is None else PROMPT

    dit = type("NoDiT", (), {"module": torch.nn.Module()})()
    return Shape(model, Grids(), glm.SAMPLING, dit, side, side, device)


class PixelShape:
    """A pixel model apart (pixels_apart) on the meta device: what
    models.memory.pixel_weight_need reads."""

    def __init__(self, image_decoder: torch.nn.Module, blocks: list[torch.nn.Module]):
        self.image_decoder, self.blocks = image_decoder, blocks

    def pixel_blocks(self) -> list[torch.nn.Module]:
        return self.blocks


def glm_image_dit() -> PixelShape:
    """GLM-Image's pixel stage without its VAE, on the meta device: the 7B DiT at the release's
    sizes (hidden 32 x 128, 30 blocks, glyph features of 1472, as FastVideo's GlmImageDiTConfig
    records them; diffusers' defaults are a smaller model) and its glyph encoder, ByT5-small's
    encoder (google/byt5-small's config). The VAE's config was not to be had here, so it is not
    counted, nor the DiT's activations: weights only."""
    from diffusers import GlmImageTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    with torch.device("meta"):
        dit = GlmImageTransformer2DModel(
            num_attention_heads=32, attention_head_dim=128, num_layers=30, text_embed_dim=1472
        )
        glyphs = T5EncoderModel(
            T5Config(
                vocab_size=384,
                d_model=1472,
                d_kv=64,
                d_ff=3584,
                num_layers=12,
                num_heads=6,
                feed_forward_proj="gated-gelu",
            )
        )
    return PixelShape(
        torch.nn.ModuleDict({"transformer": dit, "text_encoder": glyphs}),
        list(dit.transformer_blocks),
    )
