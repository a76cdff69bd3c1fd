"""The automatic window and the pass cost it chooses by (engine/auto.py, engine/cost.py)."""

import json
from dataclasses import replace

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
from sjdvp_core.datasheet import DEVICES, SHAPES, roofline
from sjdvp_core.engine import auto
from sjdvp_core.engine.calibration import (
    DRIFT,
    acceptance_profile,
    calibration,
    cost_key,
    forget_stale_cost,
    load_cached,
    measure_cost,
    pass_cost,
    save_cached,
)
from sjdvp_core.engine.cost import GRID, PassCost, monotone
from sjdvp_core.engine.drafting import Drafter
from sjdvp_core.engine.settings import TreeSettings, method_settings
from sjdvp_core.engine.stats import DecodeStats
from tests.helpers.paced_clock import PacedClock

RISING = PassCost((1, 2, 4, 8, 16), (1.0, 1.2, 1.5, 2.2, 3.8), "synthetic: a CPU-like curve")


def test_pass_cost_interpolates_and_extrapolates():
    assert RISING(3) == pytest.approx(1.35) and RISING(32) == pytest.approx(3.8 + 1.6 * 2)
    assert RISING.relative(4) == 1.5 and RISING.largest_within(2.0, 64) == 6
    with pytest.raises(ValueError, match="start at 1"):
        PassCost((2, 4), (1.0, 2.0), "x")
    assert PassCost.from_json(json.loads(json.dumps(RISING.to_json()))) == RISING


def test_roofline_knees_follow_the_devices():
    """A 7B pass is flat up to the knee (weights read once), then grows with FLOPs: later on an H200
    than on a 4090, where the same pass crosses into compute sooner."""
    h200, rtx = roofline("Lumina-mGPT 7B", "H200"), roofline("Lumina-mGPT 7B", "RTX 4090")
    assert h200.relative(32) < 1.02 and rtx.relative(32) < 1.02
    # no chord
    assert h200.relative(89) < 1.02 < roofline("Lumina-mGPT 7B", "H200", grid=GRID).relative(89)
    assert 1.0 < h200.relative(128) < rtx.relative(128)
    # a small model is sooner compute-bound
    assert roofline("LlamaGen-XL", "H200").relative(128) > h200.relative(128)
    assert all(d.source and d.bandwidth > 0 and d.flops > 0 for d in DEVICES.values())
    assert set(SHAPES) == {
        "Lumina-mGPT 7B",
        "Lumina-mGPT 2.0",
        "Emu3-Gen",
        "Janus-Pro-7B",
        "LlamaGen-XL",
        "GLM-Image",
    }


def test_candidates_drop_plans_that_a_richer_one_matches_in_cost():
    flat = PassCost((1, 64, 128), (1.0, 1.0, 1.5), "GPU-like: flat to 64")
    chains = [p.window for p in auto.candidate_plans(flat, 128)]
    assert chains == [128, 96, 64]  # below the knee, narrower windows only lose
    almost = PassCost((1, 64, 128), (1.0, 1.005, 1.5), "GPU-like: 0.5% dearer at 64")
    # it may commit nearly as much for less
    assert 48 in [p.window for p in auto.candidate_plans(almost, 128)]
    assert [p.window for p in auto.candidate_plans(RISING, 16)] == [16, 12, 8, 6, 4, 3, 2]
    trees = [p for p in auto.candidate_plans(flat, 128, auto_tree=True) if p.tree.on]
    assert trees and all(p.window >= auto.TREE_FROM and p.tree in auto.TREES for p in trees)
    # too dear there
    assert not [p for p in auto.candidate_plans(RISING, 16, auto_tree=True) if p.tree.on]
    assert auto.most_tokens(RISING, 64) == 12 and auto.most_tokens(RISING, 1) == 1
    user = TreeSettings(width=3)
    assert all(p.tree == user for p in auto.candidate_plans(RISING, 16, user))


