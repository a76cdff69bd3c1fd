"""What the user gets in seconds: for every row (method, window or auto, tree, coupling, the engine's
step eager or through torch.compile) the step compression, the tokens each pass scored per row, the
CPU wall-clock speed-up over the faster AR row (median of the repeats, every row interleaved in each
repeat after one warm-up each, one process, one thread pool), and the modelled latency speed-up on
named GPUs for the shapes of Lumina-mGPT 7B, Janus-Pro-7B and LlamaGen-XL:

    modelled speed-up = AR's passes x t(1) / sum over this decode's passes of t(tokens it scored)

with t the roofline of sjdvp_core/datasheet.py (weights read once per pass, 2 x params FLOPs per
token scored, 85% / 70% of peak bandwidth / FLOPs; the engine's own step is left out). The step
counts are the demo's, priced as if each pass were that model's on that device. Automatic-window
rows choose by the cost they are priced with: on the CPU the measured one, in each modelled column
that device and model's roofline (what auto would choose on that card), with the demo's acceptance
profile (engine/auto.py; measured once and cached). "tree: auto" rows may also choose auto.TREES'
capped draft tree, "chain" rows only windows.

    python -m benchmarks.latency --out benchmarks/results/latency
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from typing import NamedTuple

import torch

from sjdvp_core.datasheet import roofline
from sjdvp_core.engine.calibration import calibration, warm_up
from sjdvp_core.engine.decode import decode
from sjdvp_core.engine.settings import TreeSettings, method_settings
from sjdvp_core.models.loading import load_model
from sjdvp_core.timing import interleaved

from . import shown

PROMPTS = ("a red circle on grass", "a blue square on snow", "a green diamond on sand")
MODELLED = [
    (d, m) for d in ("H200", "RTX 4090") for m in ("Lumina-mGPT 7B", "Janus-Pro-7B", "LlamaGen-XL")
]
# auto.TREES: each alternative followed by at most 4 drafts,
CAPPED = TreeSettings(width=6, branch=4)
LONGER = TreeSettings(width=6, branch=8)  # ... 8 drafts,
WIDER = TreeSettings(width=8, branch=6)  # ... 8 alternatives followed by at most 6


class Row(NamedTuple):
    method: str
    window: int
    auto: str  # "": a fixed window; "chain": windows only; "tree": capped trees too
    tree: TreeSettings = TreeSettings()
    coupled: bool = True
    compiled: bool = False  # the engine's step through torch.compile (`--compile`)


EAGER = (
    Row("ar", 1, ""),
    Row("sjd", 8, ""),
    Row("sjd", 32, ""),
    Row("sjd-vp", 4, ""),
    Row("sjd-vp", 8, ""),
    Row("sjd-vp", 16, ""),
    Row("sjd-vp", 32, ""),
    Row("sjd-vp", 64, ""),
    Row("sjd-vp", 128, ""),
    Row("sjd-vp", 32, "", TreeSettings(width=6)),
    Row("sjd-vp", 32, "", CAPPED),
    Row("sjd-vp", 64, "", CAPPED),
    Row("sjd-vp", 32, "", LONGER),
    Row("sjd-vp", 32, "", WIDER),
    Row("sjd-vp", 32, "", coupled=False),
    Row("sjd", 128, "tree"),
    Row("sjd-vp", 128, "chain"),
    Row("sjd-vp", 128, "tree"),
)
# compiled twins of AR, the fixed coupled chains of 8 and 16 tokens and the automatic windows; the
# speed-up's baseline is the faster AR row
COMPILED = tuple(
    row._replace(compiled=True)
    for row in EAGER
    if row.method == "ar" or row.auto or (row.window in (8, 16) and not row.tree.on and row.coupled)
)
ROWS = EAGER + COMPILED


def settings(adapter, row: Row, seed):
    return method_settings(
        row.method,
        row.window,
        adapter.default_sampling,
        seed,
        coupled=row.coupled,
        auto=bool(row.auto),
        auto_tree=row.auto == "tree",
        tree=row.tree,
        compile=row.compiled,
    )


def label(row: Row) -> dict:
    method, window, auto, tree, coupled, compiled = row
    shape = (
        f"{tree.width}x{tree.depth}" + (f"/{tree.branch}" if tree.branch else "")
        if tree.on
        else "chain"
    )
    return {
        "method": method,
        "window": f"auto<={window}" if auto else window,
        "tree": {"tree": "auto", "chain": "chain"}.get(auto, shape),
        "coupling": "coupled" if coupled else "independent",
        "step": "compiled" if compiled else "eager",
    }


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--model-seeds",
        type=int,
        default=8,
        help="seeds per prompt for the step counts the modelled columns price (no timing)",
    )
    ap.add_argument("--out", help="write <out>.md and <out>.json")
    args = ap.parse_args(argv)
    adapter = load_model("demo")
    costs = {f"{d}/{m}": roofline(m, d) for d, m in MODELLED}
    # auto rows: this CPU's measured cost and the profile, measured (or read from the cache) before
    # any timing
    cpu = {row: calibration(adapter, settings(adapter, row, 0)) for row in ROWS if row.auto}
    for row in ROWS:  # one-time costs (compiling the step for each shape) before anything is timed
        warm_up(adapter, settings(adapter, row, 0), cpu[row][1].plans if row in cpu else ())
    runs = [(p, s) for p in PROMPTS for s in range(args.seeds)]
    model_runs = [(p, s) for p in PROMPTS for s in range(args.model_seeds)]

    def decodes(row: Row) -> list:
        cost, profile = cpu.get(row, (None, None))
        return [
            decode(adapter, p, settings(adapter, row, s), cost=cost, profile=profile).stats
            for p, s in runs
        ]

    # every row in every repeat: drift hits them alike (the warm-up is above)
    timed = interleaved(
        {row: functools.partial(decodes, row) for row in ROWS}, args.repeats, warmup=0
    )
    stats = {row: t.result for row, t in timed.items()}
    ar_seconds = min(timed[row].median for row in ROWS if row.method == "ar")
    out, priced_rows = [], {}
    for row in ROWS:
        eager = row._replace(compiled=False)  # compiling changes no step: priced as its eager twin
        if eager not in priced_rows:
            modelled, steps = {}, None
            for key, cost in costs.items():
                # a fixed plan takes the same steps on any device; auto chooses by cost
                if steps is None or row.auto:
                    priced = [
                        decode(adapter, p, settings(adapter, eager, s), cost=cost).stats
                        for p, s in model_runs
                    ]
                    steps = steps or priced
                modelled[key] = round(
                    statistics.mean(st.estimated_speedup(cost) for st in priced), 3
                )
            priced_rows[eager] = modelled, steps
        modelled, steps = priced_rows[eager]
        sts = stats[row] if row.auto else steps  # auto's own steps: as chosen on this CPU
        out.append(
            label(row)
            | {
                "step_compression": round(statistics.mean(st.step_compression for st in sts), 3),
                "tokens_per_row": round(statistics.mean(st.tokens_per_forward for st in sts), 1),
                "cpu_seconds": round(timed[row].median, 3),
                "cpu_speedup": round(ar_seconds / timed[row].median, 3),
                "modeled": modelled,
            }
        )
        print(out[-1], flush=True)
    if args.out:
        write(out, args, cpu)
    return out


def write(rows, args, cpu):
    with open(args.out + ".json", "w") as f:
        json.dump(
            {
                "rows": rows,
                "prompts": PROMPTS,
                "seeds": args.seeds,
                "model_seeds": args.model_seeds,
                "repeats": args.repeats,
                "threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "cpu_cost": {str(label(r)): c.to_json() for r, (c, _) in cpu.items()},
            },
            f,
            indent=1,
        )
    keys = list(rows[0]["modeled"])
    command = (
        f"python -m benchmarks.latency --seeds {args.seeds} --repeats {args.repeats} "
        f"--model-seeds {args.model_seeds} --out {shown(args.out)}"
    )
    lines = [
        f"`{command}` (demo model; {len(PROMPTS)} prompts x {args.seeds} "
        f"seeds; CPU wall-clock: median of {args.repeats} repeats, rows interleaved after a warm-up each, "
        "speed-up over the faster AR row, "
        f"{torch.get_num_threads()} threads; modelled columns: the demo's steps over {args.model_seeds} seeds "
        "per prompt priced by sjdvp_core/datasheet.py's roofline for that model on that device; step compression "
        "and scored per pass: fixed rows over those seeds, auto rows as auto chose on this CPU)",
        "",
        "| method | window | tree | coupling | step | step compression | scored / pass / row | CPU s | "
        "CPU speed-up | " + " | ".join(keys) + " |",
        "|" + "---|" * (9 + len(keys)),
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['window']} | {r['tree']} | {r['coupling']} | {r['step']} | "
            f"{r['step_compression']:.2f}x | {r['tokens_per_row']:.1f} | {r['cpu_seconds']:.2f} | "
            f"{r['cpu_speedup']:.2f}x | "
            + " | ".join(f"{r['modeled'][k]:.2f}x" for k in keys)
            + " |"
        )
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
