"""Find and load a model by what its files are, not by what the user calls it.

A model is "demo" (built in), or a folder (or a single GPT file) under the models directory. The
family is detected from the files; an unknown folder gets a message listing what each family needs.
"""
from __future__ import annotations

import glob
import json
import os

import torch

DEMO = "demo"
_WEIGHT_EXT = (".pt", ".pth", ".bin", ".safetensors")
FAMILY_FILES = {
    "llamagen": "a LlamaGen GPT file (c2i_*.pt / t2i_*.pt or .safetensors) and its tokenizer (vq_ds16_*.pt "
                "or vq_ds8_*.pt) side by side; for t2i also the flan-t5-xl folder",
    "janus": "a Janus-Pro folder in transformers format (all files of deepseek-community/Janus-Pro-1B or -7B: "
             "config.json, tokenizer.json, *.safetensors)",
    "emu3": "an Emu3 folder in transformers format (all files of BAAI/Emu3-Gen-hf: config.json, tokenizer.json, "
            "model.safetensors.index.json and its model-*.safetensors shards)",
    "lumina": "a Lumina-mGPT 1.0 folder (all files of Alpha-VLLM/Lumina-mGPT-7B-512, -768 or -1024: config.json, "
              "tokenizer.json, *.safetensors) with Meta's Chameleon vqgan.yaml and vqgan.ckpt in its tokenizer/ folder",
}
# transformers model folders: config.json's model_type -> family
HF_MODEL_TYPES = {"janus": "janus", "emu3": "emu3", "chameleon": "lumina"}
OPTIONS = {"emu3", "lumina"}   # families with load options
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _files(folder: str, pattern: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(folder, pattern)) if p.endswith(_WEIGHT_EXT))


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
            model_type = json.load(f).get("model_type")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{path}: cannot be read ({e}); re-download the model's config.json") from e
    return HF_MODEL_TYPES.get(model_type)


def is_gpt_file(name: str) -> bool:
    return name.startswith(("c2i_", "t2i_")) and name.endswith(_WEIGHT_EXT)


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
    return _load_llamagen(path, device, dtype)


def _load_llamagen(path: str, device: torch.device, dtype: torch.dtype):
    from .models.llamagen import LlamaGenAdapter, imagenet_classes, load_gpt, load_vq
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    gpts = [path] if os.path.isfile(path) else _files(folder, "c2i_*") + _files(folder, "t2i_*")
    if len(gpts) > 1:
        raise ValueError(f"{folder}: holds several LlamaGen GPT files ({', '.join(map(os.path.basename, gpts))}); "
                         "select one file instead of the folder")
    gpt = load_gpt(gpts[0])
    kind = gpt.config.model_type
    vqs = _files(folder, "vq_*")
    preferred = [v for v in vqs if kind in os.path.basename(v)] or vqs
    if not preferred:
        raise FileNotFoundError(f"{folder}: no VQ tokenizer next to {os.path.basename(gpts[0])}; download "
                                f"vq_ds16_{kind}.pt from the LlamaGen release into this folder")
    text_encoder = None
    if kind == "t2i":
        from .models.t5_text import T5CaptionEncoder
        text_encoder = T5CaptionEncoder(os.path.join(folder, "flan-t5-xl"), device=device)
    names = imagenet_classes() if kind == "c2i" and gpt.config.num_classes == 1000 else None
    return LlamaGenAdapter(gpt, load_vq(preferred[0]), class_names=names,
                           text_encoder=text_encoder, device=device, dtype=dtype)


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
