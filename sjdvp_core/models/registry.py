"""The model families, and which one a folder is: by what its files are, not by what the user calls it.

A model is "demo" (built in), or a folder (or a single GPT file) under the models directory. The
family is detected from the files; an unknown folder gets a message listing what each family needs.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
from dataclasses import dataclass

import torch

from . import glm_image
from .folders import incomplete, incomplete_message, unfinished_marker
from .llamagen.adapter import gpt_files, is_gpt_file

DEMO = "demo"
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Family:
    """One model family: what its folder holds (for messages), the config.json model_types that mark
    its transformers-style folders, its loader ("family.module:function" under sjdvp_core.models,
    imported only when used: transformers is heavy), the load options it takes, and the module
    that maps the original release where the loader takes the converted one (its
    is_original(folder) tells them apart, its load_original loads it). Its module (the loader's)
    holds the family's sampling defaults (SAMPLING) and its adapter, whose facts() the check
    command prints. How a model is loaded around its family's loader (precision, quantisation,
    placement) is loading.py's."""

    holds: str
    loader: str
    model_types: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    original: str = ""

    @property
    def kind(self) -> str:
        """What holds, in short: "a Janus-Pro folder", "a LlamaGen GPT file"."""
        return re.match(r"an? .+? (?:folder|file)\b", self.holds).group()

    @property
    def module(self):
        return _module(self.loader.split(":")[0])

    def load(self, path: str, device: torch.device, dtype: torch.dtype, **options):
        if self.original:
            original = _module(self.original)
            if original.is_original(path):
                return original.load_original(path, device, dtype, **options)
        module, function = self.loader.split(":")
        return getattr(_module(module), function)(path, device, dtype, **options)


def _module(name: str):
    return importlib.import_module(f".{name}", __package__)


FAMILIES = {
    "llamagen": Family(
        "a LlamaGen GPT file (c2i_*.pt / t2i_*.pt or .safetensors) and its tokenizer (vq_ds16_*.pt "
        "or vq_ds8_*.pt) side by side; for t2i also the flan-t5-xl folder",
        "llamagen.adapter:load_llamagen",
    ),
    "janus": Family(
        "a Janus-Pro folder, as released (all files of deepseek-ai/Janus-Pro-1B or -7B: config.json, "
        "tokenizer.json, pytorch_model.bin or pytorch_model.bin.index.json and its shards) or in "
        "transformers format (all files of deepseek-community/Janus-Pro-1B or -7B: config.json, "
        "tokenizer.json, *.safetensors)",
        "janus.adapter:load_converted",
        ("janus", "multi_modality"),
        original="janus.original",
    ),
    "emu3": Family(
        "an Emu3 folder, as released (all files of BAAI/Emu3-Gen: config.json, emu3.tiktoken, "
        "emu3_vision_tokens.txt, model.safetensors.index.json and its shards; with all files of "
        "BAAI/Emu3-VisionTokenizer in its vision_tokenizer/ folder or in a folder beside it, any "
        "name) or in transformers format (all files of BAAI/Emu3-Gen-hf: config.json, "
        "tokenizer.json, model.safetensors.index.json and its model-*.safetensors shards)",
        "emu3.adapter:load_converted",
        ("emu3", "Emu3"),
        options=("ratio", "image_area", "quality_suffix"),
        original="emu3.original",
    ),
    "lumina": Family(
        "a Lumina-mGPT 1.0 folder (all files of Alpha-VLLM/Lumina-mGPT-7B-512, -768 or -1024: "
        "config.json, tokenizer.json, *.safetensors) with Meta's Chameleon vqgan.yaml and vqgan.ckpt in "
        "its tokenizer/ folder",
        "lumina.adapter:load_lumina",
        ("chameleon",),
        options=("width", "height", "trained"),
    ),
    "lumina2": Family(
        "a Lumina-mGPT 2.0 folder (all files of Alpha-VLLM/Lumina-mGPT-2.0: config.json, tokenizer.json, "
        "tokenizer_config.json, *.safetensors) with movqgan_270M.ckpt of ai-forever/MoVQGAN in its "
        "movqgan/ folder",
        "lumina2.adapter:load_lumina2",
        ("chameleon",),
        options=("width", "height"),
    ),
    "glm_image": Family(
        f"a GLM-Image folder (all files of {glm_image.REPO}: model_index.json and the folders "
        f"{glm_image.ENCODER}/, processor/, transformer/, vae/, text_encoder/, tokenizer/, "
        "scheduler/; the pixels need diffusers)",
        "glm_image.adapter:load_glm_image",
        options=("width", "height"),
    ),
}
# whose pixels a DiT apart draws (their adapters' pixels_apart), not a VQ decoder
DIT_FAMILIES = ("glm_image",)
LUMINA_ARCHITECTURE = (
    "ChameleonXLLMXForConditionalGeneration"  # Lumina's own class; Chameleon/Anole use others
)
IMAGE_START = "<racm3:break>"  # Lumina's image start token, in both releases' vocabularies


