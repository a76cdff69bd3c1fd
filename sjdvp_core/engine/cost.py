"""What one Jacobi iteration costs as a function of the tokens its forward scores per row (PassCost):
measured on the device at hand (calibration.py, cached on disk by `cached`), or modelled from a model's
shape and a named device's datasheet (sjdvp_core/datasheet.py's `roofline`, for the benchmarks).

A pass is not free past a knee, even on a GPU (docs/design.md, "The cost of a pass"): it reads every
weight once (bandwidth) and does 2 x params FLOPs per token scored (compute), so
    t(k) = max(bytes / (0.85 BW), FLOPs / (0.70 F)) + t0
with R rows per image (CFG: 2) and k tokens per row; bytes = weights + the KV cache read + logits.
Latency speed-up = step compression x t(1) / t(k). On a CPU t(k) grows from k = 1, so small windows win.
"""
from __future__ import annotations

import contextlib
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


# --- measured on the device at hand ----------------------------------------------------------------
def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def weights_key(module: torch.nn.Module) -> dict:
    """The weights, for a cache key, in one walk over them: which they are ("weights": every parameter's and
    buffer's name, shape and dtype, and a few values where the module holds them: an offloaded block's are on the
    meta device between passes, models.placement), the first parameter's dtype, and where they sit ("placement":
    the devices holding them, "meta" for offloaded blocks; a pass's cost depends on it, its acceptance does not)."""
    params = list(module.named_parameters())
    h, devices = hashlib.sha256(), set()
    for name, t in params + list(module.named_buffers()):
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        if t.numel() and not t.is_meta:
            h.update(t.detach().flatten()[:16].float().cpu().numpy().tobytes())
        devices.add(str(t.device))
    return {"weights": h.hexdigest()[:16], "placement": ",".join(sorted(devices)),
            "dtype": str(params[0][1].dtype) if params else "none"}


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


def forget_cached(key: dict) -> None:
    """What save_cached stored under key is measured again when next asked for."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(cache_path(key))


def save_cached(key: dict, value) -> None:
    """value: anything with to_json (the pass cost, auto's acceptance profile)."""
    path = cache_path(key)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"key": key, "value": value.to_json()}, f, indent=1)
        os.replace(tmp, path)
    except OSError:    # a read-only home or a full disk: measured again next time
        with contextlib.suppress(OSError):
            os.remove(tmp)
