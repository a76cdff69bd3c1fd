"""How a model is loaded: the precision policy (a dtype, int8 / NF4, or auto: what fits the device),
the device map, and the family's loader (registry.py) under them."""

from __future__ import annotations

import logging
import os

import torch

from ..engine.budget import decode_bytes
from .quantize import QUANTISED, stored_quantisation, swap_linears
from .registry import DEMO, load_family

log = logging.getLogger(__name__)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
PRECISIONS = ("auto", *DTYPES, *QUANTISED)


def resolve_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The compute dtype. auto: bf16 on a GPU that has it, else fp32 (bf16 is slower than fp32 on
    CPUs); the quantised precisions compute in auto's dtype."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} must be one of {list(PRECISIONS)}")
    if precision in DTYPES:
        return DTYPES[precision]
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def usable_device(device) -> torch.device:
    """torch.device(device), or a ValueError where it names no device or one this machine's torch
    cannot reach."""
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"device={device!r} is not a device ({e}); give cpu, cuda, cuda:N or mps"
        ) from e
    count = {
        "cuda": torch.cuda.device_count,
        "mps": lambda: int(torch.backends.mps.is_available()),
    }.get(device.type)
    if count is not None and (device.index or 0) >= count():
        raise ValueError(
            f"device {device}: this torch ({torch.__version__}) sees {count()} {device.type} device(s); "
            "give cpu or another device"
        )
    return device


def load_model(
    path: str,
    device="cpu",
    precision: str = "auto",
    compute: str | None = None,
    memory: int | None = None,
    placement: str | dict | None = None,
    offload_dir: str | None = None,
    **options,
):
    """-> an engine adapter for the model at path ('demo' for the built-in one). precision: bf16,
    fp16, fp32, int8 / nf4 (models.quantize: loaded and quantised on the CPU, then moved to
    device), or auto: compute's dtype, quantised where a default decode would not fit `memory`
    bytes (fit_precision; the demo model's auto is fp32). A folder stored quantised (a
    bitsandbytes 4-bit release) loads as stored, computing in the dtype precision names (auto:
    compute's); int8 / nf4 are refused for it. compute: the dtype auto and the quantised
    precisions compute in (default: bf16 on a GPU that has it, else fp32). memory: default a CUDA
    device's free memory; elsewhere auto does not fit. options are the family's own (Emu3: ratio
    "W:H", image_area in pixels; Lumina-mGPT: width, height, trained). placement: "split" over
    the CUDA devices, "offload" what does not fit `device` to CPU memory, or an explicit device
    map (models.placement; auto's precision is then the compute dtype: the placement makes it
    fit); offload_dir: for a map's "disk" entries."""
    device = usable_device(device)
    # (an unknown precision is refused there, whatever compute says)
    dtype = resolve_dtype(precision, device)
    dtype = dtype if compute is None or precision in DTYPES else DTYPES[compute]
    if placement is not None:
        return _placed(path, device, precision, NAMES[dtype], placement, offload_dir, options)
    stored = os.path.isdir(path) and stored_quantisation(path)
    if stored:
        if precision in QUANTISED:
            raise ValueError(
                f"{path}: its weights are stored quantised already ({stored}); choose auto, bf16, "
                "fp16 or fp32 (the dtype they compute in)"
            )
        adapter = load_family(path, device, dtype, options)
        adapter.precision = f"{stored}, as stored (computes in {NAMES[dtype]})"
        return adapter
    if precision in DTYPES:
        return load_family(path, device, dtype, options)
    if precision in QUANTISED:
        adapter = load_family(path, torch.device("cpu"), dtype, options)
        quantize(adapter, precision, device, dtype)
        adapter.precision = precision
        return adapter
    if memory is None and device.type == "cuda":
        from .memory import free_memory

        memory = free_memory(device)
    # the demo's auto is fp32: it is small, and its pins were made so
    if path == DEMO or memory is None:
        return load_family(path, device, torch.float32 if path == DEMO else dtype, options)
    adapter = load_family(path, torch.device("cpu"), dtype, options)
    fit_precision(adapter, NAMES[dtype], memory, device)
    return adapter


def _placed(
    path: str, device: torch.device, precision: str, compute: str, placement, offload_dir, options
):
    """load_model's placed branch: loaded on the CPU at precision, then dispatched by the device
    map."""
    from .placement import device_map, place

    adapter = load_model(
        path, "cpu", compute if precision == "auto" else precision, compute, **options
    )
    if not isinstance(placement, dict):
        from .memory import default_settings

        reserve = decode_bytes(
            adapter, default_settings(adapter), itemsize=DTYPES[compute].itemsize
        )
        placement = device_map(adapter, placement, device, reserve)
    place(adapter, placement, device, offload_dir)
    return adapter


def fit_precision(adapter, compute: str, memory: int, device: torch.device) -> str:
    """auto on a GPU, for an adapter loaded on the CPU in compute's dtype: keep it if a default
    decode fits `memory` bytes, else quantise it to int8, else NF4
    (models.memory.choose_precision), and move it to device; a pixel model apart (GLM-Image's
    DiT) is chosen for alone the same way (choose_pixel_precision). The choices and their figures
    are logged and kept as adapter.precision. -> the token stage's precision."""
    from .memory import choose_pixel_precision, choose_precision

    chosen, why = choose_precision(adapter, compute, memory)
    log.info("sjdvp: precision %s", why)
    pixels, pixels_why = (
        choose_pixel_precision(adapter, compute, memory) if adapter.pixels_apart else (None, "")
    )
    if pixels:
        log.info("sjdvp: the pixel model's precision %s", pixels_why)
    quantize(adapter, chosen, device, DTYPES[compute], pixels)
    adapter.precision = f"{chosen} (auto: {why})" + (
        f"; the DiT {pixels} (auto: {pixels_why})" if pixels else ""
    )
    return chosen


def quantize(
    adapter, precision: str, device: torch.device, dtype: torch.dtype, pixels: str | None = None
) -> None:
    """Swap the adapter's block linears for int8 / NF4 ones computing in dtype (models.quantize)
    where precision is one of those, and a pixel model apart's at `pixels` (default: precision; a
    dtype's name leaves them as they are), then move the weights to device."""
    if precision in QUANTISED and not swap_linears(adapter.blocks(), precision, dtype):
        raise ValueError(
            f"{adapter.family}: nothing to quantise (no linear layers in its transformer blocks); "
            "choose bf16, fp16 or fp32"
        )
    if (pixels or precision) in QUANTISED:
        swap_linears(adapter.pixel_blocks(), pixels or precision, dtype)
    to_device(adapter, device)


def to_device(adapter, device: torch.device) -> None:
    """The adapter's weights, and a pixel model kept apart from them, to device."""
    adapter.module.to(device)
    if adapter.pixels_apart:
        adapter.image_decoder.to(device)
