"""The automatic window and the pass cost it chooses by (engine/auto.py, engine/cost.py)."""
import json

import pytest
import torch

from sjdvp_core import DecodeSettings, DrafterSettings, SamplingSettings, VPSettings, WindowSettings, decode
from sjdvp_core.engine import auto
from sjdvp_core.engine.cost import DEVICES, SHAPES, PassCost, load_cached, roofline
from sjdvp_core.engine.decode import measure_cost, pass_cost
from sjdvp_core.engine.settings import TreeSettings, method_settings
from sjdvp_core.models.toy import ToyGridAdapter

RISING = PassCost((1, 2, 4, 8, 16), (1.0, 1.2, 1.5, 2.2, 3.8), "synthetic: a CPU-like curve")


def test_pass_cost_interpolates_and_extrapolates():
    assert RISING(3) == pytest.approx(1.35) and RISING(32) == pytest.approx(3.8 + 1.6 * 2)
    assert RISING.relative(4) == 1.5 and RISING.largest_within(2.0, 64) == 6
    with pytest.raises(ValueError, match="start at 1"):
        PassCost((2, 4), (1.0, 2.0), "x")
    assert PassCost.from_json(json.loads(json.dumps(RISING.to_json()))) == RISING


def test_roofline_knees_follow_the_devices():
    """A 7B pass is flat up to the knee (weights read once), then grows with FLOPs: later on an H200 than on a
    4090, where the same pass crosses into compute sooner."""
    h200, rtx = roofline("Lumina-mGPT 7B", "H200"), roofline("Lumina-mGPT 7B", "RTX 4090")
    assert h200.relative(32) < 1.02 and rtx.relative(32) < 1.02
    assert 1.0 < h200.relative(128) < rtx.relative(128)
    assert roofline("LlamaGen-XL", "H200").relative(128) > h200.relative(128)   # a small model is sooner compute-bound
    assert all(d.source and d.bandwidth > 0 and d.flops > 0 for d in DEVICES.values())
    assert set(SHAPES) == {"Lumina-mGPT 7B", "Janus-Pro-7B", "LlamaGen-XL"}


def test_the_ladder_skips_windows_that_cost_the_same():
    flat = PassCost((1, 64, 128), (1.0, 1.0, 1.5), "GPU-like: flat to 64")
    assert auto.WindowChooser(flat, 128).ladder == [128, 64]          # below the knee, wider only wins
    assert auto.WindowChooser(RISING, 16).ladder == [16, 8, 4, 2]
    assert auto.most_tokens(RISING, 64) == 12 and auto.most_tokens(RISING, 1) == 1


def test_the_chooser_steps_down_while_it_pays_then_keeps_the_best():
    chooser = auto.WindowChooser(RISING, 16)
    picks = []
    for it in range(1, 40):
        w = chooser.choose(it)
        picks.append(w)
        chooser.record(it, w, {16: 3.0, 8: 2.6, 4: 1.6, 2: 1.3}[w])   # tokens per pass each window commits
    # 16 (3.0 / 3.8) -> 8 (2.6 / 2.2, better) -> 4 (1.6 / 1.5, worse) -> back to 8 for good
    assert picks[:4] == [16] * 4 and 8 in picks and picks[-8:] == [8] * 8


def test_measured_cost_is_cached_per_model_and_device(tmp_path, monkeypatch):
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    settings = method_settings("sjd", 16, toy.default_sampling, auto=True)
    cost = pass_cost(toy, settings)
    assert cost.tokens[0] == 1 and all(t > 0 for t in cost.seconds) and cost.source.startswith("measured on cpu")
    assert len(cost.engine) == len(cost.tokens)
    assert list(tmp_path.rglob("*.json")) and pass_cost(toy, settings) == cost          # read back, not remeasured
    assert load_cached({"not": "a key"}) is None


def test_measuring_stops_past_the_widest_window_auto_allocates():
    toy = ToyGridAdapter(height=8, width=8, levels=4)
    cost = measure_cost(toy, method_settings("sjd", 128, toy.default_sampling), iterations=2)
    assert all(cost.relative(k) <= auto.MOST_FACTOR for k in cost.tokens[:-1])
    assert cost.tokens[-1] == 128 or cost.relative(cost.tokens[-1]) > auto.MOST_FACTOR


@pytest.mark.parametrize("tree", [TreeSettings(), TreeSettings(width=3)])
def test_greedy_auto_returns_the_ar_tokens(tree):
    toy = ToyGridAdapter(height=6, width=6, levels=8)
    sampling = SamplingSettings(greedy=True, cfg_scale=2.0)
    ar = decode(toy, [0, 1], DecodeSettings(window=WindowSettings(1), sampling=sampling, batch_size=2))
    drafter = DrafterSettings(vp=VPSettings())
    out = decode(toy, [0, 1], DecodeSettings(window=WindowSettings(16, tree=tree, auto=True), drafter=drafter,
                                             sampling=sampling, batch_size=2), cost=RISING)
    assert torch.equal(out.tokens, ar.tokens)
    assert len(set(out.stats.scored_per_iter)) > 1          # the window really changed along the way


def test_the_same_cost_and_seed_give_the_same_image():
    toy = ToyGridAdapter(height=6, width=6, levels=8)
    s = DecodeSettings(window=WindowSettings(16, auto=True), drafter=DrafterSettings(vp=VPSettings()),
                       sampling=SamplingSettings(cfg_scale=2.0), seed=3)
    a, b = decode(toy, 1, s, cost=RISING), decode(toy, 1, s, cost=RISING)
    assert torch.equal(a.tokens, b.tokens) and a.stats.scored_per_iter == b.stats.scored_per_iter
    assert a.stats.pass_cost == RISING and a.stats.estimated_speedup() > 0


def test_window_auto_is_checked():
    with pytest.raises(ValueError, match="window_auto"):
        WindowSettings(8, auto="yes")
