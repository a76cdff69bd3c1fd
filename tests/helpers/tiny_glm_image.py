"""A tiny GLM-Image folder in the release's diffusers layout, written by
GlmImagePipeline.save_pretrained: model_index.json, the DiT, VAE and ByT5 glyph encoder in their
folders, the token stage in vision_language_encoder/ (transformers'
GlmImageForConditionalGeneration at tiny sizes, with the release's shape choices: 2 key/value
heads, a head scoring the codes and a few more ids, half the head dimension rotated in three
sections), its generation_config.json, and processor/ (transformers' GlmImageProcessor with a
byte-level BPE tokenizer whose first ids are the <|dit_token_k|> codes, image start and end, as
the release's are, and a GLM-4-style chat template of our own: the release's is not readable
offline)."""

from __future__ import annotations

import json
import os

import torch

from tests.helpers.tiny_hf import byte_bpe_tokenizer, spread_weights

CODES = 32
DIT = [f"<|dit_token_{i}|>" for i in range(CODES + 2)]  # the codes, then image start and end
TEXT_SPECIALS = [
    "<sop>",
    "<eop>",
    "<|image|>",
    "<|endoftext|>",
    "[gMASK]",
    "<|user|>",
    "<|assistant|>",
]
# a source image between image start and end
TEMPLATE = (
    "[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{% for c in m['content'] %}"
    "{% if c['type'] == 'image' %}"
    + DIT[CODES]
    + "<|image|>"
    + DIT[CODES + 1]
    + "{% else %}{{ c['text'] }}"
    "{% endif %}{% endfor %}{% endfor %}<|assistant|>\n"
)
# the values the issue quotes for the release
SAMPLING = {
    "temperature": 0.9,
    "top_p": 0.75,
    "do_sample": True,
}


def tiny_model(vocab_size: int, pad: int, image_token: int, seed: int = 0):
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration

    config = GlmImageConfig(
        text_config=dict(
            vocab_size=vocab_size,
            vision_vocab_size=CODES + 8,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            pad_token_id=pad,
            eos_token_id=CODES + 1,
            max_position_embeddings=2048,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "mrope_section": [2, 1, 1],
                "partial_rotary_factor": 0.5,
            },
        ),
        vision_config=dict(
            depth=1, hidden_size=32, num_heads=2, intermediate_size=32, patch_size=16, image_size=64
        ),
        vq_config=dict(embed_dim=16, num_embeddings=CODES, latent_channels=32),
        image_token_id=image_token,
        image_start_token_id=CODES,
        image_end_token_id=CODES + 1,
    )
    torch.manual_seed(seed)
    model = GlmImageForConditionalGeneration(config).eval()
    spread_weights(model, seed=seed)
    return model


def tiny_dit():
    """The pixel stage's parts at tiny sizes (as diffusers' own GLM-Image pipeline test builds
    them): the DiT over the codes, a 4-channel VAE (8x), a one-layer T5 glyph encoder, ByT5's
    tokenizer (it needs no files)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, GlmImageTransformer2DModel
    from transformers import ByT5Tokenizer, T5Config, T5EncoderModel

    torch.manual_seed(1)
    glyph = T5EncoderModel(
        T5Config(
            vocab_size=384,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_heads=4,
            relative_attention_num_buckets=8,
        )
    )
    dit = GlmImageTransformer2DModel(
        patch_size=2,
        in_channels=4,
        out_channels=4,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        text_embed_dim=32,
        time_embed_dim=16,
        condition_dim=8,
        prior_vq_quantizer_codebook_size=CODES,
    )
    vae = AutoencoderKL(
        block_out_channels=(4, 8, 16, 16),
        in_channels=3,
        out_channels=3,
        latent_channels=4,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        norm_num_groups=4,
        sample_size=64,
        latents_mean=[0.0] * 4,
        latents_std=[1.0] * 4,
    )
    return dict(
        tokenizer=ByT5Tokenizer(),
        text_encoder=glyph.eval(),
        transformer=dit.eval(),
        vae=vae.eval(),
        scheduler=FlowMatchEulerDiscreteScheduler(),
    )


def write_glm_image(folder: str, sampling: dict | None = None) -> str:
    """The whole release folder, written by diffusers' GlmImagePipeline.save_pretrained as the
    release was."""
    import tempfile

    from diffusers import GlmImagePipeline
    from transformers import GlmImageProcessor, PreTrainedTokenizerFast
    from transformers.models.glm_image.image_processing_pil_glm_image import (
        GlmImageImageProcessorPil,
    )

    with tempfile.TemporaryDirectory() as build:
        tok = byte_bpe_tokenizer(build, DIT + TEXT_SPECIALS, vocab_size=400)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=os.path.join(build, "tokenizer.json"),
            bos_token=DIT[CODES],
            eos_token=DIT[CODES + 1],
            pad_token="<|endoftext|>",
            extra_special_tokens={
                "image_token": "<|image|>",
                "grid_bos_token": "<sop>",
                "grid_eos_token": "<eop>",
            },
        )
    image_processor = GlmImageImageProcessorPil(patch_size=16, merge_size=1, temporal_patch_size=1)
    processor = GlmImageProcessor(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=TEMPLATE
    )
    model = tiny_model(
        tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|image|>")
    )
    GlmImagePipeline(
        processor=processor, vision_language_encoder=model, **tiny_dit()
    ).save_pretrained(folder)
    with open(os.path.join(folder, "vision_language_encoder", "generation_config.json"), "w") as f:
        json.dump(SAMPLING if sampling is None else sampling, f)
    return folder


# an edit's source images, as ComfyUI holds an IMAGE: [H, W, 3] floats in [0, 1]
SOURCE = torch.rand(64, 64, 3, generator=torch.Generator().manual_seed(0))
WIDE = torch.rand(32, 48, 3, generator=torch.Generator().manual_seed(1))


def edits() -> list:
    """Two edits of one source image: the tiny model's conditions with references."""
    from sjdvp_core.engine.adapter import Edit

    return [Edit("make it snow", (SOURCE,)), Edit("a sky above it", (SOURCE,))]
