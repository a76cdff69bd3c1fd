"""int8 and NF4 weights, for every family: weight-only, so SJD stays exact for the quantised model.

Swaps the linear layers inside the transformer blocks (`ModelAdapter.blocks()`) on any nn.Module;
embeddings, the output head and the VQ decoder keep the compute dtype. int8 is per-channel and
weight-only, as gpt-fast's; NF4 is QLoRA's 4-bit NormalFloat from bitsandbytes. Weights are
quantised on the CPU copy, and a release stored 4-bit by bitsandbytes is read as stored. What
keeps its dtype, why not LLM.int8(), and the stored release: docs/memory.md, "Precision: bf16,
fp16, fp32, int8, NF4"."""

from __future__ import annotations

import json
import os
from typing import Iterable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .optional import require

QUANTISED = ("int8", "nf4")
NF4_BLOCK = 64


class Int8Linear(nn.Module):
    """A linear layer with int8 weights [out, in] and one scale per output channel (in the compute
    dtype). Both are frozen parameters, not buffers: a device map offloads a block's parameters,
    and accelerate keeps its buffers on the GPU unless told to offload every buffer."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype):
        super().__init__()
        w = weight.detach().float()
        scales = w.abs().amax(1).clamp(min=1e-8) / 127
        self.weight = nn.Parameter(
            torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8), requires_grad=False
        )
        self.scales = nn.Parameter(scales.to(dtype), requires_grad=False)
        self.bias = (
            None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        )
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def bitsandbytes(needed_by: str, otherwise: str = "or choose int8, bf16, fp16 or fp32"):
    """The bitsandbytes module, or an ImportError that says what to install (needed_by: what needs
    it; otherwise: the way around it)."""
    return require(
        "bitsandbytes", needed_by, otherwise, " (0.48 or newer also runs 4-bit weights on the CPU)"
    )


def swap_linears(
    blocks: Iterable[nn.Module], precision: str, compute_dtype: torch.dtype
) -> list[nn.Module]:
    """Replace every nn.Linear inside blocks with its int8 / NF4 counterpart computing in
    compute_dtype, quantised on the CPU; -> the new modules."""
    if precision not in QUANTISED:
        raise ValueError(f"precision {precision!r} is not a quantised one ({', '.join(QUANTISED)})")
    bnb = bitsandbytes(f"precision {precision}") if precision == "nf4" else None
    swapped = []
    for block in blocks:
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    new = (
                        _nf4(bnb, child, compute_dtype)
                        if bnb
                        else Int8Linear(child.weight, child.bias, compute_dtype)
                    )
                    setattr(parent, name, new.eval())
                    swapped.append(new)
    return swapped


def _nf4(bnb, linear: nn.Linear, compute_dtype: torch.dtype) -> nn.Module:
    new = bnb.nn.Linear4bit(
        linear.in_features,
        linear.out_features,
        bias=linear.bias is not None,
        compute_dtype=compute_dtype,
        compress_statistics=True,
        quant_type="nf4",
        device="meta",
    )
    new.weight = bnb.nn.Params4bit(
        linear.weight.data.to("cpu", compute_dtype),
        requires_grad=False,
        blocksize=NF4_BLOCK,
        compress_statistics=True,
        quant_type="nf4",
    )
    if linear.bias is not None:
        new.bias = nn.Parameter(linear.bias.data.to("cpu", compute_dtype), requires_grad=False)
    # On CPUs with AVX512-BF16, bitsandbytes repacks the weight at the first forward and multiplies
    # in bf16 with a tiling that depends on the token count: a token's logits would depend on the
    # window. Off, it dequantises to compute_dtype and multiplies as on a GPU.
    new.support_avx512bf16_for_cpu = False
    return new.to("cpu")  # bitsandbytes quantises on a move


def stored_quantisation(folder: str) -> str | None:
    """How a transformers folder's weights are stored quantised ("bitsandbytes 4-bit fp4", ...),
    from its config.json's quantization_config; None for float weights (or no readable
    config.json)."""
    try:
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
            q = json.load(f).get("quantization_config")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(q, dict):
        return None
    method = q.get("quant_method", "unknown")
    if method != "bitsandbytes":
        return method
    if q.get("load_in_4bit") or q.get("_load_in_4bit"):
        return f"bitsandbytes 4-bit {q.get('bnb_4bit_quant_type', 'fp4')}"
    return "bitsandbytes 8-bit"


def adopt_stored(model: nn.Module, compute_dtype: torch.dtype) -> None:
    """A model loaded pre-quantised, made to compute in compute_dtype as our NF4 layers do: its
    4-bit layers (with the token-count independent kernel, as _nf4's) and its float parameters,
    which transformers' bitsandbytes path leaves in the dtypes the files hold. Buffers keep
    theirs (RoPE tables are fp32 by design)."""
    for m in model.modules():
        if _from_bitsandbytes(m) and hasattr(m, "compute_dtype"):
            m.compute_dtype, m.support_avx512bf16_for_cpu = compute_dtype, False
        for name, p in m.named_parameters(recurse=False):
            if p.is_floating_point() and p.dtype != compute_dtype:
                setattr(m, name, nn.Parameter(p.data.to(compute_dtype), requires_grad=False))


def is_quantised(module: nn.Module) -> bool:
    """module holds quantised layers (int8 here, or bitsandbytes', swapped here or loaded
    pre-quantised)."""
    return any(isinstance(m, Int8Linear) for m in module.modules()) or holds_bitsandbytes(module)


def holds_bitsandbytes(module: nn.Module) -> bool:
    """module holds bitsandbytes' layers (NF4 swapped here, or a release stored quantised)."""
    return any(_from_bitsandbytes(m) for m in module.modules())


def _from_bitsandbytes(module: nn.Module) -> bool:
    return type(module).__module__.startswith("bitsandbytes")


def weight_bytes(module: nn.Module) -> int:
    """Bytes of module's weights as stored: a quantised layer's packed weight and its quantisation
    state (int8's scales; NF4's block scales and code, as bitsandbytes writes them to a state
    dict)."""
    seen, total = set(), 0
    for t in module.state_dict().values():
        if isinstance(t, Tensor) and (t.data_ptr(), t.nbytes) not in seen:  # tied weights once
            seen.add((t.data_ptr(), t.nbytes))
            total += t.nbytes
    return total


def quantisable(blocks: Iterable[nn.Module]) -> list[nn.Linear]:
    """The nn.Linear layers a swap would quantise."""
    return [m for block in blocks for m in block.modules() if type(m) is nn.Linear]
