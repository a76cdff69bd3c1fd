"""What a model needs in memory at each precision, and the precision auto picks for the memory at hand.

need = weights + the decode's own memory (engine.budget.decode_bytes: the KV cache for the image's
rows, one forward's transients, the loop's state). The weights are counted from the loaded model's
tensors (any precision: a model is loaded on the CPU first), the block linears at their quantised
size (models.quantize's formats, byte for byte), the image decoder in the dtype it keeps, the rest
in the compute dtype."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..engine.budget import decode_bytes
from ..engine.settings import DecodeSettings, WindowSettings
from .quantize import QUANTISED, bitsandbytes, quantisable

ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2}
FALLBACK = ("int8", "nf4")  # what auto tries, in order, when the compute dtype does not fit
# per layer: the NF4 code, the scales' code, bitsandbytes' state record
NF4_FIXED = 16 * 4 + 256 * 4 + 170


def linear_bytes(
    out_features: int, in_features: int, bias: bool, precision: str, itemsize: int
) -> int:
    """Bytes of one linear layer's weights stored at precision (the quantised formats of
    models.quantize), computing in a dtype of `itemsize` bytes."""
    n, extra = out_features * in_features, out_features * itemsize * bias
    if precision == "int8":
        return n + out_features * itemsize + extra  # int8 weights + a scale per channel
    if precision == "nf4":
        blocks = math.ceil(n / 64)  # uint8 block scales, double-quantised
        return math.ceil(n / 2) + blocks + 4 * math.ceil(blocks / 256) + NF4_FIXED + extra
    return (n + out_features * bias) * ITEMSIZE[precision]


def weight_need(adapter, precision: str, compute: str) -> int:
    """Bytes of adapter.module's weights at precision (compute: the dtype the rest is held in,
    "bf16" on a GPU, "fp32" on a CPU, or precision itself when it is not a quantised one)."""
    decoder = {id(t) for t in adapter.image_decoder.state_dict(keep_vars=True).values()}
    return _weights(adapter.module, adapter.blocks(), precision, compute, decoder)


def pixel_weight_need(adapter, precision: str, compute: str) -> int:
    """Bytes of a pixel model apart's weights (pixels_apart: GLM-Image's DiT, loaded alone after the
    decode) at precision: its blocks quantised as the generator's (`ModelAdapter.pixel_blocks`),
    the rest in compute."""
    return _weights(adapter.image_decoder, adapter.pixel_blocks(), precision, compute)


def _weights(
    module: nn.Module, blocks, precision: str, compute: str, kept: set[int] = frozenset()
) -> int:
    """Bytes of module's weights: the linears inside blocks at precision (where it is a quantised
    one), tensors in kept at their own dtype (an image decoder), the rest in compute."""
    itemsize = ITEMSIZE[compute]
    inside = {id(m) for m in module.modules()}
    linears = [m for m in quantisable(blocks) if id(m) in inside] if precision in QUANTISED else []
    skip = {id(m.weight) for m in linears} | {id(m.bias) for m in linears if m.bias is not None}
    total = sum(
        linear_bytes(m.out_features, m.in_features, m.bias is not None, precision, itemsize)
        for m in linears
    )
    seen = set()
    for t in module.state_dict(keep_vars=True).values():
        if id(t) in skip or id(t) in seen:  # tied weights are one Parameter
            continue
        seen.add(id(t))
        total += t.nbytes if id(t) in kept or not t.is_floating_point() else t.numel() * itemsize
    return total


@dataclass(frozen=True)
class Need:
    precision: str
    weights: int
    decode: int

    @property
    def total(self) -> int:
        return self.weights + self.decode


def default_settings(adapter) -> DecodeSettings:
    """The decode auto sizes for: one image of the family's default size and sampling, a 64-token
    window."""
    return DecodeSettings(window=WindowSettings(64), sampling=adapter.default_sampling)


def need(
    adapter, precision: str, compute: str, settings: DecodeSettings | None = None, conditions=None
) -> Need:
    """What a decode with settings (default: default_settings) of these conditions (default: a
    prompt of hf_adapter.PROMPT_ALLOWANCE tokens) needs at precision, computing in compute."""
    settings = settings or default_settings(adapter)
    decode = decode_bytes(adapter, settings, conditions, itemsize=ITEMSIZE[compute])
    return Need(precision, weight_need(adapter, precision, compute), decode)


def choose_precision(
    adapter, compute: str, free: int, settings: DecodeSettings | None = None
) -> tuple[str, str]:
    """auto's choice on a GPU: the compute dtype if its need fits `free` bytes, else int8, else nf4
    (NF4 also when nothing fits: the smallest). -> (precision, why), the reason with every figure
    it used."""
    return _first_fit(
        [(p, need(adapter, p, compute, settings).total) for p in _options(compute)],
        free,
        "free memory or use a smaller window / image",
    )


def choose_pixel_precision(adapter, compute: str, free: int) -> tuple[str, str]:
    """auto's choice for a pixel model apart (GLM-Image's DiT), chosen for it alone: it runs alone
    on the card, after the token stage has left it (the nodes' runtime), so the token stage's
    precision does not bind it. The compute dtype if its weights fit `free` bytes, else int8,
    else nf4; its activations come on top (free is what the card holds less ComfyUI's inference
    reserve). -> (precision, why)."""
    return _first_fit(
        [(p, pixel_weight_need(adapter, p, compute)) for p in _options(compute)],
        free,
        "free memory or draw a smaller image",
    )


def _options(compute: str) -> list[str]:
    return [compute] + [p for p in FALLBACK if p != "nf4" or _has_bitsandbytes()]


def _first_fit(needs: list[tuple[str, int]], free: int, hint: str) -> tuple[str, str]:
    """The first (precision, bytes) that fits free bytes, or the last (the smallest) ->
    (precision, why)."""
    figures = ", ".join(f"{p} {n / 1e9:.2f} GB" for p, n in needs)
    fits = next(((p, n) for p, n in needs if n <= free), None)
    if fits is None:
        return needs[-1][0], (
            f"nothing fits in {free / 1e9:.2f} GB free ({figures}); took the smallest, "
            f"{needs[-1][0]}: {hint}"
        )
    return fits[
        0
    ], f"{fits[0]}: needs {fits[1] / 1e9:.2f} GB of {free / 1e9:.2f} GB free ({figures})"


def _has_bitsandbytes() -> bool:
    try:
        bitsandbytes("precision nf4")
    except ImportError:
        return False
    return True


def free_memory(device: torch.device) -> int:
    """Free bytes on a CUDA device (what the driver reports plus what torch's cache holds
    unused)."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
