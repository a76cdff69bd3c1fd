"""A model placed by a device map (models.placement): blocks offloaded to disk stream their weights
in for every pass (the CPU stand-in for CPU-memory offload on a GPU machine), and the decode is
unchanged: the same tokens, greedy or sampled, in the same number of passes (step compression
unchanged), chain and tree, for our GPT (the demo) and a transformers family (Lumina-mGPT); bad
placements say what to do."""

from __future__ import annotations

import sys

import pytest
import torch

from sjdvp_core import SamplingSettings, decode
from sjdvp_core.engine.auto import Profile
from sjdvp_core.engine.calibration import (
    auto_plans,
    cost_key,
    load_cached,
    profile_key,
    save_cached,
)
from sjdvp_core.engine.cost import PassCost
from sjdvp_core.engine.settings import TreeSettings, method_settings
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.placement import device_map, offload_map, place
from tests.helpers.tiny_lumina import write_lumina

MODELS = {
    "demo": lambda d: ("demo", {}, ["a red circle on grass", "a blue square on snow"]),
    "lumina": lambda d: (
        write_lumina(str(d / "Lumina-mGPT-tiny-64")),
        dict(width=64, height=32),
        ["a red fox in the snow", "a blue sky"],
    ),
}
SAMPLINGS = (
    SamplingSettings(cfg_scale=3.0, greedy=True, temperature=0.0),
    SamplingSettings(cfg_scale=3.0),
)


@pytest.mark.parametrize("family", MODELS)
def test_offloaded_blocks_stream_per_pass_and_the_decode_is_unchanged(family, tmp_path):
    path, options, prompts = MODELS[family](tmp_path)
    whole = load_model(path, precision="fp32", **options)
    placed = load_model(path, precision="fp32", **options)
    mapping = place(
        placed, offload_map(placed, [0, 1], "disk"), torch.device("cpu"), str(tmp_path / "offload")
    )
    assert sum(device == "disk" for device in mapping.values()) == 2
    streamed = placed.blocks()[1]
    assert all(p.is_meta for p in streamed.parameters())  # its weights are on disk between passes
    calls = []
    streamed.register_forward_pre_hook(lambda *_: calls.append(1))
    for sampling in SAMPLINGS:
        for s in (
            method_settings("ar", 1, sampling, batch_size=2, seed=3),
            method_settings("sjd-vp", 8, sampling, batch_size=2, seed=3),
            method_settings(
                "sjd", 4, sampling, batch_size=2, seed=3, tree=TreeSettings(width=3, depth=2)
            ),
        ):
            calls.clear()
            ref, res = decode(whole, prompts, s), decode(placed, prompts, s)
            assert torch.equal(res.tokens, ref.tokens), (family, s)
            assert res.stats.forward_passes == ref.stats.forward_passes
            assert len(calls) == res.stats.forward_passes  # once per pass (the prefill counted)
    assert torch.equal(placed.decode_image(res.codes), whole.decode_image(ref.codes))


def test_a_device_map_given_to_the_loader_places_the_model(tmp_path):
    mapping = offload_map(load_model("demo"), [2], "disk")
    adapter = load_model("demo", placement=mapping, offload_dir=str(tmp_path))
    assert adapter.device_map == mapping and all(
        p.is_meta for p in adapter.blocks()[2].parameters()
    )
    with pytest.raises(ValueError, match="offload_dir"):
        load_model("demo", placement=mapping)


