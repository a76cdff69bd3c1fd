"""Find and load a model by what its files are, not by what the user calls it.

A model is "demo" (built in), or a folder (or a single GPT file) under the models directory. The
family is detected from the files; an unknown folder gets a message listing what each family needs.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
from dataclasses import dataclass

import torch

from ..engine.budget import decode_bytes
from .folders import incomplete, incomplete_folder, incomplete_message
from .llamagen.adapter import gpt_files, is_gpt_file
from .quantize import QUANTISED, stored_quantisation, swap_linears

DEMO = "demo"
log = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
PRECISIONS = ("auto", *DTYPES, *QUANTISED)


FOX = "a photo of a red fox sitting in fresh snow, morning light"


@dataclass(frozen=True)
class Example:
    """A workflow shipped for a family (workflows/<workflow>.json, written by tools/make_workflows.py): the
    catalogue entry it downloads on its first run, its prompt, the key of the family module's SAMPLING
    table where it has one per model type, its image size, and its title."""
    workflow: str
    entry: str
    title: str
    prompt: str = FOX
    sampling: str = ""
    size: tuple[int, int] = (0, 0)


@dataclass(frozen=True)
class Family:
    """One model family: what its folder holds (for messages), the config.json model_types that mark
    its transformers-style folders, its loader ("family.module:function" under sjdvp_core.models, imported
    only when used: transformers is heavy), whether it takes load options, and the module that maps
    the original release where the loader takes the converted one (its is_original(folder) tells them
    apart, its load_original loads it), and the workflows shipped for it. Its module (the loader's) holds
    the family's sampling defaults (SAMPLING) and its adapter, whose facts() the check command prints."""
    holds: str
    loader: str
    model_types: tuple[str, ...] = ()
    options: bool = False
    original: str = ""
    examples: tuple[Example, ...] = ()

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
    "llamagen": Family("a LlamaGen GPT file (c2i_*.pt / t2i_*.pt or .safetensors) and its tokenizer (vq_ds16_*.pt "
                       "or vq_ds8_*.pt) side by side; for t2i also the flan-t5-xl folder",
                       "llamagen.adapter:load_llamagen",
                       examples=(Example("sjdvp_llamagen_c2i", "LlamaGen-c2i-L-384", "LlamaGen-c2i",
                                         "golden retriever", "c2i"),
                                 Example("sjdvp_llamagen_t2i", "LlamaGen-t2i-XL-256", "LlamaGen-t2i", sampling="t2i"))),
    "janus": Family("a Janus-Pro folder, as released (all files of deepseek-ai/Janus-Pro-1B or -7B: config.json, "
                    "tokenizer.json, pytorch_model.bin or pytorch_model.bin.index.json and its shards) or in "
                    "transformers format (all files of deepseek-community/Janus-Pro-1B or -7B: config.json, "
                    "tokenizer.json, *.safetensors)", "janus.adapter:load_converted", ("janus", "multi_modality"),
                    original="janus.original", examples=(Example("sjdvp_janus_pro", "Janus-Pro-7B", "Janus-Pro"),)),
    "emu3": Family("an Emu3 folder, as released (all files of BAAI/Emu3-Gen: config.json, emu3.tiktoken, "
                   "emu3_vision_tokens.txt, model.safetensors.index.json and its shards; with all files of "
                   "BAAI/Emu3-VisionTokenizer in its vision_tokenizer/ folder or in a folder beside it, any "
                   "name) or in transformers format (all files of BAAI/Emu3-Gen-hf: config.json, "
                   "tokenizer.json, model.safetensors.index.json and its model-*.safetensors shards)",
                   "emu3.adapter:load_converted", ("emu3", "Emu3"), options=True, original="emu3.original",
                   examples=(Example("sjdvp_emu3", "Emu3-Gen", "Emu3", size=(720, 720)),)),
    "lumina": Family("a Lumina-mGPT 1.0 folder (all files of Alpha-VLLM/Lumina-mGPT-7B-512, -768 or -1024: "
                     "config.json, tokenizer.json, *.safetensors) with Meta's Chameleon vqgan.yaml and vqgan.ckpt in "
                     "its tokenizer/ folder", "lumina.adapter:load_lumina", ("chameleon",), options=True,
                     examples=(Example("sjdvp_lumina_mgpt", "Lumina-mGPT-7B-768", "Lumina-mGPT", size=(768, 768)),)),
    "lumina2": Family("a Lumina-mGPT 2.0 folder (all files of Alpha-VLLM/Lumina-mGPT-2.0: config.json, tokenizer.json, "
                      "tokenizer_config.json, *.safetensors) with movqgan_270M.ckpt of ai-forever/MoVQGAN in its "
                      "movqgan/ folder", "lumina2.adapter:load_lumina2", ("chameleon",), options=True,
                      examples=(Example("sjdvp_lumina_mgpt2", "Lumina-mGPT-2.0", "Lumina-mGPT 2.0",
                                        size=(768, 768)),)),
}
LUMINA_ARCHITECTURE = "ChameleonXLLMXForConditionalGeneration"   # Lumina's own class; Chameleon/Anole use others
IMAGE_START = "<racm3:break>"       # Lumina's image start token, in both releases' vocabularies


