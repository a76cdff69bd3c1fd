"""Draft trees: shape, candidates, exactness (chi-square with power), greedy == AR, and every
adapter's tree forward equal to the chain forwards of its branches."""

import pytest
import torch

from benchmarks.toy import ToyGridAdapter, ToyTrendAdapter
from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    TreeSettings,
    VPSettings,
    WindowSettings,
    decode,
)
from sjdvp_core.engine.tree import scratch_nodes, tree_shape
from tests.helpers.tiny_gpt import TinyGPTAdapter
from tests.helpers.toy_reference import (
    STRONG_VP,
    ar_greedy,
    chi2_pvalue,
    code_index,
    exact_distribution,
)
from tests.helpers.tree_check import assert_tree_matches_chains, branch_paths

ALPHA = 1e-3
N = 100_000
# 9 codes, 4 cells, top-4 of 9: up to 3 draws from a redrafted q, 8 from a fresh one, and 2 guesses
WIDE = ToyGridAdapter(height=2, width=2, levels=3, sharpness=3.0, noise=1.0, seed=3)


def exact(sampling: SamplingSettings) -> torch.Tensor:
    return exact_distribution(
        WIDE, 1, cfg_scale=sampling.cfg_scale, top_k=sampling.top_k, top_p=sampling.top_p
    )[1]


TOP_K = SamplingSettings(cfg_scale=1.5, top_k=4)
TOP_P = SamplingSettings(cfg_scale=1.5, top_p=0.8)
EXACT = {TOP_K: exact(TOP_K), TOP_P: exact(TOP_P)}


def counts(drafter, tree, sampling=TOP_K, W=5, seed=0, init="random"):
    """Random fresh drafts by default: copies of the cells above pass so often on this toy that
    alternatives are rarely needed, and a guess of the cell above repeats the draft
    (test_default_init_keeps_the_law)."""
    s = DecodeSettings(
        window=WindowSettings(W, init=init, tree=tree),
        drafter=drafter,
        sampling=sampling,
        seed=seed,
        batch_size=N,
    )
    res = decode(WIDE, 1, s)
    return torch.bincount(
        code_index(res.codes.flatten(1), 9), minlength=EXACT[sampling].numel()
    ).float(), res.stats


def test_shape_hangs_each_alternative_off_the_main_chain():
    shape = tree_shape(5, TreeSettings(width=3, depth=2), "cpu")
    assert (shape.levels, shape.alts) == (2, 2)
    assert shape.nodes == 5 + 2 * 4 + 2 * 3 == scratch_nodes(5, TreeSettings(width=3, depth=2)) + 5
    paths = branch_paths(shape)
    assert paths[0] == [0, 1, 2, 3, 4]  # the chain
    assert paths[1] == [0, 5, 6, 7, 8]  # an alternative at slot 0 and its drafts
    assert paths[-1] == [0, 1, 16, 17, 18]  # one at slot 1, after slot 0's draft
    assert shape.offsets[paths[-1]].tolist() == [0, 1, 2, 3, 4]
    # pool: committed, drafts 1..4, alternatives
    assert shape.source[paths[1]].tolist() == [
        0,
        5,
        2,
        3,
        4,
    ]
    assert shape.blocks[1, 1].tolist() == [16, 17, 18, 18]  # padded with its last node
    short = tree_shape(5, TreeSettings(width=2, branch=1), "cpu")
    assert branch_paths(short)[1] == [0, 5, 6] and short.nodes == 7
    assert scratch_nodes(5, TreeSettings()) == 0 and scratch_nodes(1, TreeSettings(width=4)) == 0


@pytest.mark.statistical
def test_default_init_keeps_the_law():
    """Trees with fresh drafts as the default starts them (copies of the cells above)."""
    c, stats = counts(
        DrafterSettings(vp=VPSettings(**STRONG_VP)),
        TreeSettings(width=4, depth=2),
        init=WindowSettings.init,
    )
    assert chi2_pvalue(c, EXACT[TOP_K] * N) > ALPHA and stats.tree_tried > 0


