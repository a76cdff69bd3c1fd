"""Distribution exactness on a toy model whose sequence distribution is enumerable (64 sequences in
the support: 6 image cells, top-2 of 4 codes, CFG 1.5, row-end and end-of-image tokens forced).
200k samples: a Pearson chi-square test that rejects a 2%-TV deviation (checked below) accepts
SJD and SJD-VP (any strength, with or without coupled drafting or continuation, with the
automatic window, chain and tree, with every draft init), and rejects VP drafts verified against
the unfused q."""

import pytest
import torch

from benchmarks.toy import ToyGridAdapter
from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    VPSettings,
    WindowSettings,
    decode,
)
from sjdvp_core.engine import auto
from sjdvp_core.engine import calibration as calibrating
from sjdvp_core.engine.cost import PassCost
from sjdvp_core.engine.settings import DRAFT_INITS, TreeSettings
from tests.helpers.toy_reference import STRONG_VP, chi2_pvalue, code_index, exact_distribution

pytestmark = pytest.mark.statistical
N = 200_000
ALPHA = 1e-3
TOY = ToyGridAdapter(height=2, width=3, levels=2, sharpness=3.0, noise=1.0, seed=3)
SAMPLING = SamplingSettings(cfg_scale=1.5, top_k=2)
_, EXACT = exact_distribution(TOY, 1, cfg_scale=1.5, top_k=2)


def sample_counts(drafter, W=6, seed=0, init=WindowSettings.init):
    s = DecodeSettings(
        window=WindowSettings(W, init=init),
        drafter=drafter,
        sampling=SAMPLING,
        seed=seed,
        batch_size=N,
    )
    res = decode(TOY, 1, s)
    forced = TOY.layout.forced
    assert torch.equal(res.tokens[:, forced >= 0], forced[forced >= 0].expand(N, -1))
    return torch.bincount(
        code_index(res.codes.flatten(1), 4), minlength=EXACT.numel()
    ).float(), res.stats


def tv(counts):
    return 0.5 * float((counts / counts.sum() - EXACT).abs().sum())


def test_the_test_has_power_against_a_2_percent_tv_deviation():
    # spread the deviation thinly: pair up sequences of neighbouring probability and move the same
    # fraction of the smaller one's mass across every pair, for a total TV of exactly 2%
    order = EXACT.argsort(descending=True)[: int((EXACT > 0).sum()) // 2 * 2].view(-1, 2)
    moved = torch.minimum(EXACT[order[:, 0]], EXACT[order[:, 1]])
    eps = 0.02 / float(moved.sum())
    assert eps < 1
    biased = EXACT.clone()
    biased[order[:, 0]] += eps * moved
    biased[order[:, 1]] -= eps * moved
    assert 0.5 * float((biased - EXACT).abs().sum()) == pytest.approx(0.02)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(
        torch.multinomial(biased, N, replacement=True, generator=g), minlength=EXACT.numel()
    ).float()
    assert chi2_pvalue(counts, EXACT * N) < ALPHA


@pytest.mark.parametrize(
    "name,drafter,W",
    [
        ("ar", DrafterSettings(), 1),
        ("sjd", DrafterSettings(coupled=False), 6),
        ("sjd-w3-repeat", DrafterSettings(coupled=False), 3),
        ("sjd-vp", DrafterSettings(vp=VPSettings(**STRONG_VP, strength=2.0), coupled=False), 6),
        (
            "sjd-vp-negative",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength=-2.0), coupled=False),
            6,
        ),
        (
            "sjd-vp-zero",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength=0.0), coupled=False),
            6,
        ),
        (
            "sjd-vp-auto",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength="auto"), coupled=False),
            6,
        ),
        ("sjd-coupled", DrafterSettings(coupled=True), 6),
        (
            "sjd-vp-auto-coupled",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength="auto"), coupled=True),
            6,
        ),
        (
            "sjd-vp-coupled",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength=2.0), coupled=True),
            6,
        ),
        (
            "sjd-vp-negative-coupled",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength=-2.0), coupled=True),
            6,
        ),
        ("sjd-continued", DrafterSettings(coupled=False, continuation=True), 6),
        ("sjd-continued-coupled", DrafterSettings(continuation=True), 6),
        (
            "sjd-vp-continued",
            DrafterSettings(vp=VPSettings(**STRONG_VP, strength=2.0), continuation=True),
            6,
        ),
    ],
)
def test_exact_decoders_sample_the_model_distribution(name, drafter, W):
    counts, stats = sample_counts(drafter, W)
    assert chi2_pvalue(counts, EXACT * N) > ALPHA
    assert tv(counts) < 0.012
    if drafter.vp is not None and drafter.vp.strength not in (0, "auto"):
        assert stats.vp_drafts > 10_000  # the fusion really ran


