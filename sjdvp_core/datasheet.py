"""The datasheet side of the pass cost: named devices (bandwidth, dense bf16 FLOPs, memory, with sources) and
the shapes of released models, priced by the roofline (docs/speed.md, "The cost of a pass"):
    t(k) = max(bytes / (0.85 BW), FLOPs / (0.70 F)) + t0
It lives outside the engine, which prices by what it measures on the device at hand; the benchmarks and the
docs' modelled columns read it."""

from __future__ import annotations

from dataclasses import dataclass

from .engine.cost import GRID, PassCost

# of datasheet peak, as reached by good kernels
BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY = (
    0.85,
    0.70,
)


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float  # bytes / s, memory
    flops: float  # dense bf16 FLOP / s with fp32 accumulation (no sparsity)
    memory_gb: float
    source: str


DEVICES = {
    d.name: d
    for d in (
        Device(
            "H200",
            4.8e12,
            989e12,
            141,
            "NVIDIA H200 Tensor Core GPU datasheet (SXM: 4.8 TB/s, BF16 1,979 "
            "TFLOPS with sparsity)",
        ),
        Device(
            "H100",
            3.35e12,
            989e12,
            80,
            "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s, BF16 1,979 "
            "TFLOPS with sparsity)",
        ),
        Device(
            "A100 80GB",
            2.039e12,
            312e12,
            80,
            "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM: 2,039 GB/s, BF16 312 TFLOPS)",
        ),
        Device(
            "L40S",
            864e9,
            362e12,
            48,
            "NVIDIA L40S datasheet (864 GB/s, BF16 362.05 TFLOPS dense, 733 with sparsity)",
        ),
        Device(
            "RTX 4090",
            1008e9,
            165.2e12,
            24,
            "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 "
            "(1,008 GB/s; BF16 tensor with FP32 accumulate 165.2 TFLOPS dense)",
        ),
        Device(
            "RTX 3090",
            936e9,
            71e12,
            24,
            "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090 (936 GB/s; BF16 "
            "tensor with FP32 accumulate 71 TFLOPS dense)",
        ),
        Device(
            "RTX 4060 Ti 16GB",
            288e9,
            44.1e12,
            16,
            "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX "
            "4060 Ti (288 GB/s; BF16 tensor with FP32 accumulate 44.1 TFLOPS dense)",
        ),
    )
}


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a model: its parameter count and what its KV cache and logits
    read."""

    name: str
    params: float  # weights read once per pass
    layers: int
    dim: int  # hidden size (attention FLOPs: queries x keys x dim, twice)
    kv_dim: int  # kv_heads x head_dim (KV cache bytes per token per layer, K and V each)
    vocab: int  # logits written per token scored
    rows: int  # model rows per image (2 with CFG)
    context: int  # tokens before a mid-image window (prompt + half the image)
    itemsize: int = 2  # bf16 weights and cache


SHAPES = {
    s.name: s
    for s in (
        # Chameleon-7B architecture (hidden 4096, 32 layers, 32 heads, vocab 65536), 768 px: 48 x 49
        # tokens
        ModelShape("Lumina-mGPT 7B", 7.0e9, 32, 4096, 4096, 65536, 2, 64 + 48 * 49 // 2),
        # LLaMA 7B body (hidden 4096, 30 layers) + generation head over 16384 codes, 384 px: 24 x 24
        # tokens
        ModelShape("Janus-Pro-7B", 6.9e9, 30, 4096, 4096, 16384, 2, 40 + 576 // 2),
        # LlamaGen GPT-XL (36 layers, 20 heads, dim 1280, 775M), 384 px: 24 x 24 tokens
        ModelShape("LlamaGen-XL", 775e6, 36, 1280, 1280, 16384, 2, 1 + 576 // 2),
        # Chameleon-7B's stack with Lumina-mGPT 2.0's vocabulary 172032, 768 px: 96 x 97 tokens
        ModelShape("Lumina-mGPT 2.0", 7.9e9, 32, 4096, 4096, 172032, 2, 64 + 96 * 97 // 2),
        # Emu3-Gen 8B: blocks 6.98B + head 0.76B (transformers' Emu3Config defaults; 8 KV heads of
        # 128), 720 px: 90 x 91
        ModelShape("Emu3-Gen", 7.74e9, 32, 4096, 1024, 184622, 2, 64 + 90 * 91 // 2),
        # GLM-Image's token stage: the GLM-4 9B stack's blocks 8.16B + its image head 0.07B (the
        # weights a pass reads; transformers' GlmImageConfig defaults), 2 KV heads of 128, head over
        # 16512 ids, one row (no CFG); 1024 px: the 16 x 16 prior grid, then half the 32 x 32 image
        # grid before a mid-image window
        ModelShape("GLM-Image", 8.23e9, 40, 4096, 256, 16512, 1, 64 + 256 + 1024 // 2),
    )
}


def roofline_seconds(shape: ModelShape, device: Device, k: int, overhead: float = 0.0) -> float:
    """One forward of shape's rows scoring k tokens each on device, by the roofline above."""
    tokens = shape.rows * k
    kv = 2 * shape.layers * shape.rows * (shape.context + k) * shape.kv_dim * shape.itemsize
    bytes_ = shape.params * shape.itemsize + kv + tokens * shape.vocab * 4
    flops = 2 * shape.params * tokens + 4 * shape.layers * tokens * (shape.context + k) * shape.dim
    return (
        max(
            bytes_ / (BANDWIDTH_EFFICIENCY * device.bandwidth),
            flops / (COMPUTE_EFFICIENCY * device.flops),
        )
        + overhead
    )


EVERY_K = tuple(range(1, GRID[-1] + 1))


def roofline(
    shape: ModelShape | str,
    device: Device | str,
    overhead: float = 0.0,
    grid: tuple[int, ...] = EVERY_K,
) -> PassCost:
    """PassCost of shape on a named device (see DEVICES, SHAPES); overhead: t0, seconds per pass. A
    formula needs no interpolation, so it is evaluated at every k up to GRID's last: on GRID's
    points alone the line from 64 to 96 cuts across the knee between them (Lumina-mGPT 7B on an
    H200: a pass of 89 tokens per row at 1.07 single-token passes, where the roofline says 1.02)."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    device = DEVICES[device] if isinstance(device, str) else device
    return PassCost(
        tuple(grid),
        tuple(roofline_seconds(shape, device, k, overhead) for k in grid),
        f"roofline: {shape.name} on {device.name}",
    )
