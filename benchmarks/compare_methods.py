"""Side-by-side comparison of AR, SJD, SJD-VP, LANTERN(-VP) and GSD(-VP), with and without coupled
drafting, on the same conditions and seeds, in one run.

Step compression = AR forward passes / method forward passes (the primary figure); mean accepted
tokens per pass, acceptance per window slot, latency (median over runs and repeats) and quality
beside it: the demo judge's prompt match, and every method's distance from AR's output distribution
(total variation between codebook-usage histograms; exact SJD's distance is the sampling-noise
floor). Wall time on a CPU does not follow step compression (a window of W tokens is not free
there); on a GPU it does.

    python -m benchmarks.compare_methods --model demo --out benchmarks/results/demo
    python -m benchmarks.compare_methods --model models/sjdvp/emu3-gen --device cuda --prompts 24
    torchrun --nproc_per_node 2 -m benchmarks.compare_methods ...   # runs sharded across processes

Draft trees: --trees 1x1 4x1 4x2 (width x depth; a trailing "n" drops the spatial guesses, "/b" caps
each alternative's branch at b drafts). "scored/pass" is the tokens each forward pass scored; "extra
MiB" the memory a tree adds per image (its cache entries past the sequence and its per-candidate
distributions).

Writes <out>.md (table), <out>.json (everything) and <out>_*.png (plots, if matplotlib is
installed). LANTERN's neighbour count is scaled to the codebook (its paper's 1000 of 16384 codes ->
K * 1000 / 16384)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
from dataclasses import replace

import torch

from sjdvp_core import decode
from sjdvp_core.engine.budget import decode_bytes
from sjdvp_core.engine.settings import (
    DEFAULT_WINDOW,
    DRAFT_INITS,
    METHODS,
    PASS_MODES,
    TreeSettings,
    method_settings,
)
from sjdvp_core.timing import interleaved

from . import shards, shown

MIN_VERIFIED = 20  # window slots with fewer verified drafts get no acceptance figure (too noisy)


PROMPTS_T2I = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prompts_t2i.txt")


def read_prompts(path: str) -> list[str]:
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


def load_model(name: str, prompts: int, prompts_file: str = PROMPTS_T2I, device: str = "cpu"):
    """-> (adapter, conditions, sampling defaults, judge or None). name: toy, toy-trend, demo or
    a folder."""
    if name == "toy":
        from benchmarks.toy import ToyGridAdapter

        toy = ToyGridAdapter(height=16, width=16, levels=8, sharpness=12.0)
        return toy, [0, 1, 2, 3][:prompts], toy.default_sampling, None
    if name == "toy-trend":
        from benchmarks.toy import ToyTrendAdapter

        toy = ToyTrendAdapter(height=16, width=16, levels=8, sharpness=80.0, noise=0.3)
        return toy, [0, 1, 2, 3][:prompts], toy.default_sampling, None
    if name == "demo":
        from sjdvp_core.demo import load_demo, load_judge, scenes

        step = max(1, len(scenes.PROMPTS) // prompts)
        demo = load_demo(device)
        return demo, scenes.PROMPTS[::step][:prompts], demo.default_sampling, load_judge()
    from sjdvp_core.models.loading import load_model as load_folder

    adapter = load_folder(name, device=device)
    return adapter, read_prompts(prompts_file)[:prompts], adapter.default_sampling, None


INIT = DEFAULT_WINDOW.init  # how a new Jacobi Window starts fresh drafts (--inits' default)
# --coupling values
DRAFTING = {
    "off": "independent",
    "on": "coupled",
    "continued": "coupled + continued",
}


def parse_tree(spec: str) -> TreeSettings:
    """ "4x2" -> width 4, depth 2, with guesses; "4x2n" without; "4x2/3" branches of at most 3
    drafts."""
    spec, branch = (spec.split("/") + ["0"])[:2]
    guesses = not spec.endswith("n")
    width, depth = spec.rstrip("n").split("x")
    return TreeSettings(width=int(width), depth=int(depth), guesses=guesses, branch=int(branch))


def tree_name(tree: TreeSettings) -> str:
    if not tree.on:
        return "chain"
    return (
        f"{tree.width}x{tree.depth}"
        + ("" if tree.guesses else "n")
        + (f"/{tree.branch}" if tree.branch else "")
    )


def settings_for(
    adapter,
    method: str,
    window: int,
    drafting: str,
    tree: str,
    init: str,
    sampling,
    seed: int,
    batch_size: int = 1,
    passes: str = "auto",
):
    """drafting: off (independent draws), on (coupled), continued (coupled, and re-drafts by maximal
    coupling); tree: a --trees spec; init: how fresh drafts start (settings.DRAFT_INITS); passes:
    the model's pass (settings.PASS_MODES)."""
    s = method_settings(
        method,
        window,
        sampling,
        seed,
        batch_size,
        coupled=drafting != "off",
        tree=parse_tree(tree),
        passes=passes,
    )
    s = replace(s, window=replace(s.window, init=init))
    d = replace(s.drafter, continuation=drafting == "continued")
    if d.verifier == "lantern":
        d = replace(d, lantern_k=max(1, round(adapter.codebook().shape[0] * 1000 / 16384)))
    return replace(s, drafter=d)