@pytest.mark.parametrize("init", [i for i in DRAFT_INITS if i != WindowSettings.init])
@pytest.mark.parametrize(
    "drafter",
    [DrafterSettings(coupled=False), DrafterSettings(vp=VPSettings(**STRONG_VP, strength="auto"))],
    ids=["sjd", "sjd-vp-auto-coupled"],
)
def test_every_draft_init_keeps_the_law(init, drafter):
    """The cases above start fresh drafts as the default does (a copy of the cell above, one-hot q);
    the other inits (uniform q, or a one-hot copy of the cell to the left) likewise."""
    counts, _ = sample_counts(drafter, init=init)
    assert chi2_pvalue(counts, EXACT * N) > ALPHA and tv(counts) < 0.012


def test_vp_verified_against_unfused_q_is_flagged():
    biased = DrafterSettings(vp=VPSettings(**STRONG_VP, strength=2.0, lossless=False))
    counts, _ = sample_counts(biased)
    assert chi2_pvalue(counts, EXACT * N) < ALPHA


def test_zero_relaxation_gives_the_sjd_tokens():
    s = dict(
        window=WindowSettings(8),
        sampling=SamplingSettings(cfg_scale=2.0, top_k=3),
        seed=11,
        batch_size=64,
    )
    big = ToyGridAdapter(height=5, width=5, levels=3, sharpness=4.0, seed=2)
    sjd = decode(big, 2, DecodeSettings(drafter=DrafterSettings(), **s)).tokens
    for d in (
        DrafterSettings(verifier="lantern", lantern_delta=0.0),
        DrafterSettings(verifier="gsd", gsd_group=1),
    ):
        assert torch.equal(decode(big, 2, DecodeSettings(drafter=d, **s)).tokens, sjd)
    relaxed = decode(
        big, 2, DecodeSettings(drafter=DrafterSettings(verifier="lantern", lantern_delta=0.3), **s)
    )
    assert not torch.equal(relaxed.tokens, sjd)


@pytest.mark.parametrize("delta", [0.05, 0.1, 0.2])
def test_lantern_stays_within_its_budget(delta):
    """On this toy the measured TV of LANTERN's sequences from the exact distribution stays within
    delta (measured 0.024, 0.033, 0.131; delta only caps the bonus per verification, so this is
    the toy's outcome, not a guarantee), and it is a real, detectable deviation (LANTERN is
    lossy)."""
    counts, _ = sample_counts(DrafterSettings(verifier="lantern", lantern_delta=delta, lantern_k=3))
    measured = tv(counts)
    assert measured <= delta
    assert chi2_pvalue(counts, EXACT * N) < ALPHA


@pytest.mark.parametrize(
    "other",
    [auto.Plan(3), auto.Plan(6, TreeSettings(width=3, branch=2))],
    ids=["chain", "chain-and-tree"],
)
def test_window_auto_keeps_the_law(other, monkeypatch):
    """The plan chosen from the past changes no law: here it alternates every iteration between a
    chain of 6 and another window or a capped tree (the chooser's own rule is tested in
    test_auto.py)."""
    monkeypatch.setattr(auto.PlanChooser, "choose", lambda self, it: self.profile.plans[it % 2])
    # both plans stay choosable
    monkeypatch.setattr(calibrating, "contenders", lambda profile, cost: profile)
    profile = auto.Profile((auto.Plan(6), other), (2.0, 2.0), "synthetic")
    cost = PassCost((1, 2, 4, 8), (1.0, 1.1, 1.4, 2.4), "synthetic")
    drafter = DrafterSettings(vp=VPSettings(**STRONG_VP, strength="auto"))
    s = DecodeSettings(
        window=WindowSettings(6, auto=True), drafter=drafter, sampling=SAMPLING, batch_size=N
    )
    res = decode(TOY, 1, s, cost=cost, profile=profile)
    assert len(set(res.stats.scored_per_iter)) > 1
    counts = torch.bincount(code_index(res.codes.flatten(1), 4), minlength=EXACT.numel()).float()
    assert chi2_pvalue(counts, EXACT * N) > ALPHA and tv(counts) < 0.012
