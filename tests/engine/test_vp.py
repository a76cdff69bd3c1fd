"""Verification Prediction's parts on hand-made numbers."""

import math

import pytest
import torch

from sjdvp_core.engine.settings import AUTO_STRENGTHS, VPSettings
from sjdvp_core.engine.vp import AutoStrength, fuse
from sjdvp_core.engine.window import History, Slide


def test_history_ewa_and_growth_counter():
    h = History.empty(1, 1, 3, "cpu")
    obs = torch.tensor([[True]])
    seq = [[0.2, 0.3, 0.5], [0.3, 0.3, 0.4], [0.4, 0.2, 0.4], [0.5, 0.25, 0.25]]
    growths = []
    for p in seq:
        h, growth = h.observe(torch.tensor([[p]]), obs, beta=0.5)
        growths.append(growth[0, 0].tolist())
    # first observation: pbar = p, no growth; then counts of consecutive strict increases
    assert growths == [[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 1, 0]]
    pbar = torch.tensor(seq[0])
    for p in seq[1:]:
        pbar = 0.5 * pbar + 0.5 * torch.tensor(p)
    assert torch.allclose(h.pbar[0, 0], pbar) and torch.allclose(
        h.prev[0, 0], torch.tensor(seq[-1])
    )
    assert h.seen.tolist() == [[4]]


def test_unobserved_slots_keep_their_history():
    h = History.empty(1, 2, 2, "cpu")
    p = torch.tensor([[[0.5, 0.5], [0.9, 0.1]]])
    h, _ = h.observe(p, torch.tensor([[True, False]]), beta=0.5)
    assert h.seen.tolist() == [[1, 0]] and h.pbar[0, 1].tolist() == [0.0, 0.0]


def test_fusion_formula_topk_and_eligibility():
    s = VPSettings(growth_steps=2, top_k=2, strength=1.0, max_score=math.log(4))
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.5, 0.3, 0.2]]])
    pbar = torch.tensor([[[0.25, 0.3, 0.05], [0.25, 0.3, 0.05]]])
    growth = torch.tensor([[[2, 2, 2], [2, 2, 2]]], dtype=torch.int16)
    out = fuse(p, pbar, 0.5 * pbar + 0.5 * p, growth, torch.tensor([[True, False]]), s)
    # token 0: gain log 2 (rose, in top-2) -> x2; token 1: gain 0; token 2 rose but is not top-2
    expected = torch.tensor([1.0, 0.3, 0.2]) / 1.5
    assert torch.allclose(out[0, 0], expected)
    assert torch.allclose(out[0, 1], p[0, 1])  # not eligible: unchanged


def test_fusion_needs_n_consecutive_rises_and_clips_the_score():
    s = VPSettings(growth_steps=2, top_k=3, strength=1.0, max_score=math.log(2))
    p = torch.tensor([[[0.6, 0.2, 0.2]]])
    pbar = torch.tensor([[[0.01, 0.1, 0.2]]])  # raw gains: log 60, log 2, 0
    growth = torch.tensor([[[2, 1, 5]]], dtype=torch.int16)
    out = fuse(p, pbar, 0.5 * pbar + 0.5 * p, growth, torch.tensor([[True]]), s)
    # clipped at x2; token 1 masked
    assert torch.allclose(out[0, 0], torch.tensor([1.2, 0.2, 0.2]) / 1.6)


def test_negative_strength_shrinks_toward_the_history():
    s = VPSettings(growth_steps=3, top_k=3, strength=-0.5, beta=0.5)
    p = torch.tensor([[[0.5, 0.3, 0.2, 0.0]]])
    pbar_prev = torch.tensor([[[0.1, 0.3, 0.4, 0.2]]])
    pbar = 0.5 * pbar_prev + 0.5 * p  # the history with this observation
    out = fuse(
        p, pbar_prev, pbar, torch.zeros(1, 1, 4, dtype=torch.int16), torch.tensor([[True]]), s
    )
    expected = (p[0, 0, :3] ** 0.5) * (pbar[0, 0, :3] ** 0.5)
    assert torch.allclose(out[0, 0, :3], expected / expected.sum(), atol=1e-6)
    assert out[0, 0, 3] == 0  # a token outside p's support never appears, whatever its history
    # |strength| is capped at 1: q = pbar on p's support
    full = fuse(
        p,
        pbar_prev,
        pbar,
        torch.zeros(1, 1, 4, dtype=torch.int16),
        torch.tensor([[True]]),
        VPSettings(top_k=3, strength=-3.0, beta=0.5),
    )
    assert torch.allclose(full[0, 0, :3], pbar[0, 0, :3] / pbar[0, 0, :3].sum(), atol=1e-6)


def test_slide_per_row_and_new_slots():
    slide = Slide(torch.tensor([1, 3]), 4)
    t = torch.arange(8).view(2, 4)
    assert slide.take(t)[:, :1].tolist() == [[1], [7]] and slide.take(t)[0, :3].tolist() == [
        1,
        2,
        3,
    ]
    assert slide.new(4).tolist() == [[False, False, False, True], [False, True, True, True]]
    wide = torch.arange(16).view(2, 4, 2)  # fields with a vocabulary axis slide the same way
    assert slide.take(wide)[1, 0].tolist() == [14, 15]
    many = torch.arange(16).view(2, 2, 4)  # candidates: slots on the third axis
    assert slide.take(many.transpose(0, 1).contiguous(), dim=2)[:, 1, 0].tolist() == [11, 15]
    seen = History.empty(2, 4, 3, "cpu")
    seen.seen += 5
    assert seen.slide(slide).seen.tolist() == [[5, 5, 5, 0], [5, 0, 0, 0]]  # new slots start unseen


