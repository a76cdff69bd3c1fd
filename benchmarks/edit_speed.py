"""Edits against text to image on the built-in demo: passes, step compression and tokens per pass.

An edit here completes a picture (the reference's upper half given, the lower half drawn;
docs/editing.md, "Completing a picture"), with a scene of the prompt's own class as the reference,
so the drawn half continues a picture the model could have drawn. Text to image draws all 256
tokens, an edit 128. Each mode runs AR, SJD and SJD-VP at one fixed window on the same prompts and
seeds, in one process; step compression is AR's passes over the method's. The tiny random models
of the tests are left out: their acceptance says nothing about a trained model's.

    python -m benchmarks.edit_speed --out benchmarks/results/edit_speed
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sjdvp_core import decode
from sjdvp_core.demo import load_demo, scenes
from sjdvp_core.engine.adapter import Edit
from sjdvp_core.engine.settings import method_settings

METHODS = ("ar", "sjd", "sjd-vp")


def conditions(prompts: int, mode: str) -> list:
    """`prompts` scene prompts spread over the classes, as text or as completions of a scene of
    their class."""
    out, stride = [], max(len(scenes.PROMPTS) // prompts, 1)
    for i, prompt in enumerate(scenes.PROMPTS[::stride][:prompts]):
        if mode == "text":
            out.append(prompt)
            continue
        scene = scenes.render(scenes.prompt_to_class(prompt), torch.Generator().manual_seed(i))
        out.append(Edit(prompt, (scene.permute(1, 2, 0),)))
    return out


def run(prompts: int, seeds: int, window: int) -> list[dict]:
    adapter = load_demo()
    rows = []
    for mode in ("text", "edit"):
        for method in METHODS:
            passes, ar_passes, accepted, seconds = [], [], [], []
            for condition in conditions(prompts, mode):
                for seed in range(seeds):
                    settings = method_settings(
                        method, 1 if method == "ar" else window, adapter.default_sampling, seed=seed
                    )
                    t = time.perf_counter()
                    stats = decode(adapter, [condition], settings).stats
                    seconds.append(time.perf_counter() - t)
                    passes.append(stats.forward_passes)
                    ar_passes.append(stats.ar_passes)
                    accepted.append(stats.mean_accepted)
            rows.append(
                dict(
                    mode=mode,
                    method=method,
                    tokens=ar_passes[0],
                    passes=statistics.mean(passes),
                    step_compression=statistics.mean(a / p for a, p in zip(ar_passes, passes)),
                    tokens_per_pass=statistics.mean(accepted),
                    seconds=statistics.median(seconds),
                    runs=len(passes),
                )
            )
    return rows


def table(rows: list[dict], args) -> str:
    lines = [
        "# Edits against text to image on the built-in demo",
        "",
        f"`python -m benchmarks.edit_speed --prompts {args.prompts} --seeds {args.seeds} "
        f"--window {args.window}`: {args.prompts} prompts x {args.seeds} seeds a row, the demo's "
        "sampling (cfg 3, temperature 1), one fixed window, on this machine's CPU. An edit "
        "completes a scene of the prompt's class (its upper half given). Step compression: AR's "
        "passes over the method's, per run, averaged; seconds: the median run's wall time (a CPU "
        "does not price a wide pass as one, docs/speed.md).",
        "",
        "| mode | method | tokens drawn | passes | step compression | tokens per pass | seconds |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['mode']} | {r['method'].upper()} | {r['tokens']} | {r['passes']:.1f} | "
            f"{r['step_compression']:.2f}x | {r['tokens_per_pass']:.2f} | {r['seconds']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--out", default="benchmarks/results/edit_speed")
    args = parser.parse_args()
    rows = run(args.prompts, args.seeds, args.window)
    text = table(rows, args)
    print(text)
    with open(args.out + ".md", "w", encoding="utf-8") as f:
        f.write(text)
    with open(args.out + ".json", "w", encoding="utf-8") as f:
        json.dump(dict(args=vars(args), rows=rows, torch=torch.__version__), f, indent=1)


if __name__ == "__main__":
    main()
