"""A tiny random Lumina-mGPT 2.0 folder laid out as Alpha-VLLM/Lumina-mGPT-2.0 is: config.json of a
Chameleon model (vocabulary map, q/k norms per model-parallel shard), sharded safetensors with an
index, a Qwen-style tokenizer.json (a byte-level BPE whose base vocabulary fills ids 0..151642,
Qwen's special tokens from 151643, Lumina's from 151665: <racm3:break>, <eoss>,
<reserved08796..08799>, then the end of turn and the resolution tokens), a Qwen2
tokenizer_config.json (no bos_token), and movqgan/movqgan_270M.ckpt: a tiny random MoVQGAN as a
plain state dict, encoder keys included, as ai-forever/MoVQGAN releases it. Image code c is
vocabulary id 155000 + c, as in the release; the model's vocabulary ends just past the codes.

Whether the release's tokenizer.json lists the image ids is not known here (its size, 10.8 MB
against Qwen's 7.0 MB, says it likely holds about 19,700 added tokens: Lumina's reserved tokens
up to 154999 and one per image code, named `<MOVQGAN...` as upstream's get_image_tokens looks
them up in config.json's vocabulary map). `image_names` builds that shape; without it the image
ids have no entry."""

from __future__ import annotations

import json
import os

import torch

from sjdvp_core.models.lumina2.adapter import IMAGE_BASE
from tests.helpers.tiny_hf import byte_bpe_tokenizer, spread_weights, write_shards

CODES = 32  # the tiny MoVQGAN's codebook
MAX_GRIDS = 8  # resolution tokens <reserved08801> .. <reserved08808>
POSITIONS = 160  # max_position_embeddings: 64 x 64 px fits, 96 x 96 does not
QWEN_BASE = 151643  # Qwen2's byte-level BPE vocabulary: ids 0 .. 151642
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [
    f"<|qwen_extra_{i}|>" for i in range(19)
]
LUMINA_SPECIALS = [
    "<racm3:break>",
    "<eoss>",
    "<reserved08796>",
    "<reserved08797>",
    "<reserved08798>",
    "<reserved08799>",
    "<reserved08706>",
]
# resolution tokens
LUMINA_SPECIALS += [f"<reserved{8800 + n:05d}>" for n in range(1, MAX_GRIDS + 1)]
MOVQ = dict(channels=(32, 32, 32, 32), blocks=2, attn_levels=(3,), n_embed=CODES)


def qwen_tokenizer(
    folder: str, gap: bool = False, image_names: str | None = None
) -> dict[str, int]:
    """tokenizer.json + tokenizer_config.json; the vocabulary {name: id}. gap=True leaves the base
    vocabulary short of 151643 entries, so the added tokens' ids in the file leave a gap (as a
    cut-down file would). image_names (a format of the code, "<MOVQGAN_{}>") lists the image
    codes as added special tokens at 155000 + c, after reserved tokens that fill the ids up to
    them."""
    tok = byte_bpe_tokenizer(folder, [], vocab_size=300)
    path = os.path.join(folder, "tokenizer.json")
    with open(path) as f:
        data = json.load(f)
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), QWEN_BASE - (1000 if gap else 0)):
        vocab[f"<|filler_{i}|>"] = i  # unreachable by merges: only the ids matter
    names = QWEN_SPECIALS + LUMINA_SPECIALS
    if image_names:
        fill = IMAGE_BASE - QWEN_BASE - len(names)
        names += [f"<reserved{9000 + n:05d}>" for n in range(fill)] + [
            image_names.format(c) for c in range(CODES)
        ]
    data["added_tokens"] = [
        {
            "id": QWEN_BASE + i,
            "content": name,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, name in enumerate(names)
    ]
    with open(path, "w") as f:
        json.dump(data, f)
    config = {
        "add_prefix_space": False,
        "bos_token": None,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": 131072,
        "tokenizer_class": "Qwen2Tokenizer",
        "split_special_tokens": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k != "id"} for t in data["added_tokens"]
        },
    }
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    os.remove(os.path.join(folder, "special_tokens_map.json"))  # the release has none
    del tok
    return {**vocab, **{t["content"]: t["id"] for t in data["added_tokens"]}}