@pytest.mark.statistical
def test_the_test_has_power_against_a_2_percent_tv_deviation():
    e = EXACT[TOP_K]
    order = e.argsort(descending=True)[: int((e > 0).sum()) // 2 * 2].view(-1, 2)
    moved = torch.minimum(e[order[:, 0]], e[order[:, 1]])
    eps = 0.02 / float(moved.sum())
    biased = e.clone()
    biased[order[:, 0]] += eps * moved
    biased[order[:, 1]] -= eps * moved
    g = torch.Generator().manual_seed(0)
    c = torch.bincount(
        torch.multinomial(biased, N, replacement=True, generator=g), minlength=e.numel()
    ).float()
    assert chi2_pvalue(c, e * N) < ALPHA


VP = VPSettings(**STRONG_VP, strength=2.0)


@pytest.mark.statistical
@pytest.mark.parametrize(
    "name,drafter,tree,sampling",
    [
        ("2 candidates, coupled", DrafterSettings(), TreeSettings(width=2, guesses=False), TOP_K),
        ("guesses, coupled", DrafterSettings(), TreeSettings(width=3), TOP_K),
        (
            "guesses and draws, depth 2, independent",
            DrafterSettings(coupled=False),
            TreeSettings(width=4, depth=2),
            TOP_K,
        ),
        (
            "6 alternatives, depth 3, VP coupled",
            DrafterSettings(vp=VP),
            TreeSettings(width=7, depth=3),
            TOP_K,
        ),
        (
            "draws only, depth 2, VP auto",
            DrafterSettings(vp=VPSettings(**STRONG_VP)),
            TreeSettings(width=5, depth=2, guesses=False),
            TOP_K,
        ),
        (
            "continuation: fresh noise",
            DrafterSettings(continuation=True),
            TreeSettings(width=4, depth=2),
            TOP_K,
        ),
        (
            "short branches, top-p",
            DrafterSettings(),
            TreeSettings(width=4, depth=2, branch=1),
            TOP_P,
        ),
    ],
)
def test_trees_sample_the_model_distribution(name, drafter, tree, sampling):
    c, stats = counts(drafter, tree, sampling)
    assert chi2_pvalue(c, EXACT[sampling] * N) > ALPHA, name  # (TV's sampling floor here is ~0.015)
    assert stats.tree_tried > N // 4  # alternatives were really tried
    assert stats.tree_guess_accepted + stats.tree_draw_accepted > N // 20
    assert (stats.tree_guess_accepted > 0) == tree.guesses


@pytest.mark.statistical
def test_a_biased_sibling_rule_is_flagged(monkeypatch):
    """Teeth: testing every alternative against p itself instead of the residual left by the earlier
    candidates over-accepts them, and the chi-square test sees it."""
    import sjdvp_core.engine.tree as tree_module

    monkeypatch.setattr(tree_module, "residual", lambda p, q: p)
    c, _ = counts(DrafterSettings(), TreeSettings(width=4, depth=2))
    assert chi2_pvalue(c, EXACT[TOP_K] * N) < ALPHA


@pytest.mark.parametrize(
    "tree",
    [
        TreeSettings(width=3),
        TreeSettings(width=5, depth=3),
        TreeSettings(width=4, depth=2, guesses=False, branch=2),
    ],
)
@pytest.mark.parametrize("coupled", [True, False])
def test_greedy_tree_decoding_returns_the_ar_tokens(tree, coupled):
    toy = ToyGridAdapter(height=5, width=6, levels=4, sharpness=8.0, seed=4)
    sampling = SamplingSettings(cfg_scale=2.0, greedy=True, temperature=0.0)
    # random fresh drafts: the chain misses often enough that every tree is tried (copies of the
    # cells above pass this smooth toy's greedy verification so often that a 3-wide tree never is)
    s = DecodeSettings(
        window=WindowSettings(8, init="random", tree=tree),
        drafter=DrafterSettings(coupled=coupled),
        sampling=sampling,
        batch_size=3,
    )
    res = decode(toy, [1, 1, 1], s)
    assert torch.equal(res.tokens, ar_greedy(toy, 1, cfg_scale=2.0).expand(3, -1))
    assert res.stats.tree_tried > 0


def test_relaxed_verifiers_run_on_trees_and_reduce_to_sjd_at_zero():
    s = dict(
        window=WindowSettings(8, tree=TreeSettings(width=4, depth=2)),
        sampling=SamplingSettings(cfg_scale=2.0, top_k=3),
        seed=11,
        batch_size=32,
    )
    big = ToyGridAdapter(height=5, width=5, levels=3, sharpness=4.0, seed=2)
    sjd = decode(big, 2, DecodeSettings(drafter=DrafterSettings(), **s)).tokens
    for d in (
        DrafterSettings(verifier="lantern", lantern_delta=0.0),
        DrafterSettings(verifier="gsd", gsd_group=1),
    ):
        assert torch.equal(decode(big, 2, DecodeSettings(drafter=d, **s)).tokens, sjd)
    for d in (
        DrafterSettings(verifier="lantern", lantern_delta=0.3, lantern_k=4),
        DrafterSettings(verifier="gsd"),
    ):
        res = decode(big, 2, DecodeSettings(drafter=d, **s))
        assert not torch.equal(res.tokens, sjd) and res.stats.tree_tried > 0


@pytest.mark.parametrize("toy", [ToyGridAdapter(seed=1), ToyTrendAdapter(reach=6, seed=2)])
def test_toy_tree_forward_equals_its_chains(toy):
    assert_tree_matches_chains(toy, [0, 1, 2], cfg=True)
    assert_tree_matches_chains(
        toy, [3], cfg=False, w=6, tree=TreeSettings(width=4, depth=3, branch=1)
    )


def test_an_adapter_without_tree_forwards_says_what_to_do():
    s = DecodeSettings(
        window=WindowSettings(4, tree=TreeSettings(width=3)), sampling=SamplingSettings()
    )
    with pytest.raises(ValueError, match="cannot score draft trees; set tree width to 1"):
        decode(TinyGPTAdapter(), [0], s)


def test_tree_settings_are_checked():
    for bad, name in (
        (dict(width=0), "tree_width"),
        (dict(width=9), "tree_width"),
        (dict(depth=4), "tree_depth"),
        (dict(branch=-1), "tree_branch"),
        (dict(guesses=1), "tree_guesses"),
    ):
        with pytest.raises(ValueError, match=name):
            TreeSettings(**bad)


def test_a_rescued_slot_counts_as_a_rejected_draft():
    """Where a draft is rejected and an alternative passes in its place, the drafts' acceptance (the
    report's "drafts accepted", the momentum statistic) counts the draft as rejected; the rescue
    is counted apart. So the drafts accepted plus the rescues are the slots committed before each
    pass's own token: every committed token but one per pass (the last pass, ending at the
    image's end, may commit no token of its own)."""
    toy = ToyGridAdapter(height=8, width=8)
    rescues = 0
    for seed in range(3):
        settings = DecodeSettings(
            window=WindowSettings(8, init="random", tree=TreeSettings(width=4)),
            seed=seed,
            sampling=toy.default_sampling,
        )
        st = decode(toy, 1, settings).stats
        rescued = st.tree_guess_accepted + st.tree_draw_accepted
        committed = sum(int(c.sum()) for c in st.committed_per_iter)
        assert int(st.slot_accepted.sum()) + rescued - (committed - (st.forward_passes - 1)) in (
            0,
            1,
        ), seed
        rescues += rescued
    assert rescues > 3  # the case is exercised
