"""Is our AR baseline a fair one? The engine's AR (window 1 through the Jacobi loop, what every
speed-up in this project is measured against) timed against a plain sampling loop over the same
model, as LlamaGen's and transformers' samplers run it: forward one token, mix CFG, softmax,
multinomial, nothing else. Both decode the demo model's full image, alternating run by run in one
process; medians.

    python -m benchmarks.ar_baseline --repeats 7

A ratio above 1 means the engine's AR is slower than the plain loop, so speed-ups measured against
it are overstated by that factor (the loop's own work per token: bookkeeping, the structure mask,
statistics)."""

from __future__ import annotations

import argparse

import torch

from sjdvp_core.demo import load_demo
from sjdvp_core.engine.decode import decode
from sjdvp_core.engine.settings import method_settings
from sjdvp_core.timing import interleaved


def plain_ar(adapter, prompt: str, seed: int) -> torch.Tensor:
    """The plain loop: tokens [B, L] of one image with CFG (the demo has no forced tokens, no
    top-k or top-p)."""
    s, gen = adapter.default_sampling, torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        _, logits = adapter.start([prompt], None, True)
        tokens = []
        for i in range(adapter.layout.length):
            if i:  # the last token, at its position, predicts the next
                x = tokens[-1].repeat(2)[:, None]
                logits = adapter.forward(x, torch.full_like(x, i - 1))[:, 0]
            cond, uncond = logits.float().chunk(2)
            probs = ((uncond + s.cfg_scale * (cond - uncond)) / s.temperature).softmax(-1)
            tokens.append(torch.multinomial(probs, 1, generator=gen)[:, 0])
        adapter.finish()
    return torch.stack(tokens, 1)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--prompt", default="a red circle on grass")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args(argv)
    adapter = load_demo()
    s = adapter.default_sampling
    if s.top_k or s.top_p < 1 or s.greedy or adapter.layout.forced.ge(0).any():
        raise SystemExit(
            "the plain loop assumes no top-k / top-p, sampling, and no forced tokens (the demo's)"
        )
    timed = interleaved(
        {
            "plain": lambda: plain_ar(adapter, args.prompt, 0),
            "engine": lambda: decode(adapter, args.prompt, method_settings("ar", 1, s, 0)),
        },
        args.repeats,
    )
    plain, engine = timed["plain"].median, timed["engine"].median
    print(
        f"plain AR loop {plain:.3f} s, the engine's AR {engine:.3f} s per image (medians of {args.repeats}): "
        f"the engine's AR takes {engine / plain:.3f}x the plain loop's time"
    )
    return {"plain_s": plain, "engine_s": engine, "ratio": engine / plain}


if __name__ == "__main__":
    main()