def detect_family(path: str) -> str:
    """'demo', a key of FAMILIES, or a ValueError that says what each family's folder holds."""
    if path == DEMO:
        return DEMO
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{path}: not found. Put a model folder there ({describe_families()}), or pick 'demo'"
        )
    unfinished = unfinished_marker(path)
    if unfinished:
        raise ValueError(incomplete_message(unfinished))
    if os.path.isfile(path) and is_gpt_file(os.path.basename(path)):
        return "llamagen"
    if os.path.isdir(path) and gpt_files(path):
        return "llamagen"
    if os.path.isdir(path) and glm_image.is_glm_image(path):
        return "glm_image"
    family = hf_family(path) if os.path.isdir(path) else None
    if family:
        return family
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
        raise ValueError(
            f"{path}: cannot be read ({e}); re-download the model's config.json"
        ) from e
    if model_type == "glm_image":
        raise ValueError(
            f"{folder}: GLM-Image's token stage alone; choose the folder above it (the one with "
            "model_index.json): its DiT draws the pixels"
        )
    family = next((name for name, f in FAMILIES.items() if model_type in f.model_types), None)
    return chameleon_family(folder, config, architectures) if family == "lumina" else family


def chameleon_family(folder: str, config: dict, architectures: list[str]) -> str:
    """Lumina-mGPT 1.0 (Chameleon's IMGIMG image tokens, Lumina's own architecture class) or 2.0 (no
    IMGIMG tokens, Lumina's image start token): told apart by the vocabulary (config.json's
    vocabulary_map, else tokenizer.json), since 2.0's architecture may carry either class name."""
    vocabulary = config.get("vocabulary_map") or _tokenizer_vocabulary(folder)
    if not any(name.startswith("IMGIMG") for name in vocabulary) and IMAGE_START in vocabulary:
        return "lumina2"
    if LUMINA_ARCHITECTURE not in architectures:
        named = ", ".join(architectures) or "no architectures in its config.json"
        raise ValueError(
            f"{folder}: a Chameleon-type model ({named}) that is not Lumina-mGPT. Of this "
            f"architecture only Lumina-mGPT 1.0 ({LUMINA_ARCHITECTURE}, Alpha-VLLM/Lumina-mGPT-7B-*) "
            "and 2.0 (Alpha-VLLM/Lumina-mGPT-2.0) run here; Chameleon and Anole were not trained "
            "with their image prompt"
        )
    return "lumina"


def _tokenizer_vocabulary(folder: str) -> set[str]:
    """Token names of the folder's tokenizer.json (its model's vocabulary and added tokens);
    empty if none."""
    path = os.path.join(folder, "tokenizer.json")
    try:
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        return set(tok.get("model", {}).get("vocab") or ()) | {
            t["content"] for t in tok.get("added_tokens", [])
        }
    except OSError:
        return set()
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise ValueError(
            f"{path}: cannot be read ({e}); re-download the model's tokenizer.json"
        ) from e


def describe_families() -> str:
    return "; ".join(f"{name}: {family.holds}" for name, family in FAMILIES.items())


def load_family(path: str, device: torch.device, dtype: torch.dtype, options: dict):
    """The detected family's loader, at dtype on device (loading.py chooses them)."""
    name = detect_family(path)
    if name == DEMO:
        if options:
            raise ValueError(f"the demo model takes no options, got {sorted(options)}")
        # by name, as every family is (the demo package sits above models and imports from it)
        return importlib.import_module("..demo", __package__).load_demo(device, dtype)
    family = FAMILIES[name]
    unknown = sorted(set(options) - set(family.options))
    if unknown:  # before the weights load: a loader would take minutes to reach the TypeError
        takes = f"takes only {', '.join(family.options)}" if family.options else "takes no options"
        raise ValueError(f"{path}: {family.kind} {takes}; got {', '.join(unknown)}")
    return family.load(path, device, dtype, **options)


def _listed_hf(folder: str) -> bool:
    """A known transformers family, or an unreadable config.json (listed, so choosing it shows
    why)."""
    try:
        return hf_family(folder) is not None
    except ValueError:
        return True


def _listed_glm(folder: str) -> bool:
    """A GLM-Image folder, or an unreadable model_index.json (listed, so choosing it shows why)."""
    try:
        return glm_image.is_glm_image(folder)
    except ValueError:
        return True


def pixels_source(path: str) -> str:
    """ "dit" where a model's pixels come from a DiT apart (a GLM-Image folder), else "vq"; read from the folder's
    index alone, cheap enough for every entry of the model list. An unreadable index reads as "vq": the
    loader names the problem when the model runs."""
    try:
        return "dit" if os.path.isdir(path) and glm_image.is_glm_image(path) else "vq"
    except ValueError:
        return "vq"


def list_models(roots: list[str]) -> list[str]:
    """'demo', then every model folder or GPT file under the roots (relative names), sorted as
    ComfyUI sorts its lists. An unfinished download (sjdvp_core.download's marker in its folder,
    or beside a GPT file) is not listed, nor anything under it. LlamaGen GPTs are listed by file:
    a folder's name would mean another model once a second GPT joins the first (the catalogue's
    LlamaGen entries share one folder), and the same folder name in two roots would hide one of
    them. Folders behind links are followed, as ComfyUI's own lists do."""
    found, seen = [], set()
    for root in roots:
        for dirpath, dirs, files in os.walk(root, followlinks=True):
            real = os.path.realpath(dirpath)
            if incomplete(dirpath) or real in seen:  # a link back up would walk forever
                dirs.clear()
                continue
            seen.add(real)
            rel = os.path.relpath(dirpath, root)
            if rel != "." and "model_index.json" in files and _listed_glm(dirpath):
                found.append(rel)
                dirs.clear()  # its parts' folders are not models of their own
                continue
            if rel != "." and "config.json" in files and _listed_hf(dirpath):
                found.append(rel)
            # a GPT whose own download is unfinished
            found += [
                os.path.normpath(os.path.join(rel, f))
                for f in files
                if is_gpt_file(f) and not incomplete(dirpath, f)
            ]
    return [DEMO, *sorted(dict.fromkeys(found), key=str.lower)]
