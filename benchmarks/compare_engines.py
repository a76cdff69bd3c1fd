"""The engine's own cost per iteration, two versions side by side: this checkout's sjdvp_core and
another checkout's (e.g. a commit before a redesign, from `git worktree add`), on the demo model,
the same prompts and seeds, alternating run by run in one process so both see the same machine load.

    git worktree add ../sjdvp-before <commit>
    python -m benchmarks.compare_engines --before ../sjdvp-before --out engine_cost

(benchmarks/results/engine_cost.json is one such run; its table is in engine_cost.md.)

Per method and window: forward passes, and milliseconds per iteration split into the model's forward
and the engine's own work (verification and drafting), each the median over runs. `--vocab K`:
instead of the demo, logits that cost nothing over K image tokens (gpu_check's FreeModel), so the
engine's own cost at a real model's vocabulary (Lumina-mGPT's 8192, Janus-Pro's 16384, Emu3's
32768), on 256-token images. `--compile`: the compiled step, whose verification and drafting are one
graph (its engine time is not split: "draft" reads 0)."""

from __future__ import annotations

import argparse
import functools
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys

import torch

from sjdvp_core.timing import interleaved

from . import REPO, shown


def named(checkout: str) -> str:
    """The other checkout as a results file names it: <worktree of its commit>, not its folder."""
    try:
        git = ["git", "-C", checkout, "rev-parse", "--short", "HEAD"]
        commit = subprocess.run(git, check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return shown(checkout)
    return f"<worktree of {commit}>"


def engine(root: str, name: str):
    """The sjdvp_core package of a checkout, imported under another name so two can live in one
    process."""
    spec = importlib.util.spec_from_file_location(
        name,
        os.path.join(root, "sjdvp_core", "__init__.py"),
        submodule_search_locations=[os.path.join(root, "sjdvp_core")],
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    # before #24
    where = (
        "engine.settings"
        if os.path.isdir(os.path.join(root, "sjdvp_core", "engine"))
        else "settings"
    )
    return (
        module,
        importlib.import_module(f"{name}.{where}"),
        importlib.import_module(f"{name}.demo"),
    )


def timed_decode(
    core,
    settings_mod,
    sampling,
    adapter,
    prompt,
    method: str,
    window: int,
    coupled: bool,
    seed: int,
    compile: bool = False,
):
    # (engines before the compiled step have no such setting)
    compiled = {"compile": True} if compile else {}
    settings = settings_mod.method_settings(
        method, window, sampling, seed, coupled=coupled, **compiled
    )
    # older engines always timed
    kwargs = {"timing": True} if "timing" in core.decode.__code__.co_varnames else {}
    st = core.decode(adapter, prompt, settings, **kwargs).stats
    iterations = max(1, st.forward_passes - 1)
    return dict(
        nfe=st.forward_passes,
        forward_ms=1000 * st.time_forward / iterations,
        engine_ms=1000
        * (st.time_verify + st.time_draft + getattr(st, "time_step", 0))
        / iterations,
        draft_ms=1000 * st.time_draft / iterations,
    )


def turns(decodes: dict, prompt, seed: int) -> dict:
    """One decode per engine, taking turns: the same load for both."""
    return interleaved(
        {k: functools.partial(run, prompt, seed=seed) for k, run in decodes.items()}, 1, warmup=0
    )


def main(
    before: str,
    methods,
    windows,
    coupling,
    prompts: int,
    seeds: int,
    threads: int,
    out: str | None,
    vocab: int | None = None,
    compile: bool = False,
):
    torch.set_num_threads(threads)
    engines = {"before": engine(before, "engine_before"), "after": engine(REPO, "engine_after")}
    if vocab is None:
        adapters = {k: demo.load_demo() for k, (_, _, demo) in engines.items()}
        sampling = {k: demo.DEMO_SAMPLING for k, (_, _, demo) in engines.items()}
        scene_prompts = engines["after"][2].scenes.PROMPTS
        chosen = scene_prompts[:: max(1, len(scene_prompts) // prompts)][:prompts]
    # one model for both: it only holds logits; each engine decodes it through its own interface
    else:
        from benchmarks.gpu_check import FreeModel

        free = FreeModel(vocab, 16, "cpu")
        adapters = dict.fromkeys(engines, free)
        sampling = {
            k: mod.SamplingSettings(**vars(free.default_sampling))
            for k, (_, mod, _) in engines.items()
        }
        chosen, prompts = [[None]], 1  # it has no prompts: the seeds alone vary
    rows = []
    for method in methods:
        for window in windows:
            for coupled in coupling:
                runs = {k: [] for k in engines}
                decodes = {
                    k: functools.partial(
                        timed_decode,
                        core,
                        mod,
                        sampling[k],
                        adapters[k],
                        method=method,
                        window=window,
                        coupled=coupled,
                        compile=compile,
                    )
                    for k, (core, mod, _) in engines.items()
                }
                if compile:  # each engine compiles its step for this setting first (not timed)
                    turns(decodes, chosen[0], 0)
                for prompt in chosen:
                    for seed in range(seeds):
                        timed = turns(decodes, prompt, seed)
                        for k, t in timed.items():
                            runs[k].append(t.result)
                for k, rs in runs.items():
                    rows.append(
                        dict(
                            engine=k,
                            method=method,
                            window=window,
                            coupled=coupled,
                            **{f: round(statistics.median(r[f] for r in rs), 3) for f in rs[0]},
                        )
                    )
    table = [
        "| engine | method | W | coupled | NFE (median) | forward ms / it | engine ms / it | of which draft |",
        "|---|---|---|---|---|---|---|---|",
    ]
    table += [
        f"| {r['engine']} | {r['method']} | {r['window']} | {'yes' if r['coupled'] else 'no'} | {r['nfe']} | "
        f"{r['forward_ms']:.2f} | {r['engine_ms']:.2f} | {r['draft_ms']:.2f} |"
        for r in rows
    ]
    print("\n".join(table))
    if out:
        with open(out + ".md", "w") as f:
            model = (
                "the demo"
                if vocab is None
                else f"logits that cost nothing over {vocab} image tokens (`--vocab`)"
            )
            model += ", the compiled step (`--compile`)" if compile else ""
            f.write(
                f"`python -m benchmarks.compare_engines --before {named(before)}` ({model}; "
                f"{prompts} prompts x {seeds} seeds, {threads} thread(s), medians)\n\n"
                + "\n".join(table)
                + "\n"
            )
        with open(out + ".json", "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--before",
        required=True,
        help="another checkout of this repository (the engine to compare)",
    )
    ap.add_argument("--methods", nargs="+", default=["sjd", "sjd-vp"])
    ap.add_argument("--windows", type=int, nargs="+", default=[32])
    ap.add_argument("--coupling", nargs="+", default=["off", "on"], choices=["off", "on"])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--vocab", type=int, help="time the engine alone at this image vocabulary (no model)"
    )
    ap.add_argument(
        "--compile", action="store_true", help="the compiled step (DecodeSettings.compile)"
    )
    ap.add_argument("--out", help="write <out>.md and <out>.json")
    a = ap.parse_args()
    main(
        a.before,
        a.methods,
        a.windows,
        [c == "on" for c in a.coupling],
        a.prompts,
        a.seeds,
        a.threads,
        a.out,
        a.vocab,
        a.compile,
    )
