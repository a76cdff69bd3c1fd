"""Tiny random Janus-Pro folders in both layouts the loader takes, for the Janus tests, the family
contract, the check command, quantisation and the ComfyUI workflow:

- converted, as deepseek-community/Janus-Pro-*B is (transformers' JanusForConditionalGeneration:
  config.json, byte-level BPE tokenizer.json, safetensors, generation_config.json);
- original, as DeepSeek released it (deepseek-ai/Janus-Pro-1B: config.json of model_type
  multi_modality, pytorch_model.bin; -7B: pytorch_model-0000N-of-00002.bin +
  pytorch_model.bin.index.json; Janus-1.3B: model.safetensors), written from a converted folder's
  weights with the release's tensor names (janus/models/modeling_vlm.py, vq_model.py, projector.py,
  siglip_vit.py of github.com/deepseek-ai/Janus), so both must run alike."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil

import torch

from sjdvp_core.models.janus.adapter import BOI, PAD
from tests.helpers.tiny_hf import byte_bpe_tokenizer, spread_weights

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
SHARDS = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]
# transformers name -> the release's name, applied in order (the inverse of
# convert_janus_weights_to_hf.py)
TO_ORIGINAL = [
    (r"^model\.language_model\.", "language_model.model."),
    (r"^lm_head\.", "language_model.lm_head."),
    (r"^model\.generation_embeddings\.", "gen_embed."),
    (r"^model\.generation_aligner\.fc1\.", "gen_aligner.layers.0."),
    (
        r"^model\.generation_aligner\.hidden_layers\.(\d+)\.",
        lambda m: f"gen_aligner.layers.{2 * int(m[1]) + 2}.",
    ),
    (r"^model\.generation_head\.proj_out\.", "gen_head.output_mlp_projector."),
    (r"^model\.generation_head\.vision_head\.", "gen_head.vision_head."),
    (r"^model\.aligner\.fc1\.", "aligner.layers.0."),
    (r"^model\.aligner\.hidden_layers\.0\.", "aligner.layers.2."),
    (
        r"^model\.vqmodel\.(encoder|decoder)\.(down|up)\.(\d+)\.block\.",
        r"gen_vision_model.\1.conv_blocks.\3.res.",
    ),
    (r"^model\.vqmodel\.(encoder|decoder)\.(down|up)\.", r"gen_vision_model.\1.conv_blocks."),
    (r"^model\.vqmodel\.(encoder|decoder)\.mid\.block_1\.", r"gen_vision_model.\1.mid.0."),
    (r"^model\.vqmodel\.(encoder|decoder)\.mid\.attn_1\.", r"gen_vision_model.\1.mid.1."),
    (r"^model\.vqmodel\.(encoder|decoder)\.mid\.block_2\.", r"gen_vision_model.\1.mid.2."),
    (r"^model\.vqmodel\.", "gen_vision_model."),
    (
        r"^model\.vision_model\.embeddings\.patch_embedding\.",
        "vision_model.vision_tower.patch_embed.proj.",
    ),
    (
        r"^model\.vision_model\.embeddings\.position_embedding\.weight$",
        "vision_model.vision_tower.pos_embed",
    ),
    (r"^model\.vision_model\.encoder\.layers\.", "vision_model.vision_tower.blocks."),
    (r"^model\.vision_model\.post_layernorm\.", "vision_model.vision_tower.norm."),
    (r"^(vision_model\..*)\.self_attn\.projection_layer\.", r"\1.attn.proj."),
    (r"^(vision_model\..*)\.layer_norm(\d)\.", r"\1.norm\2."),
]
# deepseek-ai/Janus-Pro-7B's config.json as released (language_config lists only what differs from
# LlamaConfig)
JANUS_PRO_7B = {
    "aligner_config": {
        "cls": "MlpProjector",
        "model_type": "aligner",
        "params": {"depth": 2, "input_dim": 1024, "n_embed": 4096, "projector_type": "mlp_gelu"},
    },
    "architectures": ["MultiModalityCausalLM"],
    "gen_aligner_config": {
        "cls": "MlpProjector",
        "model_type": "gen_aligner",
        "params": {"depth": 2, "input_dim": 8, "n_embed": 4096, "projector_type": "mlp_gelu"},
    },
    "gen_head_config": {
        "cls": "vision_head",
        "model_type": "gen_head",
        "params": {"image_token_embed": 4096, "image_token_size": 16384, "n_embed": 4096},
    },
    "gen_vision_config": {
        "cls": "VQ-16",
        "model_type": "gen_vision",
        "params": {"image_token_size": 16384, "n_embed": 8},
    },
    "language_config": {
        "_attn_implementation_autoset": True,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_hidden_layers": 30,
        "torch_dtype": "bfloat16",
        "vocab_size": 102400,
    },
    "model_type": "multi_modality",
    "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1",
    "vision_config": {
        "cls": "CLIPVisionTower",
        "model_type": "vision",
        "params": {
            "image_size": 384,
            "model_name": "siglip_large_patch16_384",
            "select_feature": "same",
            "select_layer": -1,
        },
    },
}


def write_converted(d) -> str:
    """The tiny random model, saved into the existing folder d as transformers saves it."""
    from transformers import JanusConfig, JanusForConditionalGeneration

    tok = byte_bpe_tokenizer(
        str(d),
        [BOS, EOS, PAD, "<image_placeholder>", BOI, "<end_of_image>"],
        tokenizer_class="LlamaTokenizerFast",
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
    )
    ids = {name: tok.token_to_id(name) for name in (BOS, EOS, PAD)}
    config = JanusConfig(
        text_config=dict(
            model_type="llama",
            vocab_size=tok.get_vocab_size(),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            bos_token_id=ids[BOS],
            eos_token_id=ids[EOS],
            pad_token_id=ids[PAD],
        ),
        vision_config=dict(  # SigLIP's heads are 64 wide (the original loader relies on it)
            hidden_size=64,
            num_hidden_layers=1,
            num_attention_heads=1,
            image_size=32,
            patch_size=8,
            projection_dim=32,
            num_image_tokens=16,
        ),
        vq_config=dict(
            embed_dim=8,
            num_embeddings=16,
            base_channels=32,
            channel_multiplier=[1, 2],
            num_res_blocks=1,
            projection_dim=32,
            image_token_embed_dim=32,
            latent_channels=8,
        ),
        image_token_id=tok.token_to_id("<image_placeholder>"),
    )
    model = JanusForConditionalGeneration(config)
    spread_weights(model)
    model.generation_config._from_model_config = False  # as transformers' converter writes it
    model.generation_config.pad_token_id = ids[PAD]
    model.generation_config.generation_kwargs = {"boi_token_id": tok.token_to_id(BOI)}
    model.save_pretrained(d)
    return str(d)


# --- the original release: deepseek-ai/Janus-Pro-1B, -7B, Janus-1.3B ------------------------------
def original_name(key: str) -> str:
    for pattern, replacement in TO_ORIGINAL:
        key = re.sub(pattern, replacement, key)
    return key


# SigLIP's query projection: the release holds it with the key and value projections as one qkv
QUERY = r"^(model\.vision_model\.encoder\.layers\.\d+\.self_attn\.)q_proj\.(weight|bias)$"


def original_state(converted: dict) -> dict:
    """The release's tensors: renamed, SigLIP's q/k/v merged into qkv, pos_embed with its batch
    axis, plus tensors the converter drops (attention pooling, VQ usage counts)."""
    state = {}
    for key, tensor in converted.items():
        q = re.match(QUERY, key)
        if q:
            parts = [converted[f"{q[1]}{p}_proj.{q[2]}"] for p in "qkv"]
            name = original_name(f"{q[1]}qkv.{q[2]}").replace(".self_attn.", ".attn.")
            state[name] = torch.cat(parts)
        elif not re.match(r"^model\.vision_model\..*\.self_attn\.[kv]_proj\.", key):
            state[original_name(key)] = tensor.clone()
    pos_embed = "vision_model.vision_tower.pos_embed"
    state[pos_embed] = state[pos_embed][None]
    state["vision_model.vision_tower.attn_pool.latent"] = torch.zeros(1, 1, 32)
    state["gen_vision_model.quantize.codebook_used"] = torch.zeros(65536)
    return state


def original_config(vocab_size: int) -> dict:
    """The tiny model's config.json in the release's structure and field names."""
    config = json.loads(json.dumps(JANUS_PRO_7B))
    config["vision_config"]["params"].update(image_size=32, model_name="siglip_large_patch8_32")
    config["aligner_config"]["params"].update(input_dim=64, n_embed=32)
    config["gen_vision_config"]["params"].update(image_token_size=16)
    config["gen_aligner_config"]["params"].update(n_embed=32)
    config["gen_head_config"]["params"].update(
        image_token_embed=32, image_token_size=16, n_embed=32
    )
    config["language_config"] = {
        "hidden_size": 32,
        "intermediate_size": 64,
        "max_position_embeddings": 16384,
        "model_type": "llama",
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 2,
        "torch_dtype": "bfloat16",
        "vocab_size": vocab_size,
    }
    return config


def write_original(converted: str, d, sharded: bool, safetensors: bool = False) -> str:
    """Janus-Pro-1B's layout (one pytorch_model.bin), -7B's (sharded), or Janus-1.3B's (one
    model.safetensors), from the converted folder's weights, into the new folder d."""
    from transformers import JanusForConditionalGeneration

    d.mkdir()
    model = JanusForConditionalGeneration.from_pretrained(converted)
    state = original_state(model.state_dict())
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(converted, name), d / name)
    config = original_config(model.config.text_config.vocab_size)
    (d / "config.json").write_text(json.dumps(config, indent=2))
    (d / "processor_config.json").write_text(
        json.dumps({"image_tag": "<image_placeholder>", "num_image_tokens": 576})
    )
    (d / "preprocessor_config.json").write_text(
        json.dumps({"image_size": 384, "image_processor_type": "VLMImageProcessor"})
    )
    if safetensors:
        from safetensors.torch import save_file

        save_file(
            {k: v.contiguous() for k, v in state.items()},
            str(d / "model.safetensors"),
            metadata={"format": "pt"},
        )
        return str(d)
    if not sharded:
        torch.save(state, d / "pytorch_model.bin")
        return str(d)
    keys = sorted(state)
    weight_map = {k: SHARDS[i >= len(keys) // 2] for i, k in enumerate(keys)}
    for shard in SHARDS:
        torch.save({k: state[k] for k in keys if weight_map[k] == shard}, d / shard)
    (d / "pytorch_model.bin.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return str(d)


# a reference, as ComfyUI holds an IMAGE: [H, W, 3] floats in [0, 1]; not square, so it is padded
REFERENCE = torch.rand(40, 30, 3, generator=torch.Generator().manual_seed(0))


def edits() -> list:
    """Two edits of one reference: the tiny model's conditions with references (Janus-4o's way)."""
    from sjdvp_core.engine.adapter import Edit

    return [Edit("make it snow", (REFERENCE,)), Edit("a sky above it", (REFERENCE,))]


@contextlib.contextmanager
def whole(adapter):
    """The adapter's JanusForConditionalGeneration with its reference towers back in place (the
    adapter keeps them apart), for transformers' own paths to run as references."""
    model, towers = adapter.model, adapter.reference_encoder
    inner = model.model
    inner.vision_model, inner.aligner = towers.vision, towers.aligner
    inner.vqmodel.encoder, inner.vqmodel.quant_conv = towers.encoder, towers.quant_conv
    try:
        yield model
    finally:
        inner.vision_model = inner.aligner = inner.vqmodel.encoder = inner.vqmodel.quant_conv = None