def detect_family(path: str) -> str:
    """'demo', a key of FAMILIES, or a ValueError that says what each family's folder holds."""
    if path == DEMO:
        return DEMO
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: not found. Put a model folder there ({describe_families()}), "
                                "or pick 'demo'")
    unfinished = incomplete_folder(path)
    if unfinished:
        raise ValueError(incomplete_message(unfinished))
    if os.path.isfile(path) and is_gpt_file(os.path.basename(path)):
        return "llamagen"
    if os.path.isdir(path) and gpt_files(path):
        return "llamagen"
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
        raise ValueError(f"{path}: cannot be read ({e}); re-download the model's config.json") from e
    family = next((name for name, f in FAMILIES.items() if model_type in f.model_types), None)
    return chameleon_family(folder, config, architectures) if family == "lumina" else family


def chameleon_family(folder: str, config: dict, architectures: list[str]) -> str:
    """Lumina-mGPT 1.0 (Chameleon's IMGIMG image tokens, Lumina's own architecture class) or 2.0 (no
    IMGIMG tokens, Lumina's image start token): told apart by the vocabulary (config.json's vocabulary_map,
    else tokenizer.json), since 2.0's architecture may carry either class name."""
    vocabulary = config.get("vocabulary_map") or _tokenizer_vocabulary(folder)
    if not any(name.startswith("IMGIMG") for name in vocabulary) and IMAGE_START in vocabulary:
        return "lumina2"
    if LUMINA_ARCHITECTURE not in architectures:
        named = ", ".join(architectures) or "no architectures in its config.json"
        raise ValueError(f"{folder}: a Chameleon-type model ({named}) that is not Lumina-mGPT. Of this "
                         f"architecture only Lumina-mGPT 1.0 ({LUMINA_ARCHITECTURE}, Alpha-VLLM/Lumina-mGPT-7B-*) "
                         "and 2.0 (Alpha-VLLM/Lumina-mGPT-2.0) run here; Chameleon and Anole were not trained "
                         "with their image prompt")
    return "lumina"


