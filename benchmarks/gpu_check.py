"""GPU check, for sessions lent a GPU: everything we otherwise model, measured in one run that writes
what it has after every row (a lease can end mid-run) and stops starting new work past its time
budget.

Every family's shape at real size with random bf16 weights (no download;
benchmarks/releases.py, the memory table's architectures), driven through HFAdapter's cache,
masks and RoPE (LlamaGen, GLM-Image: their own adapters) with the family adapter's embedding and
head:
1. forward: t(k), one pass scoring k tokens per row mid-image, k = 1 ... 256, with one row and with
   CFG's two, eager and captured (replayed as a CUDA graph, sjdvp_core/engine/captured.py: its
   recording time and memory, or why it ran eagerly), beside the floor (the weights read once at the
   datasheet's bandwidth) and the roofline's t(k) / t(1) for the same shape on this device
   (sjdvp_core/datasheet.py); and the peak memory of the prompt plus a 64-token pass against
   models.memory.need's estimate.
2. quantised: Lumina-mGPT 7B with our int8 and bitsandbytes' NF4 layers against bf16: t(1), t(16),
   t(64) and the largest logit difference (relative to the largest bf16 logit).
3. offload: the same model with half its blocks in CPU memory (models.placement, accelerate's
   hooks): t(k), and the host link's speed that implies.
4. demo: AR / SJD / SJD-VP wall-clock on the demo model (benchmarks.compare_methods), eager and
   captured.
5. engine: the engine's own step per iteration (a model that costs nothing), eager, recorded as a
   CUDA graph with the pass (captured), compiled, and compiled with CUDA graphs (reduce-overhead),
   at each family's image vocabulary.

    python -m benchmarks.gpu_check --out gpu_check          # on the GPU: gpu_check.json and gpu_check.md
    python -m benchmarks.gpu_check --tiny                   # the same code path, tiny, on a CPU (the test suite)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import Callable

import torch

from benchmarks import releases
from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    VPSettings,
    WindowSettings,
    decode,
)
from sjdvp_core.datasheet import DEVICES, SHAPES, Device, roofline_seconds
from sjdvp_core.engine.adapter import ModelAdapter, TokenLayout
from sjdvp_core.engine.captured import RECORD_AT, Passes
from sjdvp_core.models import memory, placement, quantize
from sjdvp_core.models.hf_adapter import HFAdapter
from sjdvp_core.timing import interleaved

from . import local

TOKENS = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256)  # k: tokens per row scored by one pass
QUANTISED_TOKENS = (1, 16, 64)
CAPTURED_TOKENS = (1, 32, 64, 128, 256)  # the captured table's columns (every k is measured)


class Deadline:
    """The run's time budget: sections ask before each unit of work, and what was not started is
    reported."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


# --- the shapes: the releases' architectures (benchmarks/releases.py) ----------------------
@dataclass(frozen=True)
class Arch:
    name: str
    build: Callable  # (device, dtype, tiny) -> an adapter (releases.py)
    roofline: str  # its shape in sjdvp_core.datasheet.SHAPES


ARCHS = (
    Arch("Lumina-mGPT 7B (768 px)", releases.lumina_mgpt_7b, "Lumina-mGPT 7B"),
    Arch("Lumina-mGPT 2.0 (768 px)", releases.lumina_mgpt_2, "Lumina-mGPT 2.0"),
    Arch("Emu3-Gen 8B (720 px)", releases.emu3_gen, "Emu3-Gen"),
    Arch("Janus-Pro-7B (384 px)", releases.janus_pro(4096, 30, 11008, 32), "Janus-Pro-7B"),
    Arch("LlamaGen-XL c2i (384 px)", releases.llamagen("GPT-XL", "c2i", 576), "LlamaGen-XL"),
    Arch("GLM-Image token stage (1024 px)", releases.glm_image, "GLM-Image"),
)


def build(arch: Arch, tiny: bool, device, dtype):
    """arch's adapter with random weights, built on device (torch.manual_seed(0): the same weights
    every time; the layout on the CPU, as a loader leaves it)."""
    torch.manual_seed(0)
    adapter = arch.build(device=device, dtype=dtype, tiny=tiny)
    adapter.module.eval().requires_grad_(False)
    return adapter


