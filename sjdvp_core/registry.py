"""Find and load a model by what its files are, not by what the user calls it.

A model is "demo" (built in), or a folder (or a single GPT file) under the models directory. The
family is detected from the files; an unknown folder gets a message listing what each family needs.
"""
from __future__ import annotations

import glob
import json
import os

import torch

from .models.checkpoint import WEIGHT_EXT

DEMO = "demo"
FAMILY_FILES = {
    "llamagen": "a LlamaGen GPT file (c2i_*.pt / t2i_*.pt or .safetensors) and its tokenizer (vq_ds16_*.pt "
                "or vq_ds8_*.pt) side by side; for t2i also the flan-t5-xl folder",
    "janus": "a Janus-Pro folder, as released (all files of deepseek-ai/Janus-Pro-1B or -7B: config.json, "
             "tokenizer.json, pytorch_model.bin or pytorch_model.bin.index.json and its shards) or in transformers "
             "format (all files of deepseek-community/Janus-Pro-1B or -7B: config.json, tokenizer.json, *.safetensors)",
    "emu3": "an Emu3 folder, as released (all files of BAAI/Emu3-Gen: config.json, emu3.tiktoken, "
            "emu3_vision_tokens.txt, model.safetensors.index.json and its shards; with all files of "
            "BAAI/Emu3-VisionTokenizer in its vision_tokenizer/ folder or in a sibling folder named "
            "Emu3-VisionTokenizer) or in transformers format (all files of BAAI/Emu3-Gen-hf: config.json, "
            "tokenizer.json, model.safetensors.index.json and its model-*.safetensors shards)",
    "lumina": "a Lumina-mGPT 1.0 folder (all files of Alpha-VLLM/Lumina-mGPT-7B-512, -768 or -1024: config.json, "
              "tokenizer.json, *.safetensors) with Meta's Chameleon vqgan.yaml and vqgan.ckpt in its tokenizer/ folder",
}
# transformers model folders: config.json's model_type -> family
HF_MODEL_TYPES = {"janus": "janus", "multi_modality": "janus", "emu3": "emu3", "Emu3": "emu3", "chameleon": "lumina"}
LUMINA_ARCHITECTURE = "ChameleonXLLMXForConditionalGeneration"   # Lumina's own class; Chameleon/Anole use others
OPTIONS = {"emu3", "lumina"}   # families with load options
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _files(folder: str, pattern: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(folder, pattern)) if p.endswith(WEIGHT_EXT))


def detect_family(path: str) -> str:
    """'demo', a key of FAMILY_FILES, or a ValueError that says what each family's folder holds."""
    if path == DEMO:
        return DEMO
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found. Put a model folder there ({describe_families()}), "
                                "or pick 'demo'")
    if os.path.isfile(path) and is_gpt_file(os.path.basename(path)):
        return "llamagen"
    if os.path.isdir(path) and _files(path, "c2i_*") + _files(path, "t2i_*"):
        return "llamagen"
    if os.path.isdir(path) and hf_family(path):
        return hf_family(path)
    raise ValueError(f"{path}: no model family recognised here. Expected {describe_families()}")


def hf_family(folder: str) -> str | None:
    """The family of a transformers model folder, from its config.json (None if it is not one)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
        model_type, architectures = config.get("model_type"), config.get("architectures") or []
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: cannot be read ({e}); re-download the model's config.json") from e
    family = HF_MODEL_TYPES.get(model_type)
    if family == "lumina" and LUMINA_ARCHITECTURE not in architectures:
        named = ", ".join(architectures) or "no architectures in its config.json"
        raise ValueError(f"{folder}: a Chameleon-type model ({named}) that is not Lumina-mGPT. Of this "
                         f"architecture only Lumina-mGPT 1.0 ({LUMINA_ARCHITECTURE}, Alpha-VLLM/Lumina-mGPT-7B-*) runs here; Chameleon and Anole "
                         "were not trained with its image prompt")
    return family


def is_gpt_file(name: str) -> bool:
    return name.startswith(("c2i_", "t2i_")) and name.endswith(WEIGHT_EXT)


def describe_families() -> str:
    return "; ".join(f"{family}: {need}" for family, need in FAMILY_FILES.items())


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on a GPU that has it, else fp32 (bf16 is slower than fp32 on CPUs)."""
    if precision != "auto":
        if precision not in DTYPES:
            raise ValueError(f"precision={precision!r} must be one of {['auto', *DTYPES]}")
        return DTYPES[precision]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_model(path: str, device="cpu", precision: str = "auto", **options):
    """-> an engine adapter for the model at path ('demo' for the built-in one). options are the
    family's own (Emu3: ratio "W:H" and image_area in pixels; Lumina-mGPT: width and height in pixels)."""
    device = torch.device(device)
    family = detect_family(path)
    if options and family not in OPTIONS:
        raise ValueError(f"{family} models take no options, got {sorted(options)}")
    if family == DEMO:
        from .demo import load_demo
        return load_demo(device)
    dtype = resolve_dtype(precision, device)
    if family == "janus":
        from .models.janus import load_janus
        return load_janus(path, device, dtype)
    if family == "emu3":
        from .models.emu3 import load_emu3
        return load_emu3(path, device, dtype, **options)
    if family == "lumina":
        from .models.lumina import load_lumina
        return load_lumina(path, device, dtype, **options)
    from .models.llamagen import load_llamagen
    return load_llamagen(path, _files(path, "c2i_*") + _files(path, "t2i_*") if os.path.isdir(path) else [path],
                         device, dtype)


def _listed_hf(folder: str) -> bool:
    """A known transformers family, or an unreadable config.json (listed, so choosing it shows why)."""
    try:
        return hf_family(folder) is not None
    except ValueError:
        return True


def list_models(roots: list[str]) -> list[str]:
    """'demo', then every model folder or GPT file under the roots (relative names)."""
    found = [DEMO]
    for root in roots:
        for dirpath, _, files in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            if rel != "." and "config.json" in files and _listed_hf(dirpath):
                found.append(rel)
            gpt_files = sorted(f for f in files if is_gpt_file(f))
            if len(gpt_files) == 1:
                found.append(rel if rel != "." else gpt_files[0])
            else:
                found += [os.path.normpath(os.path.join(rel, f)) for f in gpt_files]
    return list(dict.fromkeys(found))