def extra_bytes(adapter, settings) -> int:
    """Memory a draft tree adds for one image: cache entries past the sequence, and the engine's
    state."""
    one = replace(settings, batch_size=1)
    chain = replace(one, window=replace(one.window, tree=TreeSettings()))
    return decode_bytes(adapter, one) - decode_bytes(adapter, chain)


def run_one(adapter, judge, cond, settings, repeats: int) -> dict:
    """One decode (timed `repeats` times; the tokens are the same each time) -> a plain record."""
    timed = interleaved(
        {"decode": lambda: decode(adapter, cond, settings, timing=True)}, repeats, warmup=0
    )["decode"]
    res = timed.result
    st = res.stats
    match = None
    if judge is not None:
        from sjdvp_core.demo.judge import prompt_match

        images = adapter.decode_image(res.codes).permute(0, 3, 1, 2) * 2 - 1
        match = bool(prompt_match(judge, images, torch.tensor([adapter.class_id(cond)]))[0])
    per_iter = torch.stack(st.committed_per_iter)[:, 0].tolist() if st.committed_per_iter else []
    return dict(
        nfe=int(st.row_forward_passes[0]),
        mean_accepted=st.mean_accepted,
        tree_tried=st.tree_tried,
        tree_accepted=st.tree_guess_accepted + st.tree_draw_accepted,
        tree_guess_accepted=st.tree_guess_accepted,
        acceptance=st.acceptance_rate,
        seconds=timed.median,
        match=match,
        entropy=st.mean_entropy,
        momentum=st.momentum(),
        vp_auto=st.vp_auto,
        tokens_per_forward=st.tokens_per_forward,
        time_forward=st.time_forward,
        time_draft=st.time_draft,
        time_verify=st.time_verify,
        slot_verified=st.slot_verified.tolist(),
        slot_accepted=st.slot_accepted.tolist(),
        committed_per_iter=per_iter,
        codes=res.codes.flatten().tolist(),
    )


def code_histogram_tv(a: list[list[int]], b: list[list[int]], size: int) -> float:
    ha = torch.bincount(torch.tensor(a).flatten(), minlength=size).float()
    hb = torch.bincount(torch.tensor(b).flatten(), minlength=size).float()
    return 0.5 * float((ha / ha.sum() - hb / hb.sum()).abs().sum())


