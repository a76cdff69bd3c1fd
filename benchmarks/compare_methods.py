"""Side-by-side comparison of AR, SJD, SJD-VP, LANTERN(-VP) and GSD(-VP) in one run.

Step compression = AR forward passes / method forward passes on the same conditions and seeds (the
primary figure); mean accepted tokens per pass, acceptance rate of verified drafts and wall time
beside it. Wall time on a CPU does not follow step compression (a window of W tokens is not free
here); on a GPU it does.

    python -m benchmarks.compare_methods --model toy --windows 16 32 64
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from sjdvp_core import decode
from sjdvp_core.settings import METHODS, method_settings



def load_model(name: str, prompts: int):
    """-> (adapter, conditions, sampling defaults, judge or None)."""
    if name == "toy":
        from sjdvp_core.models.toy import ToyGridAdapter
        toy = ToyGridAdapter(height=16, width=16, levels=8, sharpness=12.0)
        return toy, [0, 1, 2, 3][:prompts], toy.default_sampling, None
    if name == "demo":
        from sjdvp_core.demo import load_demo, load_judge, scenes
        step = max(1, len(scenes.PROMPTS) // prompts)
        demo = load_demo()
        return demo, scenes.PROMPTS[::step][:prompts], demo.default_sampling, load_judge()
    raise ValueError(f"unknown model {name!r}; choose one of: toy, demo")


def prompt_match(adapter, judge, results) -> float | None:
    """Share of images the judge finds matching their prompt (demo model only)."""
    if judge is None:
        return None
    from sjdvp_core.demo.judge import prompt_match as match
    hits = []
    for cond, res in results:
        images = adapter.decode_image(res.codes).permute(0, 3, 1, 2) * 2 - 1
        hits.append(bool(match(judge, images, torch.tensor([adapter.class_id(cond)]))[0]))
    return sum(hits) / len(hits)


def run_method(adapter, conditions, method, window, sampling, seeds):
    """-> per run (cond, result, seconds)."""
    runs = []
    for cond in conditions:
        for seed in seeds:
            s = method_settings(method, window, sampling, seed)
            t = time.perf_counter()
            res = decode(adapter, cond, s)
            runs.append((cond, res, time.perf_counter() - t))
    return runs


def summarise(name, window, runs, ar=None, quality=None) -> dict:
    stats = [r[1].stats for r in runs]
    nfe = statistics.mean(st.forward_passes for st in stats)
    wall = statistics.median(r[2] for r in runs)
    mom = [st.momentum() for st in stats]
    return dict(method=name, window=window, nfe=nfe, step_compression=(ar or {"nfe": nfe})["nfe"] / nfe,
                mean_accepted=statistics.mean(st.mean_accepted for st in stats),
                acceptance=statistics.mean(st.acceptance_rate for st in stats), wall_s=wall,
                latency_speedup=(ar or {"wall_s": wall})["wall_s"] / wall,
                entropy=statistics.mean(st.mean_entropy for st in stats), prompt_match=quality,
                accept_if_rose=statistics.fmean(m["accept_if_rose"] for m in mom),
                accept_if_not=statistics.fmean(m["accept_if_not"] for m in mom))


def main(model: str = "toy", windows=(16, 32, 64), seeds: int = 3, prompts: int = 4,
         methods=tuple(METHODS), json_out: str | None = None):
    torch.set_num_threads(1)
    adapter, conditions, sampling, judge = load_model(model, prompts)
    seed_list = list(range(seeds))
    ar_runs = run_method(adapter, conditions, "ar", 1, sampling, seed_list)
    ar = summarise("ar", 1, ar_runs, quality=prompt_match(adapter, judge, [r[:2] for r in ar_runs]))
    results = [ar]
    for W in windows:
        for name in methods:
            if METHODS[name] is None:
                continue
            runs = run_method(adapter, conditions, name, W, sampling, seed_list)
            results.append(summarise(name, W, runs, ar, prompt_match(adapter, judge, [r[:2] for r in runs])))
    print(f"model={model} prompts={len(conditions)} seeds={seeds} sampling={sampling} "
          "(same prompts and seeds for every method)\n")
    print("| method | W | NFE | step compression | mean accepted | acceptance | wall s (median) | latency speed-up"
          " | prompt match | accept if rose / not |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        match = "-" if r["prompt_match"] is None else f"{r['prompt_match']:.2f}"
        print(f"| {r['method']} | {r['window']} | {r['nfe']:.1f} | {r['step_compression']:.2f}x | "
              f"{r['mean_accepted']:.2f} | {r['acceptance']:.3f} | {r['wall_s']:.3f} | {r['latency_speedup']:.2f}x | "
              f"{match} | {r['accept_if_rose']:.2f} / {r['accept_if_not']:.2f} |")
    print(f"\nmean next-token entropy under these settings (AR): {ar['entropy']:.3f} nats")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="toy", choices=["toy", "demo"], help="model to benchmark")
    ap.add_argument("--prompts", type=int, default=4, help="conditions (spread over the demo's prompt list)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), help="methods to compare")
    ap.add_argument("--windows", type=int, nargs="+", default=[16, 32, 64], help="Jacobi window sizes")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per condition")
    ap.add_argument("--json", dest="json_out", help="also write the results as JSON here")
    main(**vars(ap.parse_args()))
