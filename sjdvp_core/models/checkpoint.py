"""Reading weight files users have, safely: safetensors, or .pt / .pth / .bin / .ckpt pickles of
tensors through torch.load(weights_only=True), never unpickling objects; and loading them
strictly, with a message that says what is wrong and what to do."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import re
import zipfile

import torch
from torch import Tensor

log = logging.getLogger(__name__)
WEIGHT_EXT = (".pt", ".pth", ".bin", ".safetensors")
# training buffers some releases carry beside their weights (LlamaGen's RoPE table and mask, its
# VQ's usage counter)
DROPPED_KEYS = ("freqs_cis", "causal_mask", "quantize.codebook_used")
# LlamaGen's training scripts (train_c2i.py, train_t2i.py, vq_train.py) save their argparse options
# as "args" beside the weights: the one object besides tensors and plain data we let torch.load
# rebuild
SAFE_GLOBALS = [argparse.Namespace]


class CheckpointError(ValueError):
    """A file that is missing, unreadable or not what was expected; the message says what to do."""


def read_state_dict(path: str, expected: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors (and safetensors metadata) from .safetensors or a .pt/.pth/.bin pickle of tensors."""
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file; expected {expected}")
    meta: dict[str, str] = {}
    try:
        if path.endswith(".safetensors"):
            from safetensors import safe_open

            with safe_open(path, framework="pt") as f:
                obj, meta = {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
        else:
            mmap = zipfile.is_zipfile(path)  # a legacy (non-zip) pickle cannot be mapped
            with torch.serialization.safe_globals(SAFE_GLOBALS):
                obj = torch.load(path, weights_only=True, map_location="cpu", mmap=mmap)
    except pickle.UnpicklingError as e:
        raise CheckpointError(_refused_pickle(path, expected)) from e
    except Exception as e:  # corrupt or truncated
        raise CheckpointError(
            f"{path}: cannot be read as {expected} ({type(e).__name__}: {e}). "
            "Re-download the file, or convert it to .safetensors."
        ) from e
    for key in ("model", "module", "state_dict"):  # DDP, DeepSpeed and plain wrappers
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: holds no state dict of tensors; expected {expected}")
    return {
        re.sub(r"^(module\.|_orig_mod\.)+", "", k): v
        for k, v in obj.items()
        if not k.endswith(DROPPED_KEYS)
    }, meta


def _refused_pickle(path: str, expected: str) -> str:
    """Why torch refused to unpickle a file: the objects it holds beyond tensors and plain data."""
    try:
        allowed = {f"{g.__module__}.{g.__qualname__}" for g in SAFE_GLOBALS}
        names = [
            n
            for n in torch.serialization.get_unsafe_globals_in_checkpoint(path)
            if n not in allowed
        ]
    except Exception:  # not even its pickle can be walked: corrupt or truncated
        names = []
    held = (
        f"it holds Python objects ({', '.join(names)}) that are never unpickled here"
        if names
        else "it cannot be read as a checkpoint of tensors"
    )
    return (
        f"{path}: {held}; expected {expected}. If the file is from a source you trust, re-save only its "
        "tensors (e.g. as .safetensors), or re-download the released file."
    )


def load_strict(model: torch.nn.Module, state: dict[str, Tensor], path: str, expected: str) -> None:
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        detail = "; ".join(
            f"{name}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
            for name, keys in (
                ("missing", missing),
                ("unexpected", unexpected),
                ("wrong shape", wrong),
            )
            if keys
        )
        raise CheckpointError(f"{path}: does not match {expected} ({detail})")
    model.load_state_dict(state, strict=True, assign=True)


def load_decoder(build, state: dict[str, Tensor], path: str, expected: str) -> torch.nn.Module:
    """An image decoder built by `build()` (on the meta device) from a release's checkpoint: every
    tensor it has must be there with its shape; tensors it has no place for (the encoding side's,
    a later version's buffers) are listed in a warning and skipped, as upstream's non-strict
    loads skip them."""
    with torch.device("meta"):
        model = build()
    extra = sorted(set(state) - set(model.state_dict()))
    if extra:
        log.warning(
            "%s: ignoring %d tensors the decoder does not use: %s%s",
            path,
            len(extra),
            ", ".join(extra[:8]),
            " ..." if len(extra) > 8 else "",
        )
    load_strict(model, {k: v for k, v in state.items() if k not in extra}, path, expected)
    return model.eval()


def index_shards(index: str, repo: str | None = None) -> list[str]:
    """The shard files a weights index (`*.index.json`) names; a CheckpointError where it names
    none."""
    data = read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        where = (
            f"the Hugging Face repository {repo}" if repo else "the model's Hugging Face repository"
        )
        raise CheckpointError(
            f"{index}: a weights index without its weight_map; download it again from {where}"
        )
    return sorted(set(weight_map.values()))


def read_json(path: str) -> dict:
    """A JSON file, or a CheckpointError that says to re-download it."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{path}: cannot be read as JSON ({e}); re-download it") from e


@contextlib.contextmanager
def config_errors(what: str, repo: str):
    """A config.json that is JSON but not the model's (a field of the wrong type, a section that is
    a list) as a CheckpointError that names it, not a traceback from inside the configuration
    classes."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:  # whatever the configuration classes raise on a value they cannot take
        raise CheckpointError(
            f"{what}: cannot be read as the model's configuration ({type(e).__name__}: "
            f"{' '.join(str(e).split())}); download the config.json of {repo} again"
        ) from e
