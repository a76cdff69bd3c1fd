"""What one Jacobi iteration costs as a function of the tokens its forward scores per row: measured on
the device at hand (`measure`, cached on disk by `cached_cost`) or modelled from a model's shape and a
named device's roofline (`roofline`), where no measurement exists and in the benchmark.

A pass is not free past a knee, even on a GPU (docs/design.md, "The cost of a pass"): it reads every
weight once (bandwidth) and does 2 x params FLOPs per token scored (compute), so
    t(k) = max(bytes / (0.85 BW), FLOPs / (0.70 F)) + t0
with R rows per image (CFG: 2) and k tokens per row; bytes = weights + the KV cache read + logits.
Latency speed-up = step compression x t(1) / t(k). On a CPU t(k) grows from k = 1, so small windows win.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import torch

log = logging.getLogger(__name__)

GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)   # tokens per row measured or modelled
BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY = 0.85, 0.70  # of datasheet peak, as reached by good kernels


@dataclass(frozen=True)
class PassCost:
    """t(k): seconds of one iteration (forward plus the engine's step) scoring k tokens per row, at the
    grid points `tokens`; linear in between and past the last point (compute-bound there)."""
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str                      # "measured on <device>" or "roofline: <model> on <device>"
    engine: tuple[float, ...] = ()   # of which the engine's own step, where measured

    def __post_init__(self):
        if len(self.tokens) != len(self.seconds) or not self.tokens or self.tokens[0] != 1 or \
                list(self.tokens) != sorted(set(self.tokens)) or min(self.seconds) <= 0:
            raise ValueError("PassCost: tokens must start at 1 and ascend, with a positive time for each")

    def __call__(self, k: float) -> float:
        ks, ts = self.tokens, self.seconds
        if len(ks) == 1:
            return ts[0] * k
        i = next((j for j in range(1, len(ks)) if k <= ks[j]), len(ks) - 1)
        a, b = ks[i - 1], ks[i]
        return max(ts[0], ts[i - 1] + (ts[i] - ts[i - 1]) * (k - a) / (b - a))

    def relative(self, k: float) -> float:
        """t(k) / t(1): what a pass scoring k tokens per row costs in single-token passes."""
        return self(k) / self(1)

    def largest_within(self, factor: float, cap: int) -> int:
        """The largest window (tokens per row, at most cap) whose pass costs at most factor x t(1)."""
        return max([k for k in range(1, cap + 1) if self.relative(k) <= factor] or [1])

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "PassCost":
        return cls(tuple(d["tokens"]), tuple(d["seconds"]), d["source"], tuple(d.get("engine", ())))


def monotone(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest to values in least squares (isotonic regression by pooling
    adjacent violators): a neighbour pair out of order becomes their mean, and so on outward."""
    blocks: list[list[float]] = []        # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (a, n), (b, m) = blocks[-2], blocks.pop()
            blocks[-1] = [(a * n + b * m) / (n + m), n + m]
    return [mean for mean, count in blocks for _ in range(count)]


# --- the roofline for named devices --------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    name: str
    bandwidth: float   # bytes / s, memory
    flops: float       # dense bf16 FLOP / s with fp32 accumulation (no sparsity)
    memory_gb: float
    source: str


DEVICES = {d.name: d for d in (
    Device("H200", 4.8e12, 989e12, 141, "NVIDIA H200 Tensor Core GPU datasheet (SXM: 4.8 TB/s, BF16 1,979 "
           "TFLOPS with sparsity)"),
    Device("H100", 3.35e12, 989e12, 80, "NVIDIA H100 Tensor Core GPU datasheet (SXM: 3.35 TB/s, BF16 1,979 "
           "TFLOPS with sparsity)"),
    Device("A100 80GB", 2.039e12, 312e12, 80, "NVIDIA A100 Tensor Core GPU datasheet (80 GB SXM: 2,039 GB/s, "
           "BF16 312 TFLOPS)"),
    Device("L40S", 864e9, 362e12, 48, "NVIDIA L40S datasheet (864 GB/s, BF16 362.05 TFLOPS dense, 733 with "
           "sparsity)"),
    Device("RTX 4090", 1008e9, 165.2e12, 24, "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 "
           "(1,008 GB/s; BF16 tensor with FP32 accumulate 165.2 TFLOPS dense)"),
    Device("RTX 3090", 936e9, 71e12, 24, "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090 (936 GB/s; BF16 "
           "tensor with FP32 accumulate 71 TFLOPS dense)"),
    Device("RTX 4060 Ti 16GB", 288e9, 44.1e12, 16, "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX "
           "4060 Ti (288 GB/s; BF16 tensor with FP32 accumulate 44.1 TFLOPS dense)"),
)}


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a model: its parameter count and what its KV cache and logits read."""
    name: str
    params: float        # weights read once per pass
    layers: int
    dim: int             # hidden size (attention FLOPs: queries x keys x dim, twice)
    kv_dim: int          # kv_heads x head_dim (KV cache bytes per token per layer, K and V each)
    vocab: int           # logits written per token scored
    rows: int            # model rows per image (2 with CFG)
    context: int         # tokens before a mid-image window (prompt + half the image)
    itemsize: int = 2    # bf16 weights and cache


SHAPES = {s.name: s for s in (
    # Chameleon-7B architecture (hidden 4096, 32 layers, 32 heads, vocab 65536), 768 px: 48 x 49 tokens
    ModelShape("Lumina-mGPT 7B", 7.0e9, 32, 4096, 4096, 65536, 2, 64 + 48 * 49 // 2),
    # LLaMA 7B body (hidden 4096, 30 layers) + generation head over 16384 codes, 384 px: 24 x 24 tokens
    ModelShape("Janus-Pro-7B", 6.9e9, 30, 4096, 4096, 16384, 2, 40 + 576 // 2),
    # LlamaGen GPT-XL (36 layers, 20 heads, dim 1280, 775M), 384 px: 24 x 24 tokens
    ModelShape("LlamaGen-XL", 775e6, 36, 1280, 1280, 16384, 2, 1 + 576 // 2),
)}


def roofline_seconds(shape: ModelShape, device: Device, k: int, overhead: float = 0.0) -> float:
    """One forward of shape's rows scoring k tokens each on device, by the roofline above."""
    tokens = shape.rows * k
    kv = 2 * shape.layers * shape.rows * (shape.context + k) * shape.kv_dim * shape.itemsize
    bytes_ = shape.params * shape.itemsize + kv + tokens * shape.vocab * 4
    flops = 2 * shape.params * tokens + 4 * shape.layers * tokens * (shape.context + k) * shape.dim
    return max(bytes_ / (BANDWIDTH_EFFICIENCY * device.bandwidth),
               flops / (COMPUTE_EFFICIENCY * device.flops)) + overhead


EVERY_K = tuple(range(1, GRID[-1] + 1))


def roofline(shape: ModelShape | str, device: Device | str, overhead: float = 0.0,
             grid: tuple[int, ...] = EVERY_K) -> PassCost:
    """PassCost of shape on a named device (see DEVICES, SHAPES); overhead: t0, seconds per pass. A formula
    needs no interpolation, so it is evaluated at every k up to GRID's last: on GRID's points alone the line
    from 64 to 96 cuts across the knee between them (Lumina-mGPT 7B on an H200: a pass of 89 tokens per row
    at 1.07 single-token passes, where the roofline says 1.02)."""
    shape = SHAPES[shape] if isinstance(shape, str) else shape
    device = DEVICES[device] if isinstance(device, str) else device
    return PassCost(tuple(grid), tuple(roofline_seconds(shape, device, k, overhead) for k in grid),
                    f"roofline: {shape.name} on {device.name}")


# --- measured on the device at hand ----------------------------------------------------------------
def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def model_fingerprint(module: torch.nn.Module) -> str:
    """Which weights these are, cheaply: every parameter's name, shape and dtype, and a few of its values."""
    h = hashlib.sha256()
    for name, t in list(module.named_parameters()) + list(module.named_buffers()):
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        if t.numel():
            h.update(t.detach().flatten()[:16].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def cache_dir() -> str:
    return os.environ.get("SJDVP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sjdvp")


def cache_path(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), "calibration", f"{digest}.json")


def load_cached(key: dict, kind=PassCost):
    """What save_cached stored under key (a PassCost, or another kind with from_json), or None."""
    try:
        with open(cache_path(key)) as f:
            data = json.load(f)
        return kind.from_json(data["value"]) if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None   # none yet, or unreadable: measured again and rewritten


def cached(key: dict, kind, measure, what: str):
    """The value stored under key, else measure() stored there: how calibrations are reused across runs.
    A measurement is logged (what: what is measured), so the first automatic run's extra seconds say why."""
    value = load_cached(key, kind)
    if value is None:
        log.info("sjdvp: measuring %s once for this model and device (cached in %s)", what, cache_dir())
        start = time.perf_counter()
        value = measure()
        log.info("sjdvp: measured %s in %.1f s", what, time.perf_counter() - start)
        save_cached(key, value)
    return value


def save_cached(key: dict, value) -> None:
    """value: anything with to_json (the pass cost, auto's acceptance profile)."""
    path = cache_path(key)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"key": key, "value": value.to_json()}, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass   # a read-only home: measured again next time
