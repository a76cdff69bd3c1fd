"""The engine's own cost per iteration, two versions side by side: this checkout's sjdvp_core and another
checkout's (e.g. a commit before a redesign, from `git worktree add`), on the demo model, the same
prompts and seeds, alternating run by run in one process so both see the same machine load.

    git worktree add /tmp/sjdvp-before <commit>
    python -m benchmarks.compare_engines --before /tmp/sjdvp-before --out benchmarks/results/engine_cost

Per method and window: forward passes, and milliseconds per iteration split into the model's forward
and the engine's own work (verification and drafting), each the median over runs.
"""
from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import os
import statistics
import sys

import torch

from sjdvp_core.timing import interleaved

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def engine(root: str, name: str):
    """The sjdvp_core package of a checkout, imported under another name so two can live in one process."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(root, "sjdvp_core", "__init__.py"),
                                                  submodule_search_locations=[os.path.join(root, "sjdvp_core")])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    where = "engine.settings" if os.path.isdir(os.path.join(root, "sjdvp_core", "engine")) else "settings"  # before #24
    return module, importlib.import_module(f"{name}.{where}"), importlib.import_module(f"{name}.demo")


def timed_decode(core, settings_mod, demo, adapter, prompt, method: str, window: int, coupled: bool, seed: int):
    sampling = demo.DEMO_SAMPLING
    settings = settings_mod.method_settings(method, window, sampling, seed, coupled=coupled)
    kwargs = {"timing": True} if "timing" in core.decode.__code__.co_varnames else {}   # older engines always timed
    st = core.decode(adapter, prompt, settings, **kwargs).stats
    iterations = max(1, st.forward_passes - 1)
    return dict(nfe=st.forward_passes, forward_ms=1000 * st.time_forward / iterations,
                engine_ms=1000 * (st.time_verify + st.time_draft) / iterations,
                draft_ms=1000 * st.time_draft / iterations)


def main(before: str, methods, windows, coupling, prompts: int, seeds: int, threads: int, out: str | None):
    torch.set_num_threads(threads)
    engines = {"before": engine(before, "engine_before"), "after": engine(REPO, "engine_after")}
    adapters = {k: demo.load_demo() for k, (_, _, demo) in engines.items()}
    scene_prompts = engines["after"][2].scenes.PROMPTS
    chosen = scene_prompts[::max(1, len(scene_prompts) // prompts)][:prompts]
    rows = []
    for method in methods:
        for window in windows:
            for coupled in coupling:
                runs = {k: [] for k in engines}
                for prompt in chosen:
                    for seed in range(seeds):   # the engines take turns: the same load for both
                        timed = interleaved({k: functools.partial(timed_decode, core, settings_mod, demo, adapters[k],
                                                                  prompt, method, window, coupled, seed)
                                             for k, (core, settings_mod, demo) in engines.items()}, 1, warmup=0)
                        for k, t in timed.items():
                            runs[k].append(t.result)
                for k, rs in runs.items():
                    rows.append(dict(engine=k, method=method, window=window, coupled=coupled,
                                     **{f: round(statistics.median(r[f] for r in rs), 3) for f in rs[0]}))
    table = ["| engine | method | W | coupled | NFE (median) | forward ms / it | engine ms / it | of which draft |",
             "|---|---|---|---|---|---|---|---|"]
    table += [f"| {r['engine']} | {r['method']} | {r['window']} | {'yes' if r['coupled'] else 'no'} | {r['nfe']} | "
              f"{r['forward_ms']:.2f} | {r['engine_ms']:.2f} | {r['draft_ms']:.2f} |" for r in rows]
    print("\n".join(table))
    if out:
        with open(out + ".md", "w") as f:
            f.write(f"`python -m benchmarks.compare_engines --before {before}` ({prompts} prompts x {seeds} seeds, "
                    f"{threads} thread(s), medians)\n\n" + "\n".join(table) + "\n")
        with open(out + ".json", "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="another checkout of this repository (the engine to compare)")
    ap.add_argument("--methods", nargs="+", default=["sjd", "sjd-vp"])
    ap.add_argument("--windows", type=int, nargs="+", default=[32])
    ap.add_argument("--coupling", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", help="write <out>.md and <out>.json")
    a = ap.parse_args()
    main(a.before, a.methods, a.windows, [c == "on" for c in a.coupling], a.prompts, a.seeds, a.threads, a.out)
