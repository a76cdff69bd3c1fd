"""Janus-Pro as DeepSeek released it, loaded into transformers' classes without remote code.

deepseek-ai/Janus-Pro-1B and -7B (model_type "multi_modality") load into transformers'
JanusForConditionalGeneration, their config and tensor names mapped at load time as transformers'
convert_janus_weights_to_hf.py maps them, checked against the release's own classes
(github.com/deepseek-ai/Janus). The understanding tower and the VQ's encoder are kept: edits run
them on the reference (adapter.py); the text head and training statistics are dropped. The
files, the upstream sources and what is skipped: docs/families.md, "Janus-Pro"."""

from __future__ import annotations

import math
import os
import re
from typing import Mapping

import torch

from ..checkpoint import (
    CheckpointError,
    config_errors,
    index_shards,
    load_strict,
    read_json,
    read_state_dict,
)
from ..hf_adapter import TextTokenizer, dtype_kwarg
from .adapter import PAD, JanusAdapter

REPOS = "deepseek-ai/Janus-Pro-1B (or Janus-Pro-7B)"
MODEL_TYPE = "multi_modality"
# DeepSeek-LLM's, in every Janus release
BOS, EOS = (
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
)
# single file; shards are listed in <name>.index.json
WEIGHTS = (
    "pytorch_model.bin",
    "model.safetensors",
)
# release names of what no decode runs: the understanding tower's pooling head, the LM's text head,
# the VQ's usage counts (training statistics)
SKIPPED = (
    "vision_model.vision_tower.attn_pool.",
    "language_model.lm_head.",
    "gen_vision_model.quantize.codebook_used",
)
UNUSED = ("lm_head",)
VISION = r"^vision_model\.vision_tower\."
RENAMES = [
    (r"^language_model\.model\.", "model.language_model."),
    (r"^gen_embed\.", "model.generation_embeddings."),
    # MlpProjector is Sequential(Linear, GELU, Linear, ...): Linear 2k is hidden layer k - 1
    (r"^(gen_)?aligner\.layers\.0\.", lambda m: f"model.{_aligner(m[1])}.fc1."),
    (
        r"^(gen_)?aligner\.layers\.(\d+)\.",
        lambda m: f"model.{_aligner(m[1])}.hidden_layers.{int(m[2]) // 2 - 1}.",
    ),
    (r"^gen_head\.output_mlp_projector\.", "model.generation_head.proj_out."),
    (r"^gen_head\.vision_head\.", "model.generation_head.vision_head."),
    (r"^gen_vision_model\.decoder\.conv_blocks\.", "model.vqmodel.decoder.up."),
    (r"^gen_vision_model\.encoder\.conv_blocks\.", "model.vqmodel.encoder.down."),
    (r"^gen_vision_model\.(encoder|decoder)\.mid\.0\.", r"model.vqmodel.\1.mid.block_1."),
    (r"^gen_vision_model\.(encoder|decoder)\.mid\.1\.", r"model.vqmodel.\1.mid.attn_1."),
    (r"^gen_vision_model\.(encoder|decoder)\.mid\.2\.", r"model.vqmodel.\1.mid.block_2."),
    (r"^gen_vision_model\.", "model.vqmodel."),
    (r"^(model\.vqmodel\.(?:encoder\.down|decoder\.up)\.\d+)\.res\.", r"\1.block."),
    # the understanding tower: timm's SigLIP ViT names -> transformers' JanusVisionModel's
    (VISION + r"pos_embed$", "model.vision_model.embeddings.position_embedding.weight"),
    (VISION + r"patch_embed\.proj\.", "model.vision_model.embeddings.patch_embedding."),
    (VISION + r"norm\.", "model.vision_model.post_layernorm."),
    (
        VISION + r"blocks\.(\d+)\.attn\.proj\.",
        r"model.vision_model.encoder.layers.\1.self_attn.projection_layer.",
    ),
    (VISION + r"blocks\.(\d+)\.attn\.", r"model.vision_model.encoder.layers.\1.self_attn."),
    (VISION + r"blocks\.(\d+)\.norm(\d)\.", r"model.vision_model.encoder.layers.\1.layer_norm\2."),
    (VISION + r"blocks\.", "model.vision_model.encoder.layers."),
]
# SigLIP's query, key and value projections, stored as one qkv
QKV = r"^(model\.vision_model\.encoder\.layers\.\d+\.self_attn\.)qkv\.(weight|bias)$"
SIGLIP_HEAD = 64  # every SigLIP tower a Janus release holds (siglip_large_*: 1024 wide, 16 heads)