def summarise(
    key: tuple, runs: list[dict], ar: dict | None, codebook_size: int, extra: int = 0
) -> dict:
    method, window, drafting, tree, init = key
    nfe = statistics.mean(r["nfe"] for r in runs)
    wall = statistics.median(r["seconds"] for r in runs)
    mom = [r["momentum"] for r in runs]
    verified = torch.tensor([r["slot_verified"] for r in runs]).sum(0)
    accepted = torch.tensor([r["slot_accepted"] for r in runs]).sum(0)
    iters = max(len(r["committed_per_iter"]) for r in runs)
    # finished runs stay at L
    done = [list(itertools.accumulate(r["committed_per_iter"])) for r in runs]
    cumulative = [statistics.mean(d[min(i, len(d) - 1)] for d in done) for i in range(iters)]
    t_iter = statistics.mean(
        (r["time_forward"] + r["time_draft"] + r["time_verify"]) / max(1, r["nfe"] - 1)
        for r in runs
    )
    matches = [r["match"] for r in runs if r["match"] is not None]
    autos = [r["vp_auto"]["vp_auto_strength"] for r in runs if r["vp_auto"]]
    return dict(
        method=method,
        window=window,
        coupled=drafting != "off",
        drafting=drafting,
        init=init,
        runs=len(runs),
        nfe=nfe,
        tree=tree_name(parse_tree(tree)),
        tree_width=parse_tree(tree).width,
        tree_depth=parse_tree(tree).depth,
        tree_guesses=parse_tree(tree).guesses,
        extra_mib=extra / 2**20,
        tree_accept_rate=(
            sum(r["tree_accepted"] for r in runs) / max(1, sum(r["tree_tried"] for r in runs))
        ),
        tree_guess_share=(
            sum(r["tree_guess_accepted"] for r in runs)
            / max(1, sum(r["tree_accepted"] for r in runs))
        ),
        step_compression=(ar["nfe"] if ar else nfe) / nfe,
        mean_accepted=statistics.mean(r["mean_accepted"] for r in runs),
        tokens_per_forward=statistics.mean(r["tokens_per_forward"] for r in runs),
        acceptance=statistics.mean(r["acceptance"] for r in runs),
        wall_s=wall,
        latency_speedup=(ar["wall_s"] if ar else wall) / wall,
        draft_share=statistics.mean(
            r["time_draft"] / max(1e-9, r["time_forward"] + r["time_draft"] + r["time_verify"])
            for r in runs
        ),
        iteration_ms=1000 * t_iter,
        prompt_match=statistics.mean(matches) if matches else None,
        tv_from_ar=code_histogram_tv([r["codes"] for r in runs], ar["codes"], codebook_size)
        if ar
        else 0.0,
        accept_if_rose=statistics.fmean(m["accept_if_rose"] for m in mom),
        accept_if_not=statistics.fmean(m["accept_if_not"] for m in mom),
        vp_auto_strengths=autos,
        slot_acceptance=[
            a if n >= MIN_VERIFIED else None
            for a, n in zip((accepted / verified.clamp_min(1)).tolist(), verified.tolist())
        ],
        committed_cumulative=cumulative,
        codes=[r["codes"] for r in runs],
        entropy=statistics.mean(r["entropy"] for r in runs),
    )


