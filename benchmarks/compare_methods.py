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

from sjdvp_core import DecodeSettings, DrafterSettings, SamplingSettings, VPSettings, WindowSettings, decode

METHODS = {
    "AR": None,
    "SJD": DrafterSettings(),
    "SJD-VP": DrafterSettings(vp=VPSettings()),
    "LANTERN": DrafterSettings(verifier="lantern"),
    "LANTERN-VP": DrafterSettings(verifier="lantern", vp=VPSettings()),
    "GSD": DrafterSettings(verifier="gsd"),
    "GSD-VP": DrafterSettings(verifier="gsd", vp=VPSettings()),
}


def load_model(name: str):
    """-> (adapter, conditions, sampling defaults)."""
    if name == "toy":
        from sjdvp_core.models.toy import ToyGridAdapter
        return ToyGridAdapter(height=16, width=16, levels=8, sharpness=12.0), [0, 1, 2, 3], \
            SamplingSettings(cfg_scale=2.0, top_k=20)
    raise ValueError(f"unknown model {name!r}; choose one of: toy")


def run_method(adapter, conditions, drafter, window, sampling, seeds):
    rows = []
    for cond in conditions:
        for seed in seeds:
            s = DecodeSettings(window=WindowSettings(1 if drafter is None else window),
                               drafter=drafter or DrafterSettings(), sampling=sampling, seed=seed)
            t = time.perf_counter()
            st = decode(adapter, cond, s).stats
            rows.append((st.forward_passes, st.mean_accepted, st.acceptance_rate, time.perf_counter() - t, st))
    return rows


def main(model: str = "toy", windows=(16, 32, 64), seeds: int = 3, json_out: str | None = None):
    torch.set_num_threads(1)
    adapter, conditions, sampling = load_model(model)
    seed_list = list(range(seeds))
    ar = run_method(adapter, conditions, None, 1, sampling, seed_list)
    ar_nfe = statistics.mean(r[0] for r in ar)
    ar_time = statistics.median(r[3] for r in ar)
    results = [dict(method="AR", window=1, nfe=ar_nfe, step_compression=1.0, mean_accepted=1.0,
                    acceptance=0.0, wall_s=ar_time, latency_speedup=1.0)]
    for W in windows:
        for name, drafter in METHODS.items():
            if drafter is None:
                continue
            rows = run_method(adapter, conditions, drafter, W, sampling, seed_list)
            nfe = statistics.mean(r[0] for r in rows)
            wall = statistics.median(r[3] for r in rows)
            mom = [r[4].momentum() for r in rows]
            results.append(dict(method=name, window=W, nfe=nfe, step_compression=ar_nfe / nfe,
                                mean_accepted=statistics.mean(r[1] for r in rows),
                                acceptance=statistics.mean(r[2] for r in rows), wall_s=wall,
                                latency_speedup=ar_time / wall,
                                accept_if_rose=statistics.mean(m["accept_if_rose"] for m in mom),
                                accept_if_not=statistics.mean(m["accept_if_not"] for m in mom)))
    print(f"model={model} conditions={len(conditions)} seeds={seeds} (same conditions and seeds for every method)\n")
    print("| method | W | NFE | step compression | mean accepted | acceptance | wall s (median) | latency speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['method']} | {r['window']} | {r['nfe']:.1f} | {r['step_compression']:.2f}x | "
              f"{r['mean_accepted']:.2f} | {r['acceptance']:.3f} | {r['wall_s']:.3f} | {r['latency_speedup']:.2f}x |")
    if json_out:
        with open(json_out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="toy", choices=["toy"], help="model to benchmark")
    ap.add_argument("--windows", type=int, nargs="+", default=[16, 32, 64], help="Jacobi window sizes")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per condition")
    ap.add_argument("--json", dest="json_out", help="also write the results as JSON here")
    main(**vars(ap.parse_args()))