def config_json(vocab: dict[str, int], positions: int = POSITIONS) -> dict:
    return {
        "architectures": ["ChameleonForConditionalGeneration"],
        "model_type": "chameleon",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151666,
        "pad_token_id": None,
        "hidden_act": "silu",
        "hidden_size": 16,
        "initializer_range": 0.02,
        "intermediate_size": 32,
        "max_position_embeddings": positions,
        "mlp_bias": False,
        "model_parallel_size": 1,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "swin_norm": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.45.0",
        "use_cache": True,
        "vocab_size": IMAGE_BASE + CODES,
        "vq_config": {
            "attn_resolutions": [],
            "base_channels": 32,
            "channel_multiplier": [1, 1],
            "double_latent": False,
            "embed_dim": 4,
            "in_channels": 3,
            "latent_channels": 4,
            "num_embeddings": CODES,
            "num_res_blocks": 1,
            "out_channels": 3,
            "resolution": 32,
        },
        "vocabulary_map": vocab,
    }


def write_movqgan(folder: str, seed: int = 0) -> str:
    """movqgan/movqgan_270M.ckpt: a plain state dict (decoder, codebook, post_quant_conv, and the
    encoder and quant_conv that edits tokenise a reference with)."""
    from sjdvp_core.models.lumina2.movqgan import EncoderConfig, MoVQConfig, MoVQEncoder, MoVQGAN

    torch.manual_seed(seed)
    model = MoVQGAN(MoVQConfig(**MOVQ))
    spread_weights(model, std=0.1, seed=seed)
    encoder = MoVQEncoder(
        EncoderConfig(32, MOVQ["channels"], 1, MOVQ["attn_levels"], 4, 4), model.codebook()
    )
    spread_weights(encoder, std=0.1, seed=seed + 1)
    state = dict(model.state_dict()) | encoder.state_dict()
    os.makedirs(os.path.join(folder, "movqgan"), exist_ok=True)
    path = os.path.join(folder, "movqgan", "movqgan_270M.ckpt")
    torch.save(state, path)
    return path


def write_lumina2(
    folder: str,
    seed: int = 0,
    movqgan: bool = True,
    gap: bool = False,
    image_names: str | None = None,
    positions: int = POSITIONS,
) -> str:
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    os.makedirs(folder, exist_ok=True)
    vocab = qwen_tokenizer(folder, gap=gap, image_names=image_names)
    config = config_json(vocab, positions)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    model = ChameleonForConditionalGeneration(
        ChameleonConfig(
            **{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")}
        )
    )
    spread_weights(model, seed=seed)
    state = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("model.vqmodel.")
    }
    g = torch.Generator().manual_seed(seed)
    # per model-parallel shard: [1, D]
    for k in [k for k in state if "_norm." in k and "self_attn" in k]:
        state[k] = 1 + 0.5 * torch.randn(1, state[k].shape[1], generator=g)
    write_shards(folder, state)
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": 151643, "eos_token_id": 151666}, f)
    if movqgan:
        write_movqgan(folder, seed)
    return folder


# an edit's reference (a depth map, say), as ComfyUI holds an IMAGE: [H, W, 3] floats in [0, 1]
REFERENCE = torch.rand(40, 48, 3, generator=torch.Generator().manual_seed(0))
OMNI_POSITIONS = 1024  # Omni's dual-panel request is long in the tiny byte-level tokenizer


def edits() -> list:
    """Two edits of one reference: Omni's conditions (what the reference shows | the picture)."""
    from sjdvp_core.engine.adapter import Edit

    return [
        Edit("depth map | a red fox", (REFERENCE,)),
        Edit("canny edge map | a cat", (REFERENCE,)),
    ]