def markdown(results: list[dict], header: str) -> str:
    lines = [
        header,
        "",
        "| method | W | drafts | init | tree | NFE | step compression | tokens/pass | scored/pass | extra MiB "
        "| acceptance | tree rescues | latency s (median) | latency speed-up | ms / iteration | draft share "
        "| prompt match | TV from AR | accept if rose / not |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        match = "-" if r["prompt_match"] is None else f"{r['prompt_match']:.2f}"
        drafts, init = (DRAFTING[r["drafting"]], r["init"]) if r["method"] != "ar" else ("-", "-")
        rescues = "-" if r["tree"] == "chain" else format(r["tree_accept_rate"], ".2f")
        lines.append(
            f"| {r['method']} | {r['window']} | {drafts} | {init} | {r['tree']} | "
            f"{r['nfe']:.1f} | {r['step_compression']:.2f}x | {r['mean_accepted']:.2f} | "
            f"{r['tokens_per_forward']:.1f} | {r['extra_mib']:.1f} | {r['acceptance']:.3f} | {rescues} | "
            f"{r['wall_s']:.3f} | {r['latency_speedup']:.2f}x | {r['iteration_ms']:.2f} | "
            f"{100 * r['draft_share']:.0f}% | {match} | {r['tv_from_ar']:.3f} | "
            f"{r['accept_if_rose']:.2f} / {r['accept_if_not']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def write_table(text: str, out: str | None) -> None:
    """Print a markdown table and, with out, write it to <out>.md."""
    print(text)
    if out:
        os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
        with open(out + ".md", "w") as f:
            f.write(text)


def main(
    model: str = "demo",
    windows=(16, 32, 64),
    seeds: int = 2,
    prompts: int = 6,
    methods=tuple(METHODS),
    coupling=("off", "on"),
    repeats: int = 1,
    out: str | None = None,
    threads: int = 1,
    prompts_file: str = PROMPTS_T2I,
    device: str = "cpu",
    trees=("1x1",),
    inits=(INIT,),
    passes: str = "auto",
) -> list[dict]:
    torch.set_num_threads(threads)
    rank, world, device = shards.init(device)
    adapter, conditions, sampling, judge = load_model(model, prompts, prompts_file, device)
    codebook_size = adapter.codebook().shape[0]
    configs = [("ar", 1, "off", "1x1", inits[0])] + [
        (m, W, c, t, i)
        for W in windows
        for c in coupling
        for t in trees
        for i in inits
        for m in methods
        if METHODS[m] is not None
    ]
    jobs = [
        (ci, cond, seed)
        for ci in range(len(configs))
        for cond in conditions
        for seed in range(seeds)
    ]
    mine = [
        (
            ci,
            cond,
            seed,
            run_one(
                adapter,
                judge,
                cond,
                settings_for(adapter, *configs[ci], sampling, seed, passes=passes),
                repeats,
            ),
        )
        for ci, cond, seed in shards.take(jobs, rank, world)
    ]
    records = shards.gather(mine, rank, world)
    if rank != 0:
        return []
    by_config = {ci: [] for ci in range(len(configs))}
    for ci, _cond, _seed, rec in sorted(records, key=lambda r: (r[0], str(r[1]), r[2])):
        by_config[ci].append(rec)
    ar = summarise(configs[0], by_config[0], None, codebook_size)
    results = [ar] + [
        summarise(
            configs[ci],
            by_config[ci],
            ar,
            codebook_size,
            extra_bytes(adapter, settings_for(adapter, *configs[ci], sampling, 0, passes=passes)),
        )
        for ci in range(1, len(configs))
    ]
    named = shown(model) if os.path.isdir(model) else model  # a folder: no machine's path
    header = (
        f"model={named} conditions={len(conditions)} seeds={seeds} sampling={sampling} "
        f"repeats={repeats} passes={passes} "
        f"processes={world} (same conditions and seeds for every method); AR entropy {ar['entropy']:.3f} nats"
    )
    table = markdown(results, header)
    write_table(table, out)
    if out:
        with open(out + ".json", "w") as f:
            json.dump([{k: v for k, v in r.items() if k != "codes"} for r in results], f, indent=1)
        try:
            from .plots import plot_all
        except ImportError:  # matplotlib is optional
            print("matplotlib not installed: no plots")
        else:
            print("plots:", ", ".join(plot_all(results, out)))
    return results


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model",
        default="demo",
        help="toy (mean-reverting), toy-trend (drifting), demo, or a model folder "
        "(e.g. models/sjdvp/Emu3-Gen-hf)",
    )
    ap.add_argument(
        "--prompts-file",
        dest="prompts_file",
        default=PROMPTS_T2I,
        help="prompts for a model folder, one per line (default: benchmarks/prompts_t2i.txt; "
        "class names for a class-conditional model)",
    )
    ap.add_argument(
        "--device", default="cpu", help="cpu or cuda (each torchrun rank takes its own GPU)"
    )
    ap.add_argument(
        "--prompts", type=int, default=6, help="conditions (spread over the demo's prompt list)"
    )
    ap.add_argument(
        "--methods",
        nargs="+",
        default=list(METHODS),
        choices=list(METHODS),
        help="methods to compare",
    )
    ap.add_argument(
        "--windows", type=int, nargs="+", default=[16, 32, 64], help="Jacobi window sizes"
    )
    ap.add_argument(
        "--coupling",
        nargs="+",
        default=["off", "on"],
        choices=list(DRAFTING),
        help="run every method with independent (off), coupled (on) and/or coupled drafts whose "
        "re-drafts continue by maximal coupling (continued)",
    )
    ap.add_argument(
        "--trees",
        nargs="+",
        default=["1x1"],
        help="draft trees, width x depth (1x1 = the chain; 4x2n: no spatial guesses; 4x2/3: branches "
        "of at most 3 drafts)",
    )
    ap.add_argument(
        "--inits",
        nargs="+",
        default=[INIT],
        choices=list(DRAFT_INITS),
        help="how fresh drafts start: random image tokens, or a copy of the known cell to the left / above",
    )
    ap.add_argument("--seeds", type=int, default=2, help="seeds per condition")
    ap.add_argument(
        "--repeats", type=int, default=1, help="timed repeats of each decode (latency = median)"
    )
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument(
        "--passes",
        default="auto",
        choices=PASS_MODES,
        help="the model's pass: replayed as a CUDA graph (auto, captured) or not (engine/captured.py)",
    )
    ap.add_argument("--out", help="write <out>.md, <out>.json and <out>_*.png")
    main(**vars(ap.parse_args()))
