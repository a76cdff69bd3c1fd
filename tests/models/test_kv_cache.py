"""Rollback by position: after any sequence of window steps and rollbacks, the logits equal a fresh
full recompute; and greedy SJD through the cache returns the AR tokens."""

import torch

from sjdvp_core import DecodeSettings, SamplingSettings, WindowSettings, decode
from tests.helpers.tiny_gpt import TinyGPTAdapter


def full_logits(model, classes, tokens):
    """Recompute without the cache: [R, 1 + T] -> logits [R, 1 + T, V]."""
    x = torch.cat([model.cls(classes)[:, None], model.tok(tokens)], 1)
    positions = torch.arange(x.shape[1]).expand(x.shape[0], -1)
    return model(x, positions, cached=False)


@torch.inference_mode()
def test_window_steps_with_rollback_match_full_recompute():
    ad = TinyGPTAdapter()
    model, R = ad.model, 3
    g = torch.Generator().manual_seed(0)
    classes = torch.tensor([0, 1, 2])
    ad.start(classes.tolist(), None, False)
    committed = torch.randint(2, 12, (R, 60), generator=g)  # the "true" sequence per row
    n = torch.ones(R, dtype=torch.long)  # committed generated tokens per row
    for _ in range(8):
        W = int(torch.randint(1, 7, (1,), generator=g))
        window = torch.randint(2, 12, (R, W), generator=g)  # drafts, mostly wrong
        accept = torch.randint(0, W, (R,), generator=g)  # per row, a different number accepted
        window[:, 0] = committed.gather(1, (n - 1)[:, None])[:, 0]
        for r in range(R):  # accepted drafts match the truth
            window[r, 1 : accept[r] + 1] = committed[r, n[r] : n[r] + accept[r]]
        positions = (n - 1)[:, None] + torch.arange(W)
        logits = ad.forward(window, positions)
        ref = full_logits(model, classes, committed[:, : int(positions.max()) + 1].clone())
        for r in range(R):
            valid = int(accept[r]) + 1  # slots whose whole context is true
            expect = ref[r, int(n[r]) : int(n[r]) + valid]
            assert torch.allclose(logits[r, :valid], expect, atol=1e-5)
        n = n + accept + 1


def test_greedy_sjd_through_the_cache_equals_ar():
    ad = TinyGPTAdapter()
    for cfg in (1.0, 3.0):
        kw = dict(
            sampling=SamplingSettings(greedy=True, temperature=0.0, cfg_scale=cfg), batch_size=3
        )
        ar = decode(ad, [0, 1, 2], DecodeSettings(window=WindowSettings(1), **kw)).tokens
        for W in (2, 5, 16):
            sjd = decode(ad, [0, 1, 2], DecodeSettings(window=WindowSettings(W), **kw)).tokens
            assert torch.equal(sjd, ar)