def _tokenizer_vocabulary(folder: str) -> set[str]:
    """Token names of the folder's tokenizer.json (its model's vocabulary and added tokens); empty if none."""
    path = os.path.join(folder, "tokenizer.json")
    try:
        with open(path, encoding="utf-8") as f:
            tok = json.load(f)
        return set(tok.get("model", {}).get("vocab") or ()) | {t["content"] for t in tok.get("added_tokens", [])}
    except OSError:
        return set()
    except (ValueError, AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: cannot be read ({e}); re-download the model's tokenizer.json") from e


def describe_families() -> str:
    return "; ".join(f"{name}: {family.holds}" for name, family in FAMILIES.items())


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The compute dtype. auto: bf16 on a GPU that has it, else fp32 (bf16 is slower than fp32 on CPUs); the
    quantised precisions compute in auto's dtype."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {list(PRECISIONS)}")
    if precision in DTYPES:
        return DTYPES[precision]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_model(path: str, device="cpu", precision: str = "auto", compute: str | None = None,
               memory: int | None = None, placement: str | dict | None = None, offload_dir: str | None = None,
               **options):
    """-> an engine adapter for the model at path ('demo' for the built-in one). precision: bf16, fp16, fp32,
    int8 / nf4 (models.quantize: loaded and quantised on the CPU, then moved to device), or auto: compute's
    dtype, quantised where a default decode would not fit `memory` bytes (fit_precision; the demo model's
    auto is fp32). A folder stored quantised (a bitsandbytes 4-bit release) loads as stored, computing in the
    dtype precision names (auto: compute's); int8 / nf4 are refused for it. compute: the dtype auto and the
    quantised precisions compute in (default: bf16 on a GPU that has it, else fp32). memory: default a CUDA
    device's free memory; elsewhere auto does not fit. options are the family's own (Emu3: ratio "W:H",
    image_area in pixels; Lumina-mGPT: width, height, trained). placement: "split" over the CUDA devices,
    "offload" what does not fit `device` to CPU memory, or an explicit device map (models.placement; auto's
    precision is then the compute dtype: the placement makes it fit); offload_dir: for a map's "disk" entries."""
    device = torch.device(device)
    dtype = resolve_dtype(precision, device) if compute is None or precision in DTYPES else DTYPES[compute]
    if placement is not None:
        return _placed(path, device, precision, NAMES[dtype], placement, offload_dir, options)
    stored = os.path.isdir(path) and stored_quantisation(path)
    if stored:
        if precision in QUANTISED:
            raise ValueError(f"{path}: its weights are stored quantised already ({stored}); choose auto, bf16, "
                             "fp16 or fp32 (the dtype they compute in)")
        adapter = _load(path, device, dtype, options)
        adapter.precision = f"{stored}, as stored (computes in {NAMES[dtype]})"
        return adapter
    if precision in DTYPES:
        return _load(path, device, dtype, options)
    if precision in QUANTISED:
        adapter = _load(path, torch.device("cpu"), dtype, options)
        quantize(adapter, precision, device, dtype)
        adapter.precision = precision
        return adapter
    if memory is None and device.type == "cuda":
        from .memory import free_memory
        memory = free_memory(device)
    if path == DEMO or memory is None:
        return _load(path, device, torch.float32 if path == DEMO else dtype, options)
    adapter = _load(path, torch.device("cpu"), dtype, options)
    fit_precision(adapter, NAMES[dtype], memory, device)
    return adapter


def _placed(path: str, device: torch.device, precision: str, compute: str, placement, offload_dir, options):
    """load_model's placed branch: loaded on the CPU at precision, then dispatched by the device map."""
    from .placement import device_map, place
    adapter = load_model(path, "cpu", compute if precision == "auto" else precision, compute, **options)
    if not isinstance(placement, dict):
        from .memory import default_settings
        reserve = decode_bytes(adapter, default_settings(adapter), itemsize=DTYPES[compute].itemsize)
        placement = device_map(adapter, placement, device, reserve)
    place(adapter, placement, device, offload_dir)
    return adapter


def fit_precision(adapter, compute: str, memory: int, device: torch.device) -> str:
    """auto on a GPU, for an adapter loaded on the CPU in compute's dtype: keep it if a default decode fits
    `memory` bytes, else quantise it to int8, else NF4 (models.memory.choose_precision), and move it to device.
    The choice and its figures are logged and kept as adapter.precision. -> the precision taken."""
    from .memory import choose_precision
    chosen, why = choose_precision(adapter, compute, memory)
    log.info("sjdvp: precision %s", why)
    if chosen in QUANTISED:
        quantize(adapter, chosen, device, DTYPES[compute])
    else:
        adapter.module.to(device)
    adapter.precision = f"{chosen} (auto: {why})"
    return chosen


def _load(path: str, device: torch.device, dtype: torch.dtype, options: dict):
    """The family's loader (the demo's auto precision is fp32: it is small, and its pins were made so)."""
    name = detect_family(path)
    if name == DEMO:
        if options:
            raise ValueError(f"the demo model takes no options, got {sorted(options)}")
        # by name, as every family is (the demo package sits above models and imports from it)
        return importlib.import_module("..demo", __package__).load_demo(device, dtype)
    family = FAMILIES[name]
    if options and not family.options:
        raise ValueError(f"{name} models take no options, got {sorted(options)}")
    return family.load(path, device, dtype, **options)


def quantize(adapter, precision: str, device: torch.device, dtype: torch.dtype) -> None:
    """Swap the adapter's block linears for int8 / NF4 ones computing in dtype (models.quantize), then move
    its weights to device."""
    if not swap_linears(adapter.blocks(), precision, dtype):
        raise ValueError(f"{adapter.family}: nothing to quantise (no linear layers in its transformer blocks); "
                         "choose bf16, fp16 or fp32")
    adapter.module.to(device)


def _listed_hf(folder: str) -> bool:
    """A known transformers family, or an unreadable config.json (listed, so choosing it shows why)."""
    try:
        return hf_family(folder) is not None
    except ValueError:
        return True


def list_models(roots: list[str]) -> list[str]:
    """'demo', then every model folder or GPT file under the roots (relative names). An unfinished
    download (sjdvp_core.download's marker in its folder) is not listed, nor anything under it."""
    found = [DEMO]
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            if incomplete(dirpath):
                dirs.clear()
                continue
            rel = os.path.relpath(dirpath, root)
            if rel != "." and "config.json" in files and _listed_hf(dirpath):
                found.append(rel)
            gpts = sorted(f for f in files if is_gpt_file(f))
            if len(gpts) == 1:
                found.append(rel if rel != "." else gpts[0])
            else:
                found += [os.path.normpath(os.path.join(rel, f)) for f in gpts]
    return list(dict.fromkeys(found))
