"""The sweep VP's defaults come from: strength (lambda, and "auto"), growth steps N, history decay beta
and the candidate count k_vp, one at a time around the defaults, on the same conditions and seeds,
with independent and coupled drafts.

    python -m benchmarks.sweep_vp --out benchmarks/results/vp_sweep
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

import torch

from sjdvp_core.engine.settings import DecodeSettings, DrafterSettings, VPSettings, WindowSettings

from .compare_methods import load_model, run_one, write_table

BASE = VPSettings()
GRID = (
    [dict(strength=v) for v in (2.0, 1.0, 0.5, 0.0, -0.35, -0.7, -1.0, "auto")]
    + [dict(strength=1.0, growth_steps=n) for n in (1, 3)]
    + [dict(strength=1.0, top_k=k) for k in (10, 200)]
    + [dict(strength=s, beta=b) for s in (-0.7, "auto") for b in (0.3, 0.8)]
    + [dict(strength="auto", top_k=k) for k in (10, 200)]
)


def main(model="demo", window=32, prompts=6, seeds=2, out=None, threads=1):
    torch.set_num_threads(threads)
    adapter, conditions, sampling, judge = load_model(model, prompts)
    lines = [
        f"model={model} W={window} conditions={len(conditions)} seeds={seeds} sampling={sampling}; "
        f"one knob changed at a time from {BASE}",
        "",
        "| coupled | VP settings changed | step compression vs SJD | NFE | auto picked (runs) |",
        "|---|---|---|---|---|",
    ]
    for coupled in (False, True):

        def nfe_of(vp, coupled=coupled):
            recs = [
                run_one(
                    adapter,
                    judge,
                    c,
                    DecodeSettings(
                        window=WindowSettings(window),
                        drafter=DrafterSettings(vp=vp, coupled=coupled),
                        sampling=sampling,
                        seed=seed,
                    ),
                    1,
                )
                for c in conditions
                for seed in range(seeds)
            ]
            picks = [r["vp_auto"]["vp_auto_strength"] for r in recs if r["vp_auto"]]
            return statistics.mean(r["nfe"] for r in recs), picks

        sjd, _ = nfe_of(None)
        lines.append(f"| {'yes' if coupled else 'no'} | none (plain SJD) | 1.000 | {sjd:.1f} | |")
        for change in GRID:
            nfe, picks = nfe_of(replace(BASE, **change))
            shown = ", ".join(f"{k}={v}" for k, v in change.items())
            picked = (
                ", ".join(f"{s:+g}: {picks.count(s)}" for s in sorted(set(picks))) if picks else ""
            )
            lines.append(
                f"| {'yes' if coupled else 'no'} | {shown} | {sjd / nfe:.3f} | {nfe:.1f} | {picked} |"
            )
            print(lines[-1], flush=True)
    write_table("\n".join(lines) + "\n", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", default="demo", choices=["toy", "toy-trend", "demo"])
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    main(**vars(ap.parse_args()))