def _aligner(gen: str | None) -> str:
    return "generation_aligner" if gen else "aligner"


def is_original(folder: str) -> bool:
    path = os.path.join(folder, "config.json")
    return os.path.isfile(path) and read_json(path).get("model_type") == MODEL_TYPE


def load_original(folder: str, device="cpu", dtype: torch.dtype = torch.float32) -> JanusAdapter:
    """-> the adapter on JanusForConditionalGeneration in `dtype`, less the text head."""
    files = weight_files(folder)
    tokenizer = TextTokenizer(folder, REPOS)
    state = {}
    for path in files:
        state.update(read_state_dict(path, f"a weight file of {REPOS}")[0])
    tokens = {
        "bos_token_id": tokenizer.id(BOS),
        "eos_token_id": tokenizer.id(EOS),
        "pad_token_id": tokenizer.id(PAD),
    }
    shapes = {k: t.shape for k, t in state.items()}
    path = os.path.join(folder, "config.json")
    with config_errors(path, REPOS):
        config = janus_config(read_json(path), shapes, tokens)
    model = _empty_model(config, dtype)
    mapped = {
        name: t.to(dtype)
        for k, stored in state.items()
        if (key := hf_name(k)) is not None
        for name, t in hf_tensors(key, stored)
    }
    load_strict(model, mapped, folder, f"Janus-Pro as released; download every file of {REPOS}")
    _computed_at_init(model)
    return JanusAdapter(model.eval(), tokenizer, device=device)