def synthetic_logits(dynamics: str, steps=8, slots=400, vocab=16, seed=0):
    """Per-iteration logits [T, 1, slots, vocab] of positions under two Jacobi dynamics: momentum
    (each token's logit keeps its own trend, so a rise predicts a further rise) and mean reversion
    (logits jitter around a fixed level, so a rise predicts a fall back)."""
    g = torch.Generator().manual_seed(seed)
    base = 2 * torch.randn(1, slots, vocab, generator=g)
    t = torch.arange(steps, dtype=torch.float)[:, None, None, None]
    if dynamics == "momentum":
        return base + 0.5 * t * torch.randn(1, slots, vocab, generator=g)
    return base + torch.randn(steps, 1, slots, vocab, generator=g)


@pytest.mark.parametrize("dynamics,sign", [("momentum", 1), ("mean_reversion", -1)])
def test_auto_strength_picks_the_sign_the_dynamics_reward(dynamics, sign):
    logits = synthetic_logits(dynamics)
    slots, vocab = logits.shape[2:]
    auto = AutoStrength(
        VPSettings(growth_steps=1, top_k=vocab, strength="auto"), AUTO_STRENGTHS, "cpu"
    )
    history = History.empty(1, slots, vocab, "cpu")
    everywhere = torch.ones(1, slots, dtype=torch.bool)
    candidates = None
    for p in logits.softmax(-1):
        if candidates is not None:
            auto.observe(p, candidates, everywhere)  # how would each candidate's draft have fared?
        pbar_prev, had = history.pbar, history.seen > 0
        history, growth = history.observe(p, everywhere, beta=0.5)
        candidates = auto.fuse(p, pbar_prev, history.pbar, growth, had)
    chosen = AUTO_STRENGTHS[int(auto.best)]
    assert chosen * sign > 0, auto.summary()


def test_auto_strength_differs_between_models_with_different_dynamics():
    """Whole decodes with independent drafts: on the mean-reverting grid toy auto shrinks (pooled
    over the decodes, a shrinking strength scores best, and no decode extrapolates; one class of
    the grid is a near tie between shrinking and plain drafting); on the drifting trend toy,
    where shrinkage costs forward passes, it never shrinks. Random fresh drafts: with copies of
    the cells above (the default) the trend toy's drafts pass so often that plain and shrinking
    drafts tie there (0.912 against 0.912 in one decode)."""
    from benchmarks.toy import ToyGridAdapter, ToyTrendAdapter
    from sjdvp_core import DecodeSettings, DrafterSettings, WindowSettings, decode

    grid = ToyGridAdapter(height=16, width=16, levels=8, sharpness=12.0)
    trend = ToyTrendAdapter(height=16, width=16, levels=8, sharpness=80.0, noise=0.3)
    picks = {}
    for name, toy in (("grid", grid), ("trend", trend)):
        independent = DrafterSettings(vp=VPSettings(), coupled=False)
        picks[name] = [
            decode(
                toy,
                c,
                DecodeSettings(
                    window=WindowSettings(16, init="random"),
                    drafter=independent,
                    sampling=toy.default_sampling,
                    seed=c,
                ),
            ).stats.vp_auto
            for c in range(4)
        ]
    pooled = {c: sum(p["vp_auto_rates"][str(c)] for p in picks["grid"]) for c in AUTO_STRENGTHS}
    assert max(pooled, key=pooled.get) < 0 and all(
        p["vp_auto_strength"] <= 0 for p in picks["grid"]
    ), picks
    assert all(p["vp_auto_strength"] >= 0 for p in picks["trend"]), picks


def test_auto_scores_stay_finite_when_rows_sit_at_different_positions():
    """A window wider than the image with a batch: slots past a row's image were never scored."""
    from benchmarks.toy import ToyGridAdapter
    from sjdvp_core import DecodeSettings, DrafterSettings, WindowSettings, decode

    toy = ToyGridAdapter(8, 8, levels=4)
    for seed in range(3):
        st = decode(
            toy,
            [0, 1],
            DecodeSettings(
                window=WindowSettings(128),
                drafter=DrafterSettings(vp=VPSettings()),
                batch_size=2,
                seed=seed,
            ),
        ).stats
        assert all(math.isfinite(r) for r in st.vp_auto["vp_auto_rates"].values()), st.vp_auto


def test_auto_without_a_carried_draft_says_it_drafted_plainly():
    """At a window of 2 no draft is looked at twice, so VP has no history to act on: the report says
    so rather than "settled on +0" with every rate at 0%; from a window of 3 drafts are carried
    and judged."""
    from benchmarks.toy import ToyGridAdapter
    from sjdvp_core import DecodeSettings, DrafterSettings, WindowSettings, decode
    from sjdvp_core.engine.report import report_text

    toy = ToyGridAdapter(8, 8)
    for w, judged in ((2, False), (3, True)):
        res = decode(
            toy,
            1,
            DecodeSettings(
                window=WindowSettings(w),
                drafter=DrafterSettings(vp=VPSettings()),
                sampling=toy.default_sampling,
            ),
        )
        assert bool(res.stats.vp_auto["vp_auto_judged"]) == judged
        assert ("VP auto settled on strength" in report_text(res, "SJD-VP")) == judged
        assert ("VP auto drafted plainly" in report_text(res, "SJD-VP")) != judged
