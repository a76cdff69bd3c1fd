"""Find and load a model by what its files are, not by what the user calls it.

A model is "demo" (built in), or a folder (or a single GPT file) under the models directory. The
family is detected from the files; an unknown folder gets a message listing what each family needs.
"""
from __future__ import annotations

import glob
import os

import torch

DEMO = "demo"
_WEIGHT_EXT = (".pt", ".pth", ".bin", ".safetensors")
FAMILY_FILES = {
    "llamagen": "a LlamaGen GPT file (c2i_*.pt / t2i_*.pt or .safetensors) and its tokenizer (vq_ds16_*.pt "
                "or vq_ds8_*.pt) side by side; for t2i also the flan-t5-xl folder",
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _files(folder: str, pattern: str) -> list[str]:
    return sorted(p for p in glob.glob(os.path.join(folder, pattern)) if p.endswith(_WEIGHT_EXT))


def detect_family(path: str) -> str:
    """'demo', 'llamagen', or a ValueError that says what each family's folder holds."""
    if path == DEMO:
        return DEMO
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found. Put a model folder there ({describe_families()}), "
                                "or pick 'demo'")
    if os.path.isfile(path) and is_gpt_file(os.path.basename(path)):
        return "llamagen"
    if os.path.isdir(path) and _files(path, "c2i_*") + _files(path, "t2i_*"):
        return "llamagen"
    raise ValueError(f"{path}: no model family recognised here. Expected {describe_families()}")


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


def load_model(path: str, device="cpu", precision: str = "auto"):
    """-> an engine adapter for the model at path ('demo' for the built-in one)."""
    device = torch.device(device)
    family = detect_family(path)
    if family == DEMO:
        from .demo import load_demo
        return load_demo(device)
    return _load_llamagen(path, device, resolve_dtype(precision, device))


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


def list_models(roots: list[str]) -> list[str]:
    """'demo', then every model folder or GPT file under the roots (relative names)."""
    found = [DEMO]
    for root in roots:
        for dirpath, _, files in os.walk(root):
            rel = os.path.relpath(dirpath, root)
            gpt_files = sorted(f for f in files if is_gpt_file(f))
            if len(gpt_files) == 1:
                found.append(rel if rel != "." else gpt_files[0])
            else:
                found += [os.path.normpath(os.path.join(rel, f)) for f in gpt_files]
    return list(dict.fromkeys(found))
