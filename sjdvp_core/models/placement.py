"""Beyond one card: a model split over GPUs, or partly offloaded to CPU memory or disk.

Places the model with accelerate's device map (Hugging Face accelerate, as transformers'
`device_map=` does it): whole blocks per device, each layer's KV cache where it computes, logits
back on the adapter's device, so a decode makes the same passes with the same tokens, placed or
not. Placements: "split", "offload" or an explicit map, which `offload_map` writes. How the hooks
stream weights, and why speculative decoding pays most there: docs/memory.md, "Beyond one card:
split over GPUs, offload to CPU memory"."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from .optional import require
from .quantize import holds_bitsandbytes

PLACEMENTS = ("split", "offload")


def weights_device(module: torch.nn.Module) -> torch.device:
    """Where a module computes: where its weights are now (a memory manager may move them between
    runs), or, where a device map placed it (models.placement), accelerate's execution device for
    it (its weights may sit in CPU memory, on disk or on the meta device meanwhile)."""
    for m in module.modules():
        hook = getattr(m, "_hf_hook", None)
        for h in getattr(hook, "hooks", [hook]):
            if getattr(h, "execution_device", None) is not None:
                return torch.device(h.execution_device)
        for p in m.parameters(recurse=False):
            return p.device
    raise ValueError(f"{type(module).__name__} holds no weights")


@contextlib.contextmanager
def moved_in(module: nn.Module, device):
    """The module on `device` for the block, back in CPU memory after: encoders a family runs once
    per edit (a reference's), kept off the card between edits."""
    module.to(device)
    try:
        yield module
    finally:
        module.to("cpu")


def accelerate_module():
    """accelerate, or an ImportError that says what to install."""
    return require("accelerate", "placing a model over devices", "or load it on one device")


def device_map(
    adapter, placement: str, device: torch.device, reserve: int, memory: dict | None = None
) -> dict:
    """The device map a placement gives adapter.module: "split" over the CUDA devices, "offload"
    onto device with the rest in CPU memory; `reserve` bytes (the decode's: KV cache, transients)
    stay free, spread over the GPUs used (a split model's KV cache is spread with its layers).
    memory: bytes each device may hold ({index or "cpu": bytes}; default: what is free)."""
    accelerate = accelerate_module()
    from accelerate.utils import get_balanced_memory, get_max_memory

    if placement not in PLACEMENTS:
        raise ValueError(
            f"placement={placement!r} must be one of {list(PLACEMENTS)} or a device map"
        )
    if device.type != "cuda":
        raise ValueError(
            f"placement {placement!r} places a model over CUDA devices; this one is {device}. Load it "
            "on one device, or give an explicit device map"
        )
    # what is free, and the weights already in CPU memory: the offload keeps them there
    if memory is None:
        memory = get_max_memory()
        memory["cpu"] = memory.get("cpu", 0) + sum(
            t.nbytes for t in adapter.module.state_dict().values() if t.device.type == "cpu"
        )
    memory = dict(memory)
    gpus = [k for k in memory if isinstance(k, int)]
    if placement == "offload":
        main = device.index or 0
        memory = {main: memory[main], "cpu": memory.get("cpu", 0)}
        gpus = [main]
    for g in gpus:
        memory[g] = max(0, memory[g] - reserve // len(gpus))
    no_split = no_split_classes(adapter)
    if placement == "split":
        memory = get_balanced_memory(adapter.module, memory, no_split_module_classes=no_split)
    mapping = accelerate.infer_auto_device_map(
        adapter.module, max_memory=memory, no_split_module_classes=no_split
    )
    # (placing it would ask for an offload folder, which no node offers)
    if "disk" in mapping.values():
        raise ValueError(
            f"{adapter.family} does not fit {device} and CPU memory together: load it in int8 (which "
            "offloads too) or free memory; a device map with 'disk' entries and offload_dir streams it "
            "from disk (sjdvp_core.models.placement)"
        )
    return mapping


def no_split_classes(adapter) -> list[str]:
    """The classes a device map keeps whole: the transformer blocks (their attention and MLP
    share inputs)."""
    return sorted({type(block).__name__ for block in adapter.blocks()})


def place(adapter, mapping: dict, device: torch.device, offload_dir: str | None = None) -> dict:
    """Dispatch adapter.module by mapping (accelerate's device map over its module names); offloaded
    modules ("cpu", "disk") compute on `device`. -> the map, kept as adapter.device_map."""
    accelerate = accelerate_module()
    if "disk" in mapping.values() and offload_dir is None:
        raise ValueError(
            "a device map with 'disk' entries needs offload_dir, a folder for the offloaded weights"
        )
    modules = dict(adapter.module.named_modules())
    unknown = sorted(set(mapping) - set(modules))
    if unknown:
        raise ValueError(
            f"the device map names modules this model does not have: {', '.join(unknown[:4])}"
        )
    offloaded = [modules[name] for name, where in mapping.items() if where in ("cpu", "disk")]
    # accelerate cannot move their quantisation state out
    if any(holds_bitsandbytes(m) for m in offloaded):
        raise ValueError(
            "NF4 (bitsandbytes) layers cannot be offloaded: to offload the model, load it in int8, "
            "bf16 or fp16 (a release stored 4-bit cannot be offloaded); or keep NF4 on one device, in "
            "about a quarter of bf16's memory"
        )
    accelerate.dispatch_model(
        adapter.module, mapping, main_device=device, offload_dir=offload_dir, force_hooks=True
    )
    adapter.device_map = dict(mapping)
    return adapter.device_map


def offload_map(adapter, blocks: list[int], to: str = "cpu", device="cpu") -> dict:
    """A complete device map that keeps adapter.module on device except the transformer blocks
    numbered `blocks` (adapter.blocks() order), which go `to` ("cpu" memory or "disk") and stream
    in per pass."""
    chosen = [adapter.blocks()[i] for i in blocks]
    # not the string "cpu", which accelerate reads as "offloaded to the CPU"
    device = torch.device(device)
    mapping = {}

    def walk(prefix: str, module: nn.Module) -> None:
        if any(module is b for b in chosen):
            mapping[prefix] = to
        elif not any(m is b for m in module.modules() for b in chosen):
            mapping[prefix] = device
        else:
            if next(module.parameters(recurse=False), None) is not None:
                raise ValueError(
                    f"{prefix or 'the model'} holds weights beside the blocks; map it by hand"
                )
            for name, child in module.named_children():
                walk(f"{prefix}.{name}" if prefix else name, child)

    walk("", adapter.module)
    return mapping
