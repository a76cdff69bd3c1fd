"""Modelled latency of GLM-Image's token stage, and of a whole image, before any real-weights run.

No GLM-Image weights were run: the step compressions and tokens scored per pass are the demo model's, measured
(benchmarks/results/latency.json, coupled rows), and each pass is priced three ways as if it were GLM-Image's:
- the roofline with its shape (sjdvp_core.datasheet.SHAPES["GLM-Image"]: 9B, 2 KV heads, one row) on the
  H200 and the RTX 4090 (its token stage, 20.3 GB in bf16, fits a 24 GB card);
- t(k) measured on an H200 for that shape with random bf16 weights through our adapter
  (benchmarks/results/gpu_check.json; made non-decreasing in k, a pass never costing less than a narrower one).
speed-up = step compression x t(1) / t(tokens scored per row), as benchmarks.offload prices its rows.
A whole image: upstream's own split on an A800 (zai-org/GLM-Image issue #6: the token stage 50.3 s of about
90 s at 1024 px; the DiT and the rest about 40 s) with the token stage divided by the speed-up.

    python -m benchmarks.glm_image_latency     # prints the table and writes benchmarks/results/glm_image_latency.md
"""

from __future__ import annotations

import json
import os

from sjdvp_core.datasheet import DEVICES, SHAPES, roofline_seconds
from sjdvp_core.engine.cost import PassCost, monotone

from .offload import measured_rows

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "GLM-Image token stage (1024 px)"  # its row in gpu_check.json
TOKEN_STAGE_S, IMAGE_S = 50.3, 90.0  # upstream's A800 figures (issue #6)
ROWS = (
    ("ar", 1, "chain"),
    ("sjd", 32, "chain"),
    ("sjd-vp", 16, "chain"),
    ("sjd-vp", 32, "chain"),
    ("sjd-vp", 64, "chain"),
    ("sjd-vp", 32, "6x1/8"),
    ("sjd-vp", 32, "8x1/6"),
)


def measured_cost() -> PassCost:
    """GLM-Image's t(k) on the H200, one row, as gpu_check measured it."""
    with open(os.path.join(HERE, "results", "gpu_check.json")) as f:
        report = json.load(f)
    ms = next(r for r in report["forward"] if r["model"] == MODEL)["rows_1"]["ms"]
    tokens = sorted(int(k) for k in ms)
    return PassCost(
        tuple(tokens),
        tuple(monotone([ms[str(k)] / 1e3 for k in tokens])),
        f"measured on {report['device']} (random weights)",
    )


def table() -> str:
    shape, rows, measured = SHAPES["GLM-Image"], measured_rows(), measured_cost()
    prices = {
        f"roofline {d}": (lambda k, d=DEVICES[d]: roofline_seconds(shape, d, k))
        for d in ("H200", "RTX 4090")
    }
    prices["measured H200"] = measured
    lines = [
        "| method, window, tree | step compression | tokens / row / pass | "
        + " | ".join(f"{p}: token stage | {p}: whole image" for p in prices)
        + " |",
        "|---|---|---|" + "---|---|" * len(prices),
    ]
    for key in ROWS:
        r = rows[key]
        k = max(1, round(r["tokens_per_row"]))
        cells = []
        for price in prices.values():
            speedup = r["step_compression"] * price(1) / price(k)
            cells.append(
                f"{speedup:.2f}x | {IMAGE_S / (IMAGE_S - TOKEN_STAGE_S + TOKEN_STAGE_S / speedup):.2f}x"
            )
        lines.append(
            f"| {', '.join(map(str, key))} | {r['step_compression']:.2f}x | {r['tokens_per_row']:.0f} | "
            + " | ".join(cells)
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    text = table()
    print(text)
    with open(os.path.join(HERE, "results", "glm_image_latency.md"), "w") as f:
        f.write(
            "# GLM-Image: modelled latency of the token stage and of a whole image\n\n"
            + __doc__.split("\n\n    python")[0]
            + "\n\n`python -m benchmarks.glm_image_latency`\n\n"
            + text
            + "\n"
        )


if __name__ == "__main__":
    main()