def test_the_chooser_takes_the_best_rate_and_follows_this_decodes_acceptance():
    plans = (auto.Plan(16), auto.Plan(8), auto.Plan(4))
    profile = auto.Profile(plans, (5.0, 2.6, 1.6), "synthetic")
    assert auto.Profile.from_json(json.loads(json.dumps(profile.to_json()))) == profile

    def run(g):  # a prompt whose drafts win g times the tokens past the first the profile predicts
        chooser = auto.PlanChooser(RISING, profile)
        first = chooser.choose(1)
        for it in range(1, 60):
            plan = chooser.choose(it)
            chooser.record(plan, 1 + g * (profile.of(plan) - 1))
        return first, chooser.choose(61)

    assert run(1.0) == (auto.Plan(16), auto.Plan(16))  # 5 / 3.8 beats 2.6 / 2.2 and 1.6 / 1.5
    # (1 + 0.3) / 1.5 > (1 + 0.8) / 2.2 > (1 + 2) / 3.8
    assert run(0.5) == (
        auto.Plan(16),
        auto.Plan(4),
    )


def test_a_near_tie_goes_to_the_plan_that_scores_more():
    """Under a knee a wider plan costs a hair more; where the fitted profile gives it the narrower
    one's count, the wider is taken (it never commits less), by the chooser and among the
    contenders; a real price difference keeps the narrower."""
    wide, narrow = auto.Plan(64, auto.TREES[0]), auto.Plan(48, auto.TREES[0])
    profile = auto.Profile((wide, narrow), (4.7, 4.7), "synthetic: pooled by the fit")
    flat = PassCost((1, 128), (1.0, 1.01), "synthetic: a knee past 128")
    assert flat(wide.nodes) > flat(narrow.nodes)
    assert auto.best(profile, flat, 1.0) == wide and auto.PlanChooser(flat, profile).choice == wide
    assert auto.contenders(profile, flat).plans == (wide,)
    steep = PassCost((1, 128), (1.0, 2.0), "synthetic: no knee")
    assert auto.best(profile, steep, 1.0) == narrow and auto.contenders(profile, steep).plans == (
        narrow,
    )


def test_only_plans_that_can_win_are_kept_and_allocated(monkeypatch):
    plans = (auto.Plan(16), auto.Plan(12), auto.Plan(8), auto.Plan(4))
    # 12 commits less than 8 for more cost
    profile = auto.Profile(plans, (5.0, 2.0, 2.6, 1.6), "synthetic")
    # 16 wins for g above 0.62, 4 below; 8 is never the best
    kept = auto.contenders(profile, RISING)
    assert kept.plans == (auto.Plan(16), auto.Plan(4)) and kept.of(auto.Plan(4)) == 1.6
    monkeypatch.setattr(auto, "G_RANGE", (0.9, 1.1))  # near the example's acceptance 16 always wins
    assert auto.contenders(profile, RISING).plans == (auto.Plan(16),)
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    narrow = auto.Profile((auto.Plan(4), auto.Plan(3)), (3.0, 1.2), "synthetic")
    result = decode(
        toy,
        0,
        method_settings("sjd", 32, toy.default_sampling, auto=True),
        cost=RISING,
        profile=narrow,
    )
    assert result.stats.window == 4 and result.stats.auto_plans == {
        "4": result.stats.forward_passes - 1
    }


