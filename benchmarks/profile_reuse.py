"""Does an acceptance profile measured at one sampling setting serve another? The automatic window
chooses by a profile (committed tokens per pass of each candidate plan,
calibration.acceptance_profile), measured once on the model's example image. For each other sampling
setting (CFG scale, temperature, top-k) this decodes the benchmark's prompts with auto choosing by
that setting's own profile and by the default sampling's, and prices both runs' steps on each cost
(this CPU's measured one, and the roofline of Lumina-mGPT 7B on an H200 and an RTX 4090): the mean
modelled speed-up over AR, and the loss from using the default's profile.

    python -m benchmarks.profile_reuse --out benchmarks/results/profile_reuse

Steps, not wall clock: every figure is deterministic given the profiles and the seeds (the CPU's
cost is measured once, or read from the calibration cache; SJDVP_CACHE points that elsewhere: the
recorded run had SJDVP_CACHE=.cache/profile-reuse, a fresh folder, so it measured this CPU's cost
anew)."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace

from sjdvp_core.datasheet import roofline
from sjdvp_core.engine.auto import contenders
from sjdvp_core.engine.calibration import auto_plans, measure_profile, pass_cost
from sjdvp_core.engine.decode import decode
from sjdvp_core.engine.settings import method_settings
from sjdvp_core.models.loading import load_model

from . import shown
from .latency import PROMPTS

OTHERS = {
    "CFG 1.5": {"cfg_scale": 1.5},
    "CFG 5": {"cfg_scale": 5.0},
    "temperature 0.8": {"temperature": 0.8},
    "top-k 64": {"top_k": 64},
}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--seeds", type=int, default=4, help="seeds per prompt")
    ap.add_argument("--out", help="write <out>.md and <out>.json")
    args = ap.parse_args(argv)
    adapter = load_model("demo")
    default = adapter.default_sampling

    def settings(sampling, seed=0, trees=False):
        return method_settings("sjd-vp", 128, sampling, seed, auto=True, auto_tree=trees)

    costs = {
        "this CPU (measured)": pass_cost(adapter, settings(default)),
        "H200 / Lumina-mGPT 7B": roofline("Lumina-mGPT 7B", "H200"),
        "RTX 4090 / Lumina-mGPT 7B": roofline("Lumina-mGPT 7B", "RTX 4090"),
    }
    rows = []
    for cost_name, cost in costs.items():
        # on the CPU no tree is worth its nodes (auto weighs none there), so the chain alone is run
        for trees in (False,) if cost_name.startswith("this CPU") else (False, True):
            plans = auto_plans(adapter, settings(default, trees=trees), cost)
            profiles = {"default": measure_profile(adapter, settings(default, trees=trees), plans)}
            for name, change in OTHERS.items():
                sampling = replace(default, **change)
                own = measure_profile(adapter, settings(sampling, trees=trees), plans)
                speedups = {}
                for which, profile in (("own", own), ("default", profiles["default"])):
                    chosen = contenders(profile, cost)
                    speedups[which] = statistics.mean(
                        decode(
                            adapter,
                            prompt,
                            settings(sampling, seed, trees),
                            cost=cost,
                            profile=chosen,
                        ).stats.estimated_speedup(cost)
                        for prompt in PROMPTS
                        for seed in range(args.seeds)
                    )
                rows.append(
                    {
                        "cost": cost_name,
                        "trees": trees,
                        "sampling": name,
                        "own_profile": round(speedups["own"], 3),
                        "default_profile": round(speedups["default"], 3),
                        "loss": round(1 - speedups["default"] / speedups["own"], 4),
                    }
                )
                print(rows[-1], flush=True)
    if args.out:
        write(rows, args)
    return rows


def write(rows: list[dict], args) -> None:
    with open(args.out + ".json", "w") as f:
        json.dump(rows, f, indent=1)
    lines = [
        f"`python -m benchmarks.profile_reuse --out {shown(args.out)}` (demo model, "
        f"coupled SJD-VP, auto window up to 128; {len(PROMPTS)} prompts x {args.seeds} "
        "seeds; modelled speed-up over AR: the decode's steps priced by the cost; "
        "loss: 1 - default's / own)",
        "",
        "| cost | trees | sampling | own profile | default's profile | loss |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['cost']} | {'auto' if r['trees'] else 'chain'} | {r['sampling']} | {r['own_profile']:.3f}x | "
        f"{r['default_profile']:.3f}x | {100 * r['loss']:+.1f}% |"
        for r in rows
    ]
    with open(args.out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
