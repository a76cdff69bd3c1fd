"""A tiny GLM-Image folder in the release's diffusers layout: model_index.json naming GlmImagePipeline, the token
stage in vision_language_encoder/ (transformers' GlmImageForConditionalGeneration at tiny sizes, with the release's
shape choices: 2 key/value heads, a head scoring the codes and a few more ids, half the head dimension rotated in
three sections), its generation_config.json, and processor/ (transformers' GlmImageProcessor with a byte-level
BPE tokenizer whose first ids are the <|dit_token_k|> codes, image start and end, as the release's are, and a
GLM-4-style chat template of our own: the release's is not readable offline)."""
from __future__ import annotations

import json
import os

import torch

from tests.helpers.tiny_hf import byte_bpe_tokenizer, spread_weights

CODES = 32
DIT = [f"<|dit_token_{i}|>" for i in range(CODES + 2)]          # the codes, then image start and end
TEXT_SPECIALS = ["<sop>", "<eop>", "<|image|>", "<|endoftext|>", "[gMASK]", "<|user|>", "<|assistant|>"]
TEMPLATE = ("[gMASK]<sop>{% for m in messages %}<|{{ m['role'] }}|>\n{% for c in m['content'] %}"
            "{% if c['type'] == 'image' %}<|image|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}"
            "<|assistant|>\n")
SAMPLING = {"temperature": 0.9, "top_p": 0.75, "do_sample": True}   # the values the issue quotes for the release


def tiny_model(vocab_size: int, pad: int, image_token: int, seed: int = 0):
    from transformers import GlmImageConfig, GlmImageForConditionalGeneration
    config = GlmImageConfig(
        text_config=dict(vocab_size=vocab_size, vision_vocab_size=CODES + 8, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, pad_token_id=pad,
                         eos_token_id=CODES + 1, max_position_embeddings=2048,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1],
                                          "partial_rotary_factor": 0.5}),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, patch_size=16, image_size=64),
        vq_config=dict(embed_dim=16, num_embeddings=CODES, latent_channels=32),
        image_token_id=image_token, image_start_token_id=CODES, image_end_token_id=CODES + 1)
    torch.manual_seed(seed)
    model = GlmImageForConditionalGeneration(config).eval()
    spread_weights(model, seed=seed)
    return model


def write_glm_image(folder: str, sampling: dict | None = None) -> str:
    from transformers import GlmImageProcessor, PreTrainedTokenizerFast
    from transformers.models.glm_image.image_processing_pil_glm_image import GlmImageImageProcessorPil
    processor_dir, encoder_dir = os.path.join(folder, "processor"), os.path.join(folder, "vision_language_encoder")
    os.makedirs(processor_dir)
    tok = byte_bpe_tokenizer(processor_dir, DIT + TEXT_SPECIALS, vocab_size=400)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=os.path.join(processor_dir, "tokenizer.json"), bos_token=DIT[CODES], eos_token=DIT[CODES + 1],
        pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": "<|image|>", "grid_bos_token": "<sop>", "grid_eos_token": "<eop>"})
    image_processor = GlmImageImageProcessorPil(patch_size=16, merge_size=1, temporal_patch_size=1)
    GlmImageProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=TEMPLATE
                      ).save_pretrained(processor_dir)
    model = tiny_model(tok.get_vocab_size(), tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|image|>"))
    model.save_pretrained(encoder_dir)
    with open(os.path.join(encoder_dir, "generation_config.json"), "w") as f:
        json.dump(SAMPLING if sampling is None else sampling, f)
    with open(os.path.join(folder, "model_index.json"), "w") as f:
        json.dump({"_class_name": "GlmImagePipeline", "_diffusers_version": "0.37.0",
                   "processor": ["transformers", "GlmImageProcessor"],
                   "vision_language_encoder": ["transformers", "GlmImageForConditionalGeneration"]}, f)
    return folder
