"""Modeled latency under CPU offload: what speculative decoding gains when the weights that do not fit
the card stream over PCIe once per pass (models.placement's "offload").

A pass scoring k tokens per row costs the roofline's GPU time
(sjdvp_core.datasheet.roofline_seconds) plus the offloaded bytes over the link; the link term does
not grow with k, so a wider window is nearly free there and the wall-clock speed-up approaches the
step compression. Step compressions and tokens per row are the measured ones of
benchmarks/results/latency.json (the demo model); the offloaded bytes are the memory table's need
(tools/memory_table.py) less the card's memory and a 1 GB reserve. Link: PCIe 4.0 at 80% of its 1.97
GB/s per lane and direction (x16 on the RTX 4090, x8 on the RTX 4060 Ti). A model, not a
measurement: no GPU ran it.

    python -m benchmarks.offload     # prints the table and writes benchmarks/results/offload.md
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

from sjdvp_core.datasheet import DEVICES, SHAPES, roofline_seconds

HERE = os.path.dirname(os.path.abspath(__file__))
LANE = 1.969e9 * 0.8  # PCIe 4.0, bytes / s per lane and direction, at 80%
RESERVE = 1.0e9
CASES = (  # (catalogue release, roofline shape, card, PCIe lanes)
    ("Lumina-mGPT-7B-768", SHAPES["Lumina-mGPT 7B"], "RTX 4060 Ti 16GB", 8),
    ("Lumina-mGPT-2.0", SHAPES["Lumina-mGPT 2.0"], "RTX 4090", 16),
)
ROWS = (
    ("ar", 1, "chain"),
    ("sjd-vp", 16, "chain"),
    ("sjd-vp", 32, "chain"),
    ("sjd-vp", 64, "chain"),
    ("sjd-vp", 32, "6x1"),
)


def memory_table():
    spec = importlib.util.spec_from_file_location(
        "memory_table", os.path.join(HERE, "..", "tools", "memory_table.py")
    )
    module = sys.modules["memory_table"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measured_rows() -> dict:
    with open(os.path.join(HERE, "results", "latency.json")) as f:
        rows = json.load(f)["rows"]
    return {(r["method"], r["window"], r["tree"]): r for r in rows if r["coupling"] == "coupled"}


def table() -> str:
    tool, rows = memory_table(), measured_rows()
    lines = [
        "| release on card | offloaded | AR pass | method, window, tree | step compression | "
        "tokens / row / pass | pass cost vs AR's | modeled speed-up | the same if it fit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for release, shape, card, lanes in CASES:
        device = DEVICES[card]
        need = tool.needs(next(r for r in tool.RELEASES if r.name == release))["bf16"].total
        offloaded = max(0.0, need + RESERVE - device.memory_gb * 1e9)
        link = offloaded / (LANE * lanes)
        t1, t1_gpu = roofline_seconds(shape, device, 1, link), roofline_seconds(shape, device, 1)
        for method, window, tree in ROWS:
            r = rows[(method, window, tree)]
            k = max(1, round(r["tokens_per_row"]))
            cost, cost_gpu = (
                roofline_seconds(shape, device, k, link) / t1,
                roofline_seconds(shape, device, k) / t1_gpu,
            )
            lines.append(
                f"| {release} on {card} (bf16) | {offloaded / 1e9:.1f} GB | {t1 * 1e3:.0f} ms "
                f"({t1_gpu * 1e3:.0f} if it fit) | {method}, {window}, {tree} | "
                f"{r['step_compression']:.2f}x | {r['tokens_per_row']:.0f} | {cost:.2f} | "
                f"{r['step_compression'] / cost:.2f}x | {r['step_compression'] / cost_gpu:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    text = table()
    print(text)
    with open(os.path.join(HERE, "results", "offload.md"), "w") as f:
        f.write(
            "# Modeled latency under CPU offload\n\n" + __doc__.split("\n\n    python")[0] + "\n\n"
            "`python -m benchmarks.offload`\n\n" + text + "\n"
        )


if __name__ == "__main__":
    main()
