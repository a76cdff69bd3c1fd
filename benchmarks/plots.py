"""The benchmark's plots (matplotlib, optional): step compression vs AR, acceptance by window slot,
tokens committed across iterations (where VP and coupling gain) and latency vs step compression."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _label(r: dict) -> str:
    tree = r.get("tree", "chain")
    drafting = r.get("drafting", "on" if r["coupled"] else "off")
    init = r.get("init", "random")  # older results predate --inits: random, then the only default
    return (
        r["method"]
        + {"off": "", "on": " coupled", "continued": " continued"}[drafting]
        + ("" if tree == "chain" else f" tree {tree}")
        + ("" if init == "random" else f" {init}")
    )


def plot_all(results: list[dict], out: str) -> list[str]:
    runs = [r for r in results if r["method"] != "ar"]
    windows = sorted({r["window"] for r in runs})
    labels = list(dict.fromkeys(_label(r) for r in runs))
    paths = []

    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(windows)
    for i, W in enumerate(windows):
        vals = [
            next((r["step_compression"] for r in runs if r["window"] == W and _label(r) == lab), 0)
            for lab in labels
        ]
        ax.bar([x + i * width for x in range(len(labels))], vals, width, label=f"W={W}")
    ax.set_xticks(
        [x + width * (len(windows) - 1) / 2 for x in range(len(labels))],
        labels,
        rotation=35,
        ha="right",
    )
    ax.set_ylabel("step compression vs AR (x)")
    ax.axhline(1, color="grey", lw=0.8)
    ax.legend()
    paths.append(_save(fig, out + "_step_compression.png"))

    W = windows[len(windows) // 2]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in (r for r in runs if r["window"] == W and r["method"].startswith("sjd")):
        slots = [(i + 1, a) for i, a in enumerate(r["slot_acceptance"]) if a is not None]
        ax1.plot([i for i, _ in slots], [a for _, a in slots], label=_label(r))
        ax2.plot(
            range(1, len(r["committed_cumulative"]) + 1), r["committed_cumulative"], label=_label(r)
        )
    ax1.set(
        xlabel="window slot",
        ylabel="acceptance of verified drafts",
        title=f"acceptance by slot, W={W}",
    )
    ax2.set(
        xlabel="iteration",
        ylabel="tokens committed so far (mean over runs)",
        title=f"progress across iterations, W={W}",
    )
    ax1.legend(fontsize=7)
    paths.append(_save(fig, out + "_acceptance.png"))

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in runs:
        ax.scatter(r["step_compression"], r["latency_speedup"], s=12)
        ax.annotate(
            f"{_label(r)} W{r['window']}", (r["step_compression"], r["latency_speedup"]), fontsize=5
        )
    ax.set(
        xlabel="step compression (x)",
        ylabel="latency speed-up (x)",
        title="latency vs step compression",
    )
    paths.append(_save(fig, out + "_latency.png"))
    return paths


def _save(fig, path: str) -> str:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
