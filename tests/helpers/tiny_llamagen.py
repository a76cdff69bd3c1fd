"""Tiny random LlamaGen models in the official classes and key names (the GPT of
github.com/FoundationVision/LlamaGen's gpt.py, its VQ-16 tokenizer), for every test that needs a
LlamaGen checkpoint on disk: the loaders, the registry, the check command, downloads, the nodes,
quantisation. Also the tiny FLAN-T5 encoder folder a text-to-image GPT reads its captions with, and
the c2i release's repository id and file bytes for a fake Hub."""

from __future__ import annotations

import io
import json

import torch

from sjdvp_core.models.llamagen.gpt import GPTConfig, LlamaGenGPT
from sjdvp_core.models.llamagen.vq import LlamaGenVQ, VQConfig

GPT_TINY = GPTConfig(dim=128, n_layer=2, n_head=2, vocab_size=64, block_size=16, num_classes=10)
# VQ-16's channel multipliers (downsample 16), at widths small enough for the CPU
VQ_TINY = VQConfig(
    codebook_size=64,
    codebook_embed_dim=8,
    ch=32,
    ch_mult=[1, 1, 2, 2, 4],
    z_channels=32,
    num_res_blocks=1,
)
C2I = "FoundationVision/LlamaGen"  # the real repository id: the tiny files stand in for its files
# the tiny T5's whole vocabulary: the words of the test captions, ids as T5's (<pad> 0, </s> 1)
WORDS = ["<pad>", "</s>", "<unk>", "a", "red", "fox", "in", "the", "snow", "blue", "sky"]


def random_gpt(config=GPT_TINY, seed=0):
    """A GPT with weights spread far from the init (std 0.3), so greedy argmaxes are not ties."""
    torch.manual_seed(seed)
    model = LlamaGenGPT(config)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model


GPT_T2I_TINY = GPTConfig(
    dim=128,
    n_layer=2,
    n_head=2,
    vocab_size=64,
    block_size=16,
    model_type="t2i",
    caption_dim=32,
    cls_token_num=120,
)


def random_t2i_gpt() -> LlamaGenGPT:
    """A text-to-image GPT reading 120 caption tokens from a 32-wide T5, with weights large enough
    that its distributions are far from uniform."""
    torch.manual_seed(1)
    gpt = LlamaGenGPT(GPT_T2I_TINY)
    for p in gpt.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return gpt


def random_vq(seed=0):
    torch.manual_seed(seed)
    return LlamaGenVQ(VQ_TINY)


def saved(obj) -> bytes:
    """obj as torch.save writes it (the release's .pt files), for a fake Hub to serve."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_t5(d) -> str:
    """A tiny FLAN-T5 encoder folder (config, safetensors, tokenizer.json) in the existing
    folder d."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import T5Config, T5EncoderModel

    torch.manual_seed(0)
    T5EncoderModel(
        T5Config(
            vocab_size=len(WORDS),
            d_model=32,
            d_kv=8,
            num_heads=4,
            d_ff=64,
            num_layers=2,
            pad_token_id=0,
            eos_token_id=1,
        )
    ).save_pretrained(d)
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", 1)]
    )
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "pad_token": "<pad>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 120,
            }
        )
    )
    return str(d)


# a reference to complete, as ComfyUI holds an IMAGE: [H, W, 3] floats in [0, 1] (not square)
REFERENCE = torch.rand(40, 36, 3, generator=torch.Generator().manual_seed(0))


def edits(prompts=("golden retriever", "tabby")) -> list:
    """Completions of one reference: its upper half given, the lower half drawn."""
    from sjdvp_core.engine.adapter import Edit

    return [Edit(p, (REFERENCE,)) for p in prompts]