def test_the_automatic_window_runs_on_an_offloaded_model(tmp_path, monkeypatch):
    """The calibration's cache keys read a few weight values only where the module holds them (an
    offloaded block's are on the meta device between passes) and key the pass cost by where the
    weights sit; an automatic decode reads what is cached under them, and its image is the whole
    model's with the same cost and profile."""
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path / "cache"))
    whole, placed = load_model("demo", precision="fp32"), load_model("demo", precision="fp32")
    place(
        placed, offload_map(placed, [0, 1], "disk"), torch.device("cpu"), str(tmp_path / "offload")
    )
    settings = method_settings("sjd-vp", 16, SamplingSettings(cfg_scale=3.0), seed=3, auto=True)
    key, whole_key = cost_key(placed, settings), cost_key(whole, settings)
    assert {k for k in key if key[k] != whole_key[k]} == {"weights", "placement"} and "meta" in key[
        "placement"
    ]
    cost = PassCost((1, 4, 8, 16), (1.0, 1.05, 1.1, 1.3), "measured on cpu")
    plans = auto_plans(placed, settings, cost)
    profile = Profile(
        tuple(plans), tuple(1.0 + i / 4 for i in range(len(plans))), "written by the test"
    )
    save_cached(key, cost)
    save_cached(profile_key(placed, settings, plans), profile)
    res = decode(placed, "a red circle on grass", settings)
    assert (
        res.stats.pass_cost == cost
        and load_cached(profile_key(placed, settings, plans), Profile) == profile
    )
    assert torch.equal(
        res.tokens,
        decode(whole, "a red circle on grass", settings, cost=cost, profile=profile).tokens,
    )


def test_int8_blocks_offload_and_nf4_ones_are_refused(tmp_path):
    """Our int8 layers' weights and scales are parameters, so an offloaded block streams them (as
    buffers they stayed on the compute device, offloading nothing); bitsandbytes' NF4 layers
    cannot be offloaded, and say so."""
    s = method_settings("sjd-vp", 8, SamplingSettings(cfg_scale=3.0), seed=3)
    whole, placed = load_model("demo", precision="int8"), load_model("demo", precision="int8")
    place(placed, offload_map(placed, [0, 1], "disk"), torch.device("cpu"), str(tmp_path / "int8"))
    streamed = placed.blocks()[1]
    assert all(t.is_meta for t in (*streamed.parameters(), *streamed.buffers()))
    prompt = "a red circle on grass"
    assert torch.equal(decode(placed, prompt, s).tokens, decode(whole, prompt, s).tokens)
    nf4 = load_model("demo", precision="nf4")
    with pytest.raises(
        ValueError, match="NF4 .* cannot be offloaded: to offload the model, load it in int8"
    ):
        place(nf4, offload_map(nf4, [1], "disk"), torch.device("cpu"), str(tmp_path / "nf4"))


def test_offload_that_would_spill_to_disk_says_what_to_do():
    """The offload placement fills the GPU, then CPU memory; a model that fits neither would need
    disk, which the loader node cannot name a folder for: refused with what to do (memory given,
    so no GPU is needed)."""
    demo, gpu = load_model("demo"), torch.device("cuda:0")
    assert set(
        device_map(demo, "offload", gpu, 0, memory={0: 4 * 2**20, "cpu": 2**40}).values()
    ) == {0, "cpu"}
    with pytest.raises(
        ValueError, match="does not fit cuda:0 and CPU memory together: load it in int8"
    ):
        device_map(demo, "offload", gpu, 0, memory={0: 4 * 2**20, "cpu": 2 * 2**20})


def test_bad_placements_say_what_to_do(monkeypatch):
    with pytest.raises(ValueError, match="CUDA devices"):
        load_model("demo", placement="offload")
    with pytest.raises(ValueError, match="must be one of"):
        load_model("demo", placement="sideways")
    with pytest.raises(ValueError, match="does not have"):
        load_model("demo", placement={"gpt.nothing": "disk"}, offload_dir="/tmp")
    monkeypatch.setitem(sys.modules, "accelerate", None)
    with pytest.raises(ImportError, match="pip install accelerate"):
        load_model("demo", placement="split")


def test_modeled_offload_speed_up_is_at_least_the_same_cards_without_it():
    """benchmarks.offload: the link term is the same for every window, so a wide pass costs
    relatively less under offload and the modeled speed-up never falls below the same card's
    without offload."""
    from benchmarks.offload import table

    rows = [line.split(" | ") for line in table().splitlines()[2:]]
    assert len(rows) == 10
    for row in rows:
        offloaded, without = float(row[-2].rstrip("x")), float(row[-1].rstrip(" |x"))
        assert offloaded >= without - 0.005, row