def conditions(adapter) -> list:
    """One image's condition: the probe's own prompt for transformers families, a class id for
    LlamaGen."""
    return ["a prompt"] if isinstance(adapter, HFAdapter) else [0]


# --- 1. forward passes and memory -----------------------------------------------------------------
def pass_timer(
    adapter,
    cfg: bool,
    tokens,
    repeats: int,
    device,
    passes: str = "eager",
    seen: dict | None = None,
) -> dict[int, float]:
    """Seconds of one forward scoring k tokens per row mid-image, for k in tokens (the prompt's pass
    first), the pass run as `passes` (settings.PASS_MODES: each shape recorded in the warm-up
    rounds where it is captured). seen: filled with what ran (Passes.kind), the recording's
    seconds and the memory the graphs hold."""
    adapter.start(conditions(adapter), None, cfg)
    L, K = adapter.layout.length, adapter.layout.image_tokens.numel()
    R = 2 if cfg else 1
    run = Passes(adapter, passes)
    fns = {}
    for k in tokens:
        at = max(0, min(L // 2, L - k))
        positions = (at + torch.arange(min(k, L), device=device)).expand(R, -1)
        ids = torch.randint(0, K, positions.shape, device=device)
        fns[k] = functools.partial(run.forward, ids, positions)
    held = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    with torch.inference_mode():
        times = interleaved(fns, repeats, warmup=RECORD_AT, device=device)
    if seen is not None:
        seen.update(
            passes=run.kind,
            record_s=round(run.record_seconds, 3),
            graphs_gb=round(
                ((torch.cuda.memory_allocated() if device.type == "cuda" else 0) - held) / 1e9, 3
            ),
        )
    adapter.finish()
    return {k: t.median for k, t in times.items()}


def weight_bytes(adapter) -> int:
    return sum(t.numel() * t.element_size() for t in adapter.module.state_dict().values())


def peak_memory(adapter, device) -> dict:
    """Bytes measured with the family's default rows (the prompt, then a 64-token pass) against
    the estimate."""
    cfg = adapter.default_sampling.cfg_scale > 1
    estimate = memory.need(adapter, "bf16", "bf16", conditions=conditions(adapter))
    if device.type != "cuda":
        return dict(estimate_gb=round(estimate.total / 1e9, 3))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    weights = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    pass_timer(adapter, cfg, (64,), 1, device)
    peak = torch.cuda.max_memory_allocated()
    return dict(
        weights_gb=round(weights / 1e9, 3),
        estimate_weights_gb=round(estimate.weights / 1e9, 3),
        peak_gb=round(peak / 1e9, 3),
        estimate_gb=round(estimate.total / 1e9, 3),
        estimate_over_peak=round(estimate.total / peak, 3),
    )


def forward_rows(
    report,
    arch: Arch,
    tiny,
    device,
    dtype,
    repeats,
    deadline: Deadline,
    device_sheet: Device | None,
):
    adapter = build(arch, tiny, device, dtype)
    shape = SHAPES[arch.roofline]
    tokens = [k for k in TOKENS if k <= adapter.layout.length]
    row = dict(
        model=arch.name, image_tokens=adapter.layout.length, memory=peak_memory(adapter, device)
    )
    for cfg in (False, True) if adapter.default_sampling.cfg_scale > 1 else (False,):
        if deadline.left() < 0:
            row[f"rows_{2 if cfg else 1}"] = "skipped: out of time"
            continue
        t = pass_timer(adapter, cfg, tokens, repeats, device)
        seen = {}
        captured = pass_timer(adapter, cfg, tokens, repeats, device, "captured", seen)
        measured = {k: round(1e3 * s, 3) for k, s in t.items()}
        modelled = None
        if device_sheet is not None:
            one = replace(shape, rows=2 if cfg else 1)
            modelled = {
                k: round(
                    roofline_seconds(one, device_sheet, k) / roofline_seconds(one, device_sheet, 1),
                    3,
                )
                for k in tokens
            }
        floor = (
            None
            if device_sheet is None
            else round(1e3 * weight_bytes(adapter) / device_sheet.bandwidth, 3)
        )
        row[f"rows_{2 if cfg else 1}"] = dict(
            ms=measured,
            relative={k: round(s / t[1], 3) for k, s in t.items()},
            roofline_relative=modelled,
            floor_ms=floor,
            captured_ms={k: round(1e3 * s, 3) for k, s in captured.items()},
            **seen,
        )
    report["forward"].append(row)


# --- 2. quantised forwards ------------------------------------------------------------------------
def quantised_rows(report, arch, tiny, device, dtype, repeats, deadline):
    """bf16, int8 and NF4 of the same weights: pass time and the logits' largest difference from
    bf16's."""
    reference = None
    for precision in ("bf16", "int8", "nf4"):
        if deadline.left() < 0:
            report["quantised"].append(dict(precision=precision, skipped="out of time"))
            continue
        try:
            adapter = build(arch, tiny, device, dtype)
            started = time.perf_counter()
            if precision != "bf16":
                layers = quantize.swap_linears(adapter.blocks(), precision, dtype)
                for layer in layers:
                    layer.to(device)
            quantise_s = time.perf_counter() - started
            logits = probe_logits(adapter, device)
            reference = logits if reference is None else reference
            t = pass_timer(adapter, True, QUANTISED_TOKENS, repeats, device)
            report["quantised"].append(
                dict(
                    model=arch.name,
                    precision=precision,
                    quantise_s=round(quantise_s, 1),
                    weights_gb=round(quantize.weight_bytes(adapter.module) / 1e9, 3),
                    ms={k: round(1e3 * s, 3) for k, s in t.items()},
                    max_logit_diff_relative=round(
                        float((logits - reference).abs().max() / reference.abs().max()), 4
                    ),
                    same_argmax=round(
                        float((logits.argmax(-1) == reference.argmax(-1)).float().mean()), 4
                    ),
                )
            )
        except (
            Exception
        ) as e:  # bitsandbytes missing or failing on this device: reported, not fatal
            report["quantised"].append(dict(model=arch.name, precision=precision, error=_error(e)))
        finally:
            adapter = None
            _free(device)


@torch.inference_mode()
def probe_logits(adapter, device) -> torch.Tensor:
    """Logits of a fixed 32-token pass mid-image (CFG rows)."""
    adapter.start(conditions(adapter), None, True)
    g = torch.Generator().manual_seed(1)
    at = adapter.layout.length // 2
    positions = (at + torch.arange(min(32, adapter.layout.length - at))).expand(2, -1).to(device)
    ids = torch.randint(0, adapter.layout.image_tokens.numel(), positions.shape, generator=g).to(
        device
    )
    logits = adapter.forward(ids, positions).float()
    adapter.finish()
    return logits


# --- 3. offload -----------------------------------------------------------------------------------
def offload_row(report, arch, tiny, device, dtype, repeats, deadline, on_gpu: dict):
    """Half the blocks in CPU memory, streamed in per pass: t(k) and the host link speed it
    implies."""
    adapter = build(arch, tiny, device, dtype)
    adapter.module.to("cpu")  # as a loader leaves it: placing moves all but the offloaded blocks
    blocks = list(range(0, len(adapter.blocks()), 2))
    moved = sum(
        p.numel() * p.element_size() for i in blocks for p in adapter.blocks()[i].parameters()
    )
    placement.place(adapter, placement.offload_map(adapter, blocks, "cpu", device), device)
    t = pass_timer(adapter, True, QUANTISED_TOKENS, repeats, device)
    link = moved / max(1e-9, t[1] - on_gpu[1] / 1e3)
    report["offload"] = dict(
        model=arch.name,
        offloaded_gb=round(moved / 1e9, 2),
        ms={k: round(1e3 * s, 3) for k, s in t.items()},
        relative={k: round(s / t[1], 3) for k, s in t.items()},
        on_gpu_ms={k: on_gpu[k] for k in QUANTISED_TOKENS},
        implied_link_gb_s=round(link / 1e9, 2),
    )
    _free(device)


# --- 4. the demo's wall-clock ---------------------------------------------------------------------
def demo_rows(device, tiny) -> list[dict]:
    """The demo's methods against AR, with eager passes and with captured ones (each against AR
    run the same way)."""
    from .compare_methods import main as compare

    rows = []
    for passes in ("eager", "captured"):
        out = compare(
            model="demo",
            windows=(16,) if tiny else (16, 32),
            seeds=1 if tiny else 2,
            prompts=1 if tiny else 2,
            methods=("ar", "sjd", "sjd-vp"),
            coupling=("on",),
            repeats=1 if tiny else 3,
            device=str(device),
            threads=torch.get_num_threads(),
            passes=passes,
        )
        rows += [
            {"passes": passes}
            | {
                k: r[k]
                for k in (
                    "method",
                    "window",
                    "coupled",
                    "step_compression",
                    "latency_speedup",
                    "wall_s",
                )
            }
            for r in out
        ]
    return rows


# --- 5. the engine's own step ---------------------------------------------------------------------
class FreeModel(ModelAdapter):
    """Logits that cost (almost) nothing, so a decode's time is the engine's own."""

    family = "free model"

    def __init__(self, K, grid, device):
        self.device = torch.device(device)
        self.layout = TokenLayout.raster(torch.arange(K), grid, grid, row_end=K)
        self.default_sampling = SamplingSettings(cfg_scale=3.0, top_k=2000)
        self.module = torch.nn.Module()
        self.V = K + 1
        seeded = torch.Generator(self.device).manual_seed(0)
        self.table = torch.randn(8, self.V, device=self.device, generator=seeded) * 3

    def start(self, conditions, negatives, cfg, scratch=0):
        return self.layout, self.table[: 2 * len(conditions) if cfg else len(conditions)].clone()

    def forward(self, tokens, positions):
        return self.table[(positions + tokens) % 8]


def _ms_per_iteration(runs, *phases: str) -> float:
    """The median over decodes of the time their phases (DecodeStats.time_*) took per iteration,
    in ms."""
    return round(
        1000
        * statistics.median(
            sum(getattr(r.stats, f"time_{p}") for p in phases) / (r.stats.forward_passes - 1)
            for r in runs
        ),
        3,
    )


# how the step runs beside eager, per device: recorded as a CUDA graph with the pass (captured,
# engine/captured.py; on the CPU it runs eagerly and says so), and torch.compile's modes
MODES = {"cuda": ("captured", "default", "reduce-overhead"), "cpu": ("captured", "default")}
DRAFTERS = {
    "sjd": DrafterSettings(coupled=False),
    "sjd coupled": DrafterSettings(coupled=True),
    "sjd-vp auto coupled": DrafterSettings(vp=VPSettings(), coupled=True),
}
VOCABS = (("Lumina-mGPT", 8192, 48), ("Emu3", 32768, 90), ("Janus-Pro", 16384, 24))


def engine_rows(report, tiny: bool, device, repeats: int, deadline: Deadline):
    """Engine ms per iteration (draft and verify phases, or the compiled or recorded step's one),
    the median over `repeats` seeds, W = 32; coupled SJD and the default drafter (SJD-VP,
    coupled) also recorded as a CUDA graph and through torch.compile in each mode."""
    compiled = [d for d in DRAFTERS.items() if d[1].coupled]
    for name, K, grid in VOCABS:
        model = FreeModel(K, 8 if tiny else grid, device)
        eager = {}
        for (label, drafter), mode in [(d, None) for d in DRAFTERS.items()] + [
            (d, m) for m in MODES[device.type] for d in compiled
        ]:
            if deadline.left() < 0:
                report["engine"].append(
                    dict(vocab=name, drafter=label, compiled=mode, skipped="out of time")
                )
                continue
            s = DecodeSettings(
                window=WindowSettings(32),
                drafter=drafter,
                sampling=model.default_sampling,
                compile=mode not in (None, "captured"),
                passes=mode if mode == "captured" else "eager",
            )
            os.environ["SJDVP_COMPILE_MODE"] = "" if mode in (None, "default", "captured") else mode
            torch._dynamo.reset()
            skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
            try:
                if mode is not None:
                    decode(model, [None], s)  # compiles (not timed)
                runs = [
                    decode(model, [None], replace(s, seed=seed), timing=True)
                    for seed in range(repeats)
                ]
            except Exception as e:  # an experimental mode may fail on this device: report it
                report["engine"].append(
                    dict(vocab=name, drafter=label, compiled=mode, error=_error(e))
                )
                continue
            finally:
                os.environ.pop("SJDVP_COMPILE_MODE")
            res = runs[0]
            eager.setdefault(label, res.tokens)
            per_iteration = functools.partial(_ms_per_iteration, runs)
            report["engine"].append(
                dict(
                    vocab=name,
                    drafter=label,
                    compiled=mode,
                    passes=res.stats.passes,
                    iterations=res.stats.forward_passes - 1,
                    same_tokens_as_eager=None
                    if mode is None
                    else bool(torch.equal(res.tokens, eager[label])),
                    engine_ms_per_iteration=per_iteration("draft", "verify", "step"),
                    draft_ms=per_iteration("draft"),
                    verify_ms=per_iteration("verify"),
                    compiled_step_ms=per_iteration("step"),
                    # graphs inductor ran without CUDA graphs under reduce-overhead (mutated
                    # inputs...)
                    cudagraph_skips=torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
                    - skips,
                )
            )
            print(report["engine"][-1], flush=True)


# --- the run --------------------------------------------------------------------------------------
def _error(e: Exception) -> str:
    """An error on one line of the report, its paths relative to the checkout."""
    return local(f"{type(e).__name__}: {e}")[:400]


def _free(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def datasheet_device(name: str) -> Device | None:
    """The datasheet entry whose name this device's contains ("NVIDIA H200" -> H200), for the
    roofline column."""
    return next(
        (
            d
            for key, d in DEVICES.items()
            if key.replace(" ", "").lower() in name.replace(" ", "").lower()
        ),
        None,
    )


SECTIONS = ("forward", "quantised", "offload", "demo", "engine")


def main(tiny=False, out=None, repeats=7, budget=420.0, sections=SECTIONS):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    deadline = Deadline(budget)
    report = dict(
        device=name,
        tiny=tiny,
        torch=torch.__version__,
        repeats=repeats,
        budget_s=budget,
        forward=[],
        quantised=[],
        offload=None,
        demo=None,
        engine=[],
    )

    def save(section: str, started: float):
        report.setdefault("seconds", {})[section] = round(time.monotonic() - started, 1)
        print(f"{section}: {report['seconds'][section]} s", flush=True)
        if out:
            write(report, out)

    sheet = datasheet_device(name)
    on_gpu = {}
    for section in sections:
        started = time.monotonic()
        try:
            if section == "forward":
                for arch in ARCHS:
                    if deadline.left() < 0:
                        report["forward"].append(dict(model=arch.name, skipped="out of time"))
                        continue
                    try:
                        forward_rows(report, arch, tiny, device, dtype, repeats, deadline, sheet)
                        if arch is ARCHS[0]:
                            on_gpu = report["forward"][0]["rows_2"]["ms"]
                    except Exception as e:
                        report["forward"].append(dict(model=arch.name, error=_error(e)))
                    _free(device)
                    print(report["forward"][-1], flush=True)
                    save(section, started)
            elif deadline.left() < 0:
                report[section] = (
                    dict(skipped="out of time")
                    if report[section] is None
                    else report[section] + [dict(skipped="out of time")]
                )
            elif section == "quantised":
                quantised_rows(report, ARCHS[0], tiny, device, dtype, repeats, deadline)
            elif section == "offload":
                if device.type != "cuda" or not on_gpu:
                    report["offload"] = dict(skipped="needs a CUDA device and the forward section")
                else:
                    offload_row(report, ARCHS[0], tiny, device, dtype, repeats, deadline, on_gpu)
            elif section == "demo":
                report["demo"] = demo_rows(device, tiny)
            elif section == "engine":
                engine_rows(report, tiny, device, max(1, repeats // 3), deadline)
        except Exception as e:
            report[section] = dict(error=_error(e))
        save(section, started)
    return report


def write(report: dict, out: str) -> None:
    with open(out + ".json", "w") as f:
        json.dump(report, f, indent=1)
    with open(out + ".md", "w") as f:
        f.write(markdown(report))


def markdown(report: dict) -> str:
    """The report's tables (what was measured; a section cut short says so)."""
    commands = report.get("commands") or [
        f"python -m benchmarks.gpu_check{' --tiny' if report['tiny'] else ''} --repeats {report['repeats']} "
        f"--budget {report['budget_s']:g}"
    ]
    lines = [
        f"# GPU check: {report['device']}",
        "",
        " and ".join(f"`{c}`" for c in commands)
        + f" (torch {report['torch']}; random bf16 weights at each release's size; times are medians of the "
        "repeats, interleaved after a warm-up)",
        "",
    ]
    lines += [
        "## Forward passes: t(k) / t(1), measured (roofline)",
        "",
        "| model | rows | t(1) ms | " + " | ".join(f"k={k}" for k in TOKENS) + " |",
        "|---|---|---|" + "---|" * len(TOKENS),
    ]
    for row in report["forward"]:
        for key in ("rows_1", "rows_2"):
            r = row.get(key)
            if isinstance(r, dict):
                cells = [_cell(r, k) for k in TOKENS]
                lines.append(
                    f"| {row['model']} | {key[-1]} | {_get(r['ms'], 1):.2f} | "
                    + " | ".join(cells)
                    + " |"
                )
        if "error" in row or "skipped" in row:
            lines.append(f"| {row['model']} | | {_why(row)} |")
    lines += [
        "",
        "## Forward passes captured (CUDA graphs): t(k) ms, eager -> captured, and the floor",
        "",
        "(the floor: the weights read once at the datasheet's bandwidth; recording: seconds for every shape, "
        "and the memory the graphs hold)",
        "",
        "| model | rows | floor ms | "
        + " | ".join(f"k={k}" for k in CAPTURED_TOKENS)
        + " | recording | passes |",
        "|---|---|---|" + "---|" * (len(CAPTURED_TOKENS) + 2),
    ]
    for row in report["forward"]:
        for key in ("rows_1", "rows_2"):
            r = row.get(key)
            if isinstance(r, dict) and "captured_ms" in r:
                cells = [_both(r, k) for k in CAPTURED_TOKENS]
                floor = "" if r.get("floor_ms") is None else f"{r['floor_ms']:.2f}"
                lines.append(
                    f"| {row['model']} | {key[-1]} | {floor} | "
                    + " | ".join(cells)
                    + f" | {r['record_s']} s, {r['graphs_gb']} GB | {r['passes']} |"
                )
    lines += [
        "",
        "## Peak memory: the prompt and a 64-token pass, against models.memory.need",
        "",
        "| model | weights GB (estimate) | peak GB | estimate GB | estimate / peak |",
        "|---|---|---|---|---|",
    ]
    for row in report["forward"]:
        m = row.get("memory")
        if m and "peak_gb" in m:
            lines.append(
                f"| {row['model']} | {m['weights_gb']:.2f} ({m['estimate_weights_gb']:.2f}) | "
                f"{m['peak_gb']:.2f} | {m['estimate_gb']:.2f} | {m['estimate_over_peak']:.2f} |"
            )
    lines += [
        "",
        "## Quantised layers (CFG rows)",
        "",
        "| model | precision | weights GB | quantise s | "
        + " | ".join(f"t({k}) ms" for k in QUANTISED_TOKENS)
        + " | max logit diff / max logit | same argmax |",
        "|---|---|---|---|" + "---|" * (len(QUANTISED_TOKENS) + 2),
    ]
    for r in report["quantised"]:
        if "ms" in r:
            ms = {int(k): v for k, v in r["ms"].items()}
            lines.append(
                f"| {r['model']} | {r['precision']} | {r['weights_gb']:.2f} | {r['quantise_s']} | "
                + " | ".join(f"{ms[k]:.2f}" for k in QUANTISED_TOKENS)
                + f" | {r['max_logit_diff_relative']} | {r['same_argmax']} |"
            )
        else:
            lines.append(f"| {r.get('model', '')} | {r['precision']} | {_why(r)} |")
    o = report["offload"]
    lines += ["", "## Offload: half the blocks in CPU memory (CFG rows)", ""]
    if o and "ms" in o:
        lines += [
            "| model | offloaded GB | "
            + " | ".join(f"t({k}) ms (on the GPU)" for k in QUANTISED_TOKENS)
            + " | implied host link GB/s |",
            "|---|---|" + "---|" * (len(QUANTISED_TOKENS) + 1),
            f"| {o['model']} | {o['offloaded_gb']} | "
            + " | ".join(
                f"{_get(o['ms'], k):.1f} ({_get(o['on_gpu_ms'], k):.1f})" for k in QUANTISED_TOKENS
            )
            + f" | {o['implied_link_gb_s']} |",
        ]
    else:
        lines.append(str(o))
    lines += ["", "## Demo model: wall-clock against AR", ""]
    if isinstance(report["demo"], list):
        lines += [
            "| passes | method | window | step compression | wall-clock speed-up | s |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r.get('passes', 'eager')} | {r['method']} | {r['window']} | {r['step_compression']:.2f}x | "
            f"{r['latency_speedup']:.2f}x | {r['wall_s']:.2f} |"
            for r in report["demo"]
        ]
    else:
        lines.append(str(report["demo"]))
    lines += per_image(report)
    lines += [
        "",
        "## The engine's own step (W = 32, a model that costs nothing), ms per iteration",
        "",
        "| vocabulary | drafter | compiled | ms / iteration | draft | verify | compiled step | same tokens | "
        "CUDA-graph skips |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["engine"] if isinstance(report["engine"], list) else [report["engine"]]:
        if "engine_ms_per_iteration" in r:
            lines.append(
                f"| {r['vocab']} | {r['drafter']} | {r['compiled'] or 'eager'} | "
                f"{r['engine_ms_per_iteration']} | {r['draft_ms']} | {r['verify_ms']} | "
                f"{r['compiled_step_ms']} | {r['same_tokens_as_eager']} | {r['cudagraph_skips']} |"
            )
        else:
            lines.append(
                f"| {r.get('vocab', '')} | {r.get('drafter', '')} | {r.get('compiled')} | {_why(r)} |"
            )
    lines += [
        "",
        "Seconds per section: "
        + ", ".join(f"{k} {v}" for k, v in report.get("seconds", {}).items()),
        "",
    ]
    return "\n".join(lines)


def per_image(report: dict) -> list[str]:
    """Seconds of each release's token stage per image, modelled: its image tokens x the pass cost
    measured above, AR at t(1), SJD-VP at t(W) over the demo's step compression at window W
    measured in this run (captured)."""
    demo = report["demo"] if isinstance(report["demo"], list) else []
    found = {
        r["window"]: r["step_compression"]
        for r in demo
        if r.get("passes") == "captured" and r["method"] == "sjd-vp"
    }
    if not found:
        return []
    W = max(found)
    lines = [
        "",
        f"## Token stage per image, modelled (image tokens x measured t(k); SJD-VP: the demo's "
        f"{found[W]:.2f}x fewer passes at W = {W})",
        "",
        "| model | rows | AR eager s | AR captured s | SJD-VP eager s | SJD-VP captured s |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["forward"]:
        r = row.get("rows_2") if isinstance(row.get("rows_2"), dict) else row.get("rows_1")
        if not isinstance(r, dict) or "captured_ms" not in r or _get(r["ms"], W) is None:
            continue
        L, passes = row["image_tokens"], row["image_tokens"] / found[W]
        cells = [
            L * _get(r["ms"], 1),
            L * _get(r["captured_ms"], 1),
            passes * _get(r["ms"], W),
            passes * _get(r["captured_ms"], W),
        ]
        lines.append(
            f"| {row['model']} | {'2' if r is row.get('rows_2') else '1'} | "
            + " | ".join(f"{c / 1e3:.1f}" for c in cells)
            + " |"
        )
    return lines


def _why(r: dict) -> str:
    """A row's error or skip, on one line of a table."""
    return (
        (r.get("error") or r.get("skipped") or "")
        .split(" Stack trace")[0]
        .replace("\n", " ")
        .replace("|", "/")
    )


def _cell(r: dict, k: int) -> str:
    """t(k) / t(1) measured, and the roofline's in brackets where this device has a datasheet
    entry."""
    measured, model = _get(r["relative"], k), _get(r["roofline_relative"] or {}, k)
    return (
        "" if measured is None else f"{measured:.2f}" + ("" if model is None else f" ({model:.2f})")
    )


def _both(r: dict, k: int) -> str:
    """t(k) eager -> captured, in ms."""
    eager, fast = _get(r["ms"], k), _get(r["captured_ms"], k)
    return "" if eager is None or fast is None else f"{eager:.2f} -> {fast:.2f}"


def _get(d: dict, k: int):
    """d[k] whether the keys are ints (in memory) or strings (read back from JSON); None if
    absent."""
    return d.get(k, d.get(str(k)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--tiny", action="store_true", help="tiny configs: a dry run of the same code on a CPU"
    )
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument(
        "--budget", type=float, default=420.0, help="seconds after which no new work starts"
    )
    ap.add_argument("--sections", nargs="+", choices=SECTIONS, default=SECTIONS)
    ap.add_argument("--out", help="write <out>.json and <out>.md, after every row")
    main(**vars(ap.parse_args()))