def test_the_profile_is_measured_on_the_example_and_cached(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    settings = method_settings("sjd", 16, toy.default_sampling, auto=True, auto_tree=True)
    plans = auto.candidate_plans(PassCost((1, 16), (1.0, 1.0), "flat"), 16, auto_tree=True)
    with caplog.at_level("INFO"):
        profile = acceptance_profile(toy, settings, plans)
    # the wait is explained
    assert "measuring the acceptance" in caplog.text and str(tmp_path) in caplog.text
    assert profile.plans == tuple(plans) and all(c >= 1 for c in profile.committed)
    caplog.clear()
    with caplog.at_level("INFO"):
        assert acceptance_profile(toy, settings, plans) == profile  # read back, not remeasured
    assert "measuring" not in caplog.text
    assert len(list(tmp_path.rglob("*.json"))) == 1
    # another CFG scale or temperature reads the same profile; greedy decoding (another kind of
    # acceptance) does not
    other = replace(settings, sampling=replace(settings.sampling, cfg_scale=4.5, temperature=0.8))
    assert acceptance_profile(toy, other, plans) == profile
    assert len(list(tmp_path.rglob("*.json"))) == 1
    acceptance_profile(
        toy, replace(settings, sampling=replace(settings.sampling, greedy=True)), plans
    )
    assert len(list(tmp_path.rglob("*.json"))) == 2


def test_measured_cost_is_cached_per_model_and_device(tmp_path, monkeypatch):
    """On a paced clock (20 ms an iteration): how fast the machine runs cannot cut the measured
    grid."""
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    clock = PacedClock()
    clock.pace(monkeypatch, lambda decoder: 20e-3)
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    settings = method_settings("sjd", 16, toy.default_sampling, auto=True)
    cost = pass_cost(toy, settings, clock=clock)
    assert (
        cost.tokens[0] == 1
        and all(t > 0 for t in cost.seconds)
        and cost.source.startswith("measured on cpu")
    )
    assert len(cost.engine) == len(cost.tokens)
    # read back, not remeasured
    assert list(tmp_path.rglob("*.json")) and pass_cost(toy, settings) == cost
    assert load_cached({"not": "a key"}) is None
    # the report's
    fixed = pass_cost(
        toy, replace(settings, window=replace(settings.window, auto=False)), clock=clock
    )
    assert fixed.tokens == (1, 8, 16) and len(list(tmp_path.rglob("*.json"))) == 2


def test_measuring_stops_past_the_widest_window_auto_allocates():
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    cost = measure_cost(toy, method_settings("sjd", 128, toy.default_sampling), iterations=2)
    # nothing past the first beyond
    assert all(cost.relative(k) <= auto.MOST_FACTOR for k in cost.tokens[:-1])
    # (where round one stopped depends on this toy's sub-millisecond noise)
    assert len(cost.tokens) >= 2
    assert list(cost.seconds) == sorted(cost.seconds)  # a wider pass never measures cheaper


def test_a_slow_stretch_does_not_cut_the_measured_grid(monkeypatch):
    """Round one stops at the first window costing more than MOST_FACTOR x t(1), but only once t(1)
    and that window timed again agree: here window 4's first timing falls in a stretch where
    everything is 5x slower."""
    clock, slow = PacedClock(), {"left": 5}  # one timing of window 4: 2 warm-up + 3 timed

    def seconds(decoder):  # 20 ms + 2 ms per token scored: t(24) = 3.1 t(1)
        stretch = decoder.width == 4 and slow["left"] > 0
        slow["left"] -= stretch
        return (20e-3 + 2e-3 * decoder.width) * (5 if stretch else 1)

    clock.pace(monkeypatch, seconds)
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    cost = measure_cost(
        toy, method_settings("sjd", 32, toy.default_sampling), iterations=9, clock=clock
    )
    # timed past 4, up to the first window beyond 3 x t(1)
    assert slow["left"] == 0 and cost.tokens[-1] == 24
    # 52 / 22 and 28 / 22 paced
    assert 2 < cost.relative(16) < auto.MOST_FACTOR and cost.relative(4) < 2


def test_auto_never_picks_a_window_past_the_measured_cost():
    flat = PassCost((1, 2, 4), (1.0, 1.2, 1.21), "a grid cut short at 4 tokens")
    assert flat.relative(128) < auto.MOST_FACTOR  # the line past 4 would price 128 cheap
    assert auto.most_tokens(flat, 128) == 4
    # RISING ends at 16
    assert auto.most_tokens(RISING, 64) == RISING.largest_within(auto.MOST_FACTOR, 16)


def test_a_noisy_measurement_is_fitted_non_decreasing():
    # a median below its neighbour (t(24) < t(16), as this CPU once measured) pools with it
    assert monotone([1.0, 2.0, 2.6, 2.2, 3.0]) == pytest.approx([1.0, 2.0, 2.4, 2.4, 3.0])
    assert monotone([3.0, 2.0, 1.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert monotone([1.0, 1.0, 2.0]) == [1.0, 1.0, 2.0]


def test_the_profile_is_fitted_non_decreasing_in_the_window_per_tree():
    tree = TreeSettings(width=6, branch=4)
    plans = (auto.Plan(48), auto.Plan(32), auto.Plan(16), auto.Plan(32, tree), auto.Plan(16, tree))
    fitted = auto.Profile(plans, (4.27, 4.49, 3.2, 3.0, 3.5), "four seeds").fitted()
    # chains and trees apart
    assert fitted.committed == pytest.approx((4.38, 4.38, 3.2, 3.25, 3.25))
    assert fitted.source == "four seeds"


@pytest.mark.parametrize("tree", [TreeSettings(), TreeSettings(width=3)])
def test_greedy_auto_returns_the_ar_tokens(tree, monkeypatch):
    monkeypatch.setattr(auto, "EVERY", 1)
    # follow this decode's acceptance at once, so the plan changes
    monkeypatch.setattr(auto, "PRIOR", 0.5)
    # and keep the plan that only wins far above the profile
    monkeypatch.setattr(auto, "G_RANGE", (0.5, 20.0))
    toy = ToyGridAdapter(height=6, width=6, levels=8)
    sampling = SamplingSettings(greedy=True, cfg_scale=2.0)
    ar = decode(
        toy, [0, 1], DecodeSettings(window=WindowSettings(1), sampling=sampling, batch_size=2)
    )
    drafter = DrafterSettings(vp=VPSettings())
    # the profile undersells the wide plan: the greedy toy's drafts win far more, and the chooser
    # moves to it
    # where the narrow plan wins at the profile's acceptance (a tree's costs more)
    wide = 1.6 if tree.on else 1.3
    profile = auto.Profile((auto.Plan(12, tree), auto.Plan(4, tree)), (wide, 1.1), "synthetic")
    out = decode(
        toy,
        [0, 1],
        DecodeSettings(
            window=WindowSettings(16, tree=tree, auto=True),
            drafter=drafter,
            sampling=sampling,
            batch_size=2,
        ),
        cost=PassCost((1, 16), (1.0, 2.0), "synthetic"),
        profile=profile,
    )
    assert torch.equal(out.tokens, ar.tokens)
    assert set(out.stats.auto_plans) == {"4" + "+3x1/0" * tree.on, "12" + "+3x1/0" * tree.on}


@pytest.mark.parametrize("tree", auto.TREES[1:], ids=lambda t: f"{t.width}x{t.depth}/{t.branch}")
def test_greedy_auto_switching_to_a_capped_tree_returns_the_ar_tokens(tree, monkeypatch):
    """auto.TREES' longer and wider trees beside a chain, the plan switching as the toy's greedy
    drafts outrun the profile: AR's tokens."""
    monkeypatch.setattr(auto, "EVERY", 1)
    monkeypatch.setattr(auto, "PRIOR", 0.5)
    monkeypatch.setattr(auto, "G_RANGE", (0.5, 20.0))
    toy = ToyGridAdapter(height=8, width=8, levels=8)
    sampling = SamplingSettings(greedy=True, cfg_scale=2.0)
    ar = decode(
        toy, [0, 1], DecodeSettings(window=WindowSettings(1), sampling=sampling, batch_size=2)
    )
    profile = auto.Profile((auto.Plan(16, tree), auto.Plan(4)), (1.9, 1.1), "synthetic")
    out = decode(
        toy,
        [0, 1],
        DecodeSettings(
            window=WindowSettings(16, auto=True, auto_tree=True),
            drafter=DrafterSettings(vp=VPSettings()),
            sampling=sampling,
            batch_size=2,
        ),
        cost=PassCost((1, 16, 128), (1.0, 2.0, 6.0), "synthetic"),
        profile=profile,
    )
    assert torch.equal(out.tokens, ar.tokens)
    assert set(out.stats.auto_plans) == {"4", f"16+{tree.width}x1/{tree.branch}"}


def test_each_iteration_works_on_its_own_plans_slots(monkeypatch):
    """The window's state follows the plan (narrowed or widened when auto switches), so an
    iteration's engine step costs what the calibration timed for that plan, not the widest
    plan's."""
    monkeypatch.setattr(auto, "EVERY", 1)
    monkeypatch.setattr(auto, "PRIOR", 0.5)
    monkeypatch.setattr(auto, "G_RANGE", (0.5, 20.0))
    chosen, drafted = [], []
    choose, redraft = auto.PlanChooser.choose, Drafter.redraft
    monkeypatch.setattr(
        auto.PlanChooser, "choose", lambda self, it: chosen.append(choose(self, it)) or chosen[-1]
    )

    def recorded(self, window, *args):
        after = redraft(self, window, *args)
        drafted.append((window.slots, after.slots))
        return after

    monkeypatch.setattr(Drafter, "redraft", recorded)
    toy = ToyGridAdapter(height=6, width=6, levels=8)
    profile = auto.Profile((auto.Plan(12), auto.Plan(4)), (1.3, 1.1), "synthetic")
    out = decode(
        toy,
        [0, 1],
        DecodeSettings(
            window=WindowSettings(16, auto=True),
            batch_size=2,
            seed=1,
            drafter=DrafterSettings(vp=VPSettings()),  # auto strength: candidates too
            sampling=SamplingSettings(greedy=True, cfg_scale=2.0),
        ),
        cost=PassCost((1, 16), (1.0, 2.0), "synthetic"),
        profile=profile,
    )
    assert set(out.stats.auto_plans) == {"4", "12"} and out.stats.window == 12
    assert drafted == [(p.window - 1, p.window - 1) for p in chosen]


def test_the_same_cost_and_seed_give_the_same_image():
    toy = ToyGridAdapter(height=6, width=6, levels=8)
    s = DecodeSettings(
        window=WindowSettings(16, auto=True),
        drafter=DrafterSettings(vp=VPSettings()),
        sampling=SamplingSettings(cfg_scale=2.0),
        seed=3,
    )
    a, b = decode(toy, 1, s, cost=RISING), decode(toy, 1, s, cost=RISING)
    assert torch.equal(a.tokens, b.tokens) and a.stats.scored_per_iter == b.stats.scored_per_iter
    assert a.stats.pass_cost == RISING and a.stats.estimated_speedup() > 0


def test_window_auto_is_checked():
    with pytest.raises(ValueError, match="window_auto"):
        WindowSettings(8, auto="yes")


def test_a_calibration_reports_progress_and_an_abort_caches_nothing(tmp_path, monkeypatch):
    """The first automatic run measures the device before its first token; progress says how far it
    got (the node's bar and text, the command line's line), and raising from it (ComfyUI's
    interrupt) stops the measurement without caching a partial one."""
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    settings = method_settings("sjd", 16, toy.default_sampling, auto=True)
    seen = []

    class Stop(Exception):
        pass

    def stop_in_profile(what, done, total):
        seen.append((what, done, total))
        if what == "acceptance profile" and done > total // 2:
            raise Stop

    with pytest.raises(Stop):
        calibration(toy, settings, progress=stop_in_profile)
    assert len(list(tmp_path.rglob("*.json"))) == 1  # the pass cost, not the profile
    for what in ("pass cost", "acceptance profile"):
        steps = [(done, total) for w, done, total in seen if w == what]
        assert (
            steps
            and all(0 <= d <= t for d, t in steps)
            and [d for d, _ in steps] == sorted(d for d, _ in steps)
        )
    seen.clear()
    cost, profile = calibration(toy, settings, progress=lambda *a: seen.append(a))
    assert {w for w, _, _ in seen} == {"acceptance profile"}  # the cost was read back
    assert (
        seen[-1][1] == seen[-1][2]
        and profile is not None
        and len(list(tmp_path.rglob("*.json"))) == 2
    )
    fixed = method_settings("sjd", 16, toy.default_sampling)
    assert calibration(toy, fixed, cost) == (cost, None)  # a fixed window: the cost alone


def test_a_cached_cost_far_from_the_decodes_passes_is_measured_again(tmp_path, monkeypatch, caplog):
    """A pass cost measured while the device was busy (here: 10 s a pass, as no toy pass takes)
    would price every later automatic run; the first decode whose passes stray from it by more
    than DRIFT forgets it, and says so."""
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    settings = method_settings("sjd", 16, toy.default_sampling, auto=True)
    key = cost_key(toy, settings)
    busy = PassCost((1, 4, 16), (10.0, 12.0, 20.0), "measured on cpu")
    save_cached(key, busy)
    with caplog.at_level("WARNING"):
        result = decode(toy, 0, settings)
    assert result.stats.pass_cost is not None and result.stats.pass_cost == busy
    assert result.stats.pass_cost_drift < 1 / DRIFT and "pass_cost_drift" in result.stats.summary()
    assert (
        load_cached(key, PassCost) is None
        and "measured again on the next automatic run" in caplog.text
    )
    assert pass_cost(toy, settings) != busy  # the next run measures it


def test_only_the_cached_cost_is_forgotten_and_only_past_the_drift(tmp_path, monkeypatch):
    """The drift is the median of iteration time over t(k) at the k scored: one slow first iteration
    (a compile) moves it not; a cost the caller brought (a roofline) is never the cached one's to
    forget."""
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    settings = method_settings("sjd", 16, toy.default_sampling, auto=True)
    key, cost = cost_key(toy, settings), PassCost((1, 8), (1.0, 2.0), "measured on cpu")

    def stats(ratio: float, cost: PassCost = cost) -> DecodeStats:
        ks = [8] * 9 + [1] * 3
        return DecodeStats(
            length=64,
            window=8,
            pass_cost=cost,
            scored_per_iter=ks,
            iteration_seconds=[30.0] + [ratio * cost(k) for k in ks[1:]],
        )

    assert stats(1.5).pass_cost_drift == pytest.approx(1.5)
    # too few to say
    assert (
        DecodeStats(
            length=64,
            window=8,
            pass_cost=cost,
            scored_per_iter=[1] * 3,
            iteration_seconds=[1.0] * 3,
        ).pass_cost_drift
        is None
    )
    for ratio, forgotten in (
        (1.5, False),
        (0.6, False),
        (DRIFT * 1.5, True),
        (1 / DRIFT / 1.5, True),
    ):
        save_cached(key, cost)
        assert forget_stale_cost(toy, settings, cost, stats(ratio)) == forgotten
        assert (load_cached(key, PassCost) is None) == forgotten
    save_cached(key, cost)
    roofline_cost = PassCost((1, 8), (0.5, 0.6), "roofline: somewhere")
    assert not forget_stale_cost(toy, settings, roofline_cost, stats(10.0, roofline_cost))
    assert load_cached(key, PassCost) == cost


def test_the_memory_estimate_holds_the_largest_tree_auto_may_pick():
    """With a tree of the user's and the automatic tree, auto weighs TREES beside it
    (candidate_plans): the memory estimate sizes the scratch for the largest of them all, not the
    user's alone."""
    from sjdvp_core.engine.budget import widest_tree
    from sjdvp_core.engine.tree import scratch_nodes

    small = TreeSettings(width=2)
    both = DecodeSettings(window=WindowSettings(32, auto=True, auto_tree=True, tree=small))
    biggest = max(scratch_nodes(32, t) for t in auto.TREES)
    assert scratch_nodes(32, widest_tree(both)) == biggest > scratch_nodes(32, small)
    assert widest_tree(replace(both, window=replace(both.window, auto_tree=False))) == small
    plans = auto.candidate_plans(PassCost((1, 64), (1.0, 1.0), "flat"), 32, small, auto_tree=True)
    # what auto may really pick
    assert max(scratch_nodes(p.window, p.tree) for p in plans) == biggest
