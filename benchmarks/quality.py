"""How far the lossy verifiers (LANTERN, GSD, with or without VP and coupling) move the output
distribution away from AR's, on the demo model: many images of each prompt per method, compared with
AR's by total variation between (a) codebook-usage histograms and (b) the demo judge's predicted
shape / colour / background distributions. Two independent AR batches give the noise floor, and
exact SJD must sit at it.

    python -m benchmarks.quality --out benchmarks/results/quality
"""

from __future__ import annotations

import argparse

import torch

from sjdvp_core import decode
from sjdvp_core.demo import load_demo, load_judge, scenes
from sjdvp_core.demo.judge import HEADS, prompt_match

from .compare_methods import INIT, settings_for, write_table

METHODS = ("sjd", "lantern", "lantern-vp", "gsd", "gsd-vp")


def tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a / a.sum() - b / b.sum()).abs().sum())


@torch.no_grad()
def sample(demo, judge, prompt: str, settings) -> dict:
    """One batch of images -> code counts, judge prediction counts per head, prompt-match rate."""
    res = decode(demo, prompt, settings)
    images = demo.decode_image(res.codes).permute(0, 3, 1, 2) * 2 - 1
    heads = [logits.argmax(-1) for logits in judge(images)]
    cls = torch.full((images.shape[0],), demo.class_id(prompt))
    return dict(
        codes=torch.bincount(res.codes.flatten(), minlength=demo.codebook().shape[0]).float(),
        heads=[torch.bincount(h, minlength=n).float() for h, n in zip(heads, HEADS)],
        match=float(prompt_match(judge, images, cls).float().mean()),
    )


def distance(x: dict, ar: dict) -> tuple[float, float]:
    return tv(x["codes"], ar["codes"]), sum(tv(h, g) for h, g in zip(x["heads"], ar["heads"])) / 3


def main(samples=64, prompts=2, window=32, out=None, threads=1):
    torch.set_num_threads(threads)
    demo, judge = load_demo(), load_judge()
    sampling = demo.default_sampling
    chosen = scenes.PROMPTS[5 :: max(1, len(scenes.PROMPTS) // prompts)][:prompts]
    rows = []
    for prompt in chosen:
        ar = sample(
            demo,
            judge,
            prompt,
            settings_for(demo, "ar", 1, "off", "1x1", INIT, sampling, 0, samples),
        )
        floor = sample(
            demo,
            judge,
            prompt,
            settings_for(demo, "ar", 1, "off", "1x1", INIT, sampling, 1, samples),
        )
        rows.append(
            (prompt, "ar (second batch)", False, *distance(floor, ar), floor["match"], ar["match"])
        )
        for method in METHODS:
            for coupled in (False, True):
                drafting = "on" if coupled else "off"
                settings = settings_for(
                    demo, method, window, drafting, "1x1", INIT, sampling, 2, samples
                )
                x = sample(demo, judge, prompt, settings)
                rows.append((prompt, method, coupled, *distance(x, ar), x["match"], ar["match"]))
                print(rows[-1], flush=True)
    lines = [
        f"demo model, W={window}, {samples} images per prompt and method, prompts: {', '.join(chosen)}; "
        "total variation from AR's batch (the AR row is a second, independent AR batch: the noise floor)",
        "",
        "| method | coupled | code-usage TV | judge TV (shape, colour, background) | prompt match (AR's) |",
        "|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r[1] for r in rows):
        for coupled in (False, True):
            sel = [r for r in rows if r[1] == name and r[2] == coupled]
            if not sel:
                continue
            mean = [sum(r[i] for r in sel) / len(sel) for i in (3, 4, 5, 6)]
            lines.append(
                f"| {name} | {'yes' if coupled else 'no'} | {mean[0]:.3f} | {mean[1]:.3f} | "
                f"{mean[2]:.2f} ({mean[3]:.2f}) |"
            )
    write_table("\n".join(lines) + "\n", out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--samples", type=int, default=64, help="images per prompt and method (one batch)"
    )
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--window", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out")
    main(**vars(ap.parse_args()))