def weight_files(folder: str) -> list[str]:
    """The folder's weight files, or a CheckpointError naming every missing file."""
    missing = [
        f for f in ("config.json", "tokenizer.json") if not os.path.isfile(os.path.join(folder, f))
    ]
    files = None
    for single in WEIGHTS:
        index = os.path.join(folder, single + ".index.json")
        if os.path.isfile(index):
            files = index_shards(index, REPOS)
            break
        if os.path.isfile(os.path.join(folder, single)):
            files = [single]
            break
    if files is None:
        missing.append(
            "the weights (pytorch_model.bin, or pytorch_model.bin.index.json and its "
            "pytorch_model-*-of-*.bin shards)"
        )
    else:
        missing += [f for f in files if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        raise CheckpointError(
            f"{folder}: missing {', '.join(missing)}. Download every file of the Hugging Face "
            f"repository {REPOS} into this folder"
        )
    return [os.path.join(folder, f) for f in files]


def hf_name(key: str) -> str | None:
    """A release tensor name -> its JanusForConditionalGeneration name, None for what is skipped.
    Names no rule knows pass unchanged, so a strict load reports them."""
    if key.startswith(SKIPPED):
        return None
    for pattern, replacement in RENAMES:
        key = re.sub(pattern, replacement, key)
    return key


def hf_tensors(name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """A mapped tensor as JanusForConditionalGeneration holds it: SigLIP's qkv split in three, its
    position table without the batch axis timm keeps."""
    qkv = re.match(QKV, name)
    if qkv:
        return [(f"{qkv[1]}{p}_proj.{qkv[2]}", t) for p, t in zip("qkv", tensor.chunk(3))]
    if name == "model.vision_model.embeddings.position_embedding.weight":
        return [(name, tensor.reshape(tensor.shape[-2:]))]
    return [(name, tensor)]


def janus_config(original: dict, shapes: Mapping[str, torch.Size], tokens: Mapping[str, int]):
    """The release's config.json (+ its tensor shapes, + token ids) -> JanusConfig. The language
    model is LlamaConfig(**language_config), as the release builds it (Janus-Pro-7B's lists only
    what differs from LlamaConfig's defaults); the VQ decoder's widths are read off its weights
    (the release's class name, VQ-16, fixes them in code). The token grid is image_size / patch
    size of the understanding tower (384 / 16 = 24), as in the release's generation_inference.py."""
    from transformers import JanusConfig

    vision, gen_aligner, gen_head = (
        _params(original, s) for s in ("vision_config", "gen_aligner_config", "gen_head_config")
    )
    text = {
        k: v
        for k, v in _section(original, "language_config").items()
        if not k.startswith("_") and k not in ("torch_dtype", "dtype")
    }
    return JanusConfig(
        text_config={**text, "model_type": "llama", **tokens},
        vision_config={
            **vision_shape(shapes, _field(vision, "image_size")),
            "projection_dim": _field(_params(original, "aligner_config"), "n_embed"),
            "depth": _params(original, "aligner_config").get("depth", 2),
        },
        vq_config={
            **vq_shape(shapes),
            "projection_dim": _field(gen_aligner, "n_embed"),
            "num_hidden_layers": gen_aligner.get("depth", 1),
            "image_token_embed_dim": _field(gen_head, "image_token_embed"),
        },
    )


def vision_shape(shapes: Mapping[str, torch.Size], image_size: int) -> dict:
    """JanusVisionConfig sizes of the understanding tower (timm's SigLIP ViT) from its tensors; its
    heads from SigLIP's head width (the release names the tower, whose class fixes them)."""
    prefix = "vision_model.vision_tower."
    width, _, patch, _ = _shape(shapes, prefix + "patch_embed.proj.weight")
    layers = {k[len(prefix) :].split(".")[1] for k in shapes if k.startswith(prefix + "blocks.")}
    mlp = _shape(shapes, prefix + "blocks.0.mlp.fc1.weight")[0]
    return {
        "hidden_size": width,
        "num_hidden_layers": len(layers),
        "num_attention_heads": max(width // SIGLIP_HEAD, 1),
        "mlp_ratio": mlp / width,
        "image_size": image_size,
        "patch_size": patch,
        "num_image_tokens": (image_size // patch) ** 2,
    }


def vq_shape(shapes: Mapping[str, torch.Size]) -> dict:
    """JanusVQVAEConfig sizes from the release's decoder tensors. The decoder runs its levels
    deepest first, each num_res_blocks + 1 blocks wide; only products base * multiplier shape it."""
    prefix = "gen_vision_model.decoder.conv_blocks."
    levels = sorted({int(k[len(prefix) :].split(".")[0]) for k in shapes if k.startswith(prefix)})
    widths = [_shape(shapes, f"{prefix}{i}.res.0.conv1.weight")[0] for i in reversed(levels)]
    if not widths:
        raise CheckpointError(
            f"the weights hold no VQ decoder ({prefix}*); download every file of {REPOS}"
        )
    base = math.gcd(*widths)
    blocks = {k[len(prefix) :].split(".")[2] for k in shapes if k.startswith(f"{prefix}0.res.")}
    latent, embed = _shape(shapes, "gen_vision_model.post_quant_conv.weight")[:2]
    return {
        "base_channels": base,
        "channel_multiplier": [w // base for w in widths],
        "num_res_blocks": len(blocks) - 1,
        "latent_channels": latent,
        "embed_dim": embed,
        "num_embeddings": _shape(shapes, "gen_vision_model.quantize.embedding.weight")[0],
    }


def _section(original: dict, name: str) -> dict:
    if not isinstance(original.get(name), dict):
        raise CheckpointError(
            f"config.json has no {name}; it is not Janus-Pro's. Download it again from {REPOS}"
        )
    return original[name]


def _params(original: dict, name: str) -> dict:
    return _section(original, name).get("params", {})


def _field(params: dict, name: str):
    if name not in params:
        raise CheckpointError(f"config.json lacks the field {name}; download it again from {REPOS}")
    return params[name]


def _shape(shapes: Mapping[str, torch.Size], key: str) -> torch.Size:
    if key not in shapes:
        raise CheckpointError(f"the weights lack {key}; download every file of {REPOS}")
    return shapes[key]


def _empty_model(config, dtype: torch.dtype):
    """The model on the meta device (no memory, no init), without the modules no decode runs."""
    from transformers import JanusForConditionalGeneration

    with torch.device("meta"):
        model = JanusForConditionalGeneration._from_config(
            config, attn_implementation="sdpa", **dtype_kwarg(dtype)
        )
    return without_unused(model)


def without_unused(model):
    """The model less the modules no decode runs (UNUSED)."""
    for path in UNUSED:
        parent, _, name = path.rpartition(".")
        setattr(model.get_submodule(parent), name, None)
    return model


def _computed_at_init(model) -> None:
    """RoPE frequencies and the understanding tower's position ids are computed at init, not
    stored: build them again off the meta device."""
    lm = model.model.language_model
    lm.rotary_emb = type(lm.rotary_emb)(config=lm.config)
    embeddings = model.model.vision_model.embeddings
    embeddings.position_ids = torch.arange(embeddings.num_positions)[None]
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError(
            f"JanusForConditionalGeneration of this transformers version computes {left} at init; "
            "the original-layout loader must build them (sjdvp_core/models/janus/original.py)"
        )
