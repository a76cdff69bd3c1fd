"""Count the engine's own operations per Jacobi iteration: every aten op that reaches a kernel (a
TorchDispatchMode sees them after composite ops are decomposed, as a GPU would launch them), outside
the model's forward. On a GPU each is at least one kernel launch of several microseconds, so this
count, not the FLOPs, sets what the engine's step costs next to a forward pass.

    python -m benchmarks.engine_ops --compiled --out benchmarks/results/engine_ops
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from sjdvp_core.engine.decode import decode
from sjdvp_core.engine.settings import TreeSettings, method_settings
from sjdvp_core.models.loading import load_model

CASES = (  # name, method, window, tree
    ("chain W=32, coupled SJD", "sjd", 32, TreeSettings()),
    ("chain W=32, coupled SJD-VP", "sjd-vp", 32, TreeSettings()),
    ("tree 6x1 W=32, coupled SJD-VP", "sjd-vp", 32, TreeSettings(width=6)),
    ("chain W=4, coupled SJD-VP", "sjd-vp", 4, TreeSettings()),
    ("AR", "ar", 1, TreeSettings()),
)


class OpCounter(TorchDispatchMode):
    """Counts ops by name while `counting` is set."""

    def __init__(self):
        super().__init__()
        self.ops, self.counting = Counter(), True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.counting:
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@contextmanager
def model_uncounted(adapter, counter: OpCounter):
    """The adapter's forward passes, the prefill included, run uncounted (they are the model's ops,
    not the engine's)."""
    originals = {
        name: getattr(adapter, name)
        for name in ("start", "forward", "forward_tree", "adopt")
        if hasattr(adapter, name)
    }

    def quiet(fn):
        def run(*args, **kwargs):
            counter.counting = False
            try:
                return fn(*args, **kwargs)
            finally:
                counter.counting = True

        return run

    for name, fn in originals.items():
        setattr(adapter, name, quiet(fn))
    try:
        yield
    finally:
        for name in originals:
            delattr(adapter, name)


def count(adapter, settings, prompt: str) -> tuple[float, Counter, int]:
    """-> (engine ops per iteration, the ops by name, iterations) for one decode."""
    counter = OpCounter()
    with model_uncounted(adapter, counter), counter:
        result = decode(adapter, prompt, settings)
    iterations = result.stats.forward_passes - 1
    return sum(counter.ops.values()) / iterations, counter.ops, iterations


def compiled_kernels(adapter, settings, prompt: str) -> tuple[int, int]:
    """-> (graphs, kernels) torch.compile makes of the engine's step for one decode with these
    settings (the compiled step, DecodeSettings.compile; Inductor's generated kernels, counted
    with its cache off so every graph is generated here): on a GPU each kernel is one launch, and
    one graph is one CUDA graph to replay."""
    from torch._inductor import config, metrics

    torch._dynamo.reset()
    metrics.reset()
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    with config.patch(fx_graph_cache=False):
        decode(adapter, prompt, replace(settings, compile=True))
    return torch._dynamo.utils.counters["stats"][
        "unique_graphs"
    ] - graphs, metrics.generated_kernel_count


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompt", default="a red circle on grass")
    ap.add_argument("--out", help="write <out>.json")
    ap.add_argument(
        "--compiled",
        action="store_true",
        help="also compile each chain's step and count its graphs and kernels (seconds per case)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    adapter = load_model("demo")
    rows = []
    for name, method, window, tree in CASES:
        settings = method_settings(method, window, adapter.default_sampling, 0, tree=tree)
        per_it, ops, its = count(adapter, settings, args.prompt)
        rows.append(
            dict(
                case=name,
                ops_per_iteration=round(per_it, 1),
                iterations=its,
                top=dict(ops.most_common(8)),
            )
        )
        print(
            f"{name:<34} {per_it:7.1f} ops / iteration over {its} iterations;  top: "
            + ", ".join(f"{k} {v / its:.1f}" for k, v in ops.most_common(6))
        )
    # after every eager count
    for row, (name, method, window, tree) in zip(rows, CASES if args.compiled else ()):
        if not tree.on:  # a tree's verification stays eager (engine/loop.py)
            settings = method_settings(method, window, adapter.default_sampling, 0, tree=tree)
            graphs, kernels = compiled_kernels(adapter, settings, args.prompt)
            row.update(compiled_graphs=graphs, compiled_kernels=kernels)
            print(f"{name:<34} compiled: {kernels} kernels in {graphs} graph(s)")
    if args.out:
        with open(args.out + ".json", "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
