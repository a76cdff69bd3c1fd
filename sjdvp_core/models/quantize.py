"""int8 and NF4 weights, for every family.

What is quantised: the linear layers inside the transformer blocks (`ModelAdapter.blocks()`: attention and
MLP projections, over 90% of a 7B model's weights). What keeps the compute dtype: embeddings, the output
head (acceptance is decided on its logits), CFG/aligner heads and the VQ decoder, as transformers' own
bitsandbytes integration keeps the output embedding (`llm_int8_skip_modules`). The swap works on any
nn.Module, so our LlamaGen GPT, the transformers families and the T5 caption encoder go one way.

Exactness is with respect to the quantised model, and needs its target at a position to be a function of
the prefix, as in float: a token's logits must not depend on which other tokens share its forward. Both
schemes here are weight-only, so they keep that property exactly as the float model does:
- int8: per-output-channel symmetric int8 weights with their scales, y = (x @ W_int8^T) * s, as gpt-fast's
  WeightOnlyInt8Linear (pytorch-labs/gpt-fast, quantize.py). Plain torch: no extra package. Not
  LLM.int8() (bitsandbytes' Linear8bitLt): it rounds each token's activations to int8 too, and the float
  noise of a wider forward then crosses rounding boundaries, so SJD's targets drift from AR's (measured:
  greedy SJD != AR on the demo model).
- nf4: QLoRA's 4-bit NormalFloat (Dettmers et al. 2023) from bitsandbytes, blocks of 64 with double-quantised
  block scales; bitsandbytes dequantises the weight to the compute dtype for a multi-token forward.
Weights are quantised on the CPU copy the family loaded, so a GPU only ever holds the quantised ones.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor, nn
from torch.nn import functional as F

QUANTISED = ("int8", "nf4")
NF4_BLOCK = 64


class Int8Linear(nn.Module):
    """A linear layer with int8 weights [out, in] and one scale per output channel (in the compute dtype)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype):
        super().__init__()
        w = weight.detach().float()
        scales = w.abs().amax(1).clamp(min=1e-8) / 127
        self.register_buffer("weight", torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(dtype))
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(dtype), requires_grad=False)
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)


def bitsandbytes(precision: str):
    """The bitsandbytes module, or an ImportError that says what to install."""
    try:
        import bitsandbytes as bnb
    except ImportError as e:
        raise ImportError(f"precision {precision} needs bitsandbytes, which is not installed: run "
                          "`pip install bitsandbytes` (0.48 or newer also runs NF4 on the CPU) in ComfyUI's "
                          "Python, or choose int8, bf16, fp16 or fp32") from e
    return bnb


def swap_linears(blocks: Iterable[nn.Module], precision: str, compute_dtype: torch.dtype) -> list[nn.Module]:
    """Replace every nn.Linear inside blocks with its int8 / NF4 counterpart computing in compute_dtype,
    quantised on the CPU; -> the new modules."""
    if precision not in QUANTISED:
        raise ValueError(f"precision {precision!r} is not a quantised one ({', '.join(QUANTISED)})")
    bnb = bitsandbytes(precision) if precision == "nf4" else None
    swapped = []
    for block in blocks:
        for parent in list(block.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear:
                    new = _nf4(bnb, child, compute_dtype) if bnb else \
                        Int8Linear(child.weight, child.bias, compute_dtype)
                    setattr(parent, name, new.eval())
                    swapped.append(new)
    return swapped


def _nf4(bnb, linear: nn.Linear, compute_dtype: torch.dtype) -> nn.Module:
    new = bnb.nn.Linear4bit(linear.in_features, linear.out_features, bias=linear.bias is not None,
                            compute_dtype=compute_dtype, compress_statistics=True, quant_type="nf4", device="meta")
    new.weight = bnb.nn.Params4bit(linear.weight.data.to("cpu", compute_dtype), requires_grad=False,
                                   blocksize=NF4_BLOCK, compress_statistics=True, quant_type="nf4")
    if linear.bias is not None:
        new.bias = nn.Parameter(linear.bias.data.to("cpu", compute_dtype), requires_grad=False)
    # On CPUs with AVX512-BF16, bitsandbytes repacks the weight at the first forward and multiplies in bf16
    # with a tiling that depends on the token count: a token's logits would depend on the window. Off, it
    # dequantises to compute_dtype and multiplies as on a GPU.
    new.support_avx512bf16_for_cpu = False
    return new.to("cpu")   # bitsandbytes quantises on a move


def is_quantised(module: nn.Module) -> bool:
    """module holds quantised layers (int8 here, or bitsandbytes', swapped here or loaded pre-quantised)."""
    return any(isinstance(m, Int8Linear) or type(m).__module__.startswith("bitsandbytes") for m in module.modules())


def weight_bytes(module: nn.Module) -> int:
    """Bytes of module's weights as stored: a quantised layer's packed weight and its quantisation state
    (int8's scales; NF4's block scales and code, as bitsandbytes writes them to a state dict)."""
    seen, total = set(), 0
    for t in module.state_dict().values():
        if isinstance(t, Tensor) and (t.data_ptr(), t.nbytes) not in seen:   # tied weights once
            seen.add((t.data_ptr(), t.nbytes))
            total += t.nbytes
    return total


def quantisable(blocks: Iterable[nn.Module]) -> list[nn.Linear]:
    """The nn.Linear layers a swap would quantise."""
    return [m for block in blocks for m in block.modules() if type(m) is nn.Linear]
