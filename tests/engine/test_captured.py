"""The model's pass recorded per shape and replayed (sjdvp_core/engine/captured.py), driven on the
CPU through tests/helpers/static_replay.py (the `replayed_on_cpu` fixture): when a shape is
recorded, what the report says, and the fallbacks: a recording that fails or a replay that
differs leaves the decode eager with its tokens and the reason said once; where nothing can be
recorded the reason is named. Every family's tokens through the recorded pass:
tests/models/test_family_contract.py."""

from __future__ import annotations

import logging
import re
from dataclasses import replace

import pytest
import torch

from benchmarks.toy import ToyGridAdapter
from sjdvp_core import decode, method_settings
from sjdvp_core.engine import captured
from sjdvp_core.engine.budget import decode_bytes
from sjdvp_core.engine.calibration import cost_key
from sjdvp_core.engine.report import report_text
from sjdvp_core.engine.settings import DecodeSettings, SamplingSettings
from sjdvp_core.models.loading import load_model
from tests.helpers.static_replay import StaticReplay

SAMPLED = SamplingSettings(cfg_scale=2.0, top_k=8)


def settings(passes: str = "auto", window: int = 4, **kw) -> DecodeSettings:
    return replace(
        method_settings("sjd-vp", window, SAMPLED, seed=1, batch_size=2, **kw), passes=passes
    )


def test_each_shape_is_recorded_at_its_second_pass_then_replayed(replayed_on_cpu):
    toy = ToyGridAdapter(height=6, width=6)
    res = decode(toy, [1, 2], settings())
    # one chain shape: its first pass and step eager, the second recorded (and checked), every later
    # one replayed (the passes counted include the prefill, which is not the window's)
    replays = re.fullmatch(
        r"captured: 1 shapes of the pass and 1 of the step recorded in \d+\.\d\d s, (\d+) replays",
        res.stats.passes,
    )
    assert replays and int(replays.group(1)) == 2 * (res.stats.forward_passes - 3)
    assert torch.equal(res.tokens, decode(toy, [1, 2], settings("eager")).tokens)


class FailsToRecord:
    def __init__(self, fn, args, pool, held=frozenset(), reset=None):
        raise RuntimeError("operation not permitted when stream is capturing\nmore detail")


class ReplaysOff(StaticReplay):
    def __call__(self, *inputs):
        return super().__call__(*inputs) + 1.0


@pytest.mark.parametrize(
    "recorder, reason",
    [
        (
            FailsToRecord,
            "eager: recording failed (RuntimeError: operation not permitted when stream is capturing)",
        ),
        (ReplaysOff, "eager: a replay's values differ from the eager run's by 1"),
    ],
)
def test_a_failed_recording_leaves_the_model_eager_with_its_tokens(
    replayed_on_cpu, caplog, recorder, reason
):
    """The pass that tried to record keeps its eager logits, so the tokens are eager's; the reason
    is logged once, reported, and remembered for the model: its next decode runs eagerly from the
    start, without a new warning."""
    replayed_on_cpu["cpu"] = recorder
    toy = ToyGridAdapter(height=6, width=6)
    eager = decode(toy, [1, 2], settings("eager"))
    with caplog.at_level(logging.WARNING, logger="sjdvp"):
        first = decode(toy, [1, 2], settings())
        again = decode(toy, [1, 2], settings())
    assert torch.equal(first.tokens, eager.tokens) and torch.equal(again.tokens, eager.tokens)
    assert first.stats.passes.startswith(reason) and again.stats.passes == first.stats.passes
    warned = [r.getMessage() for r in caplog.records if "CUDA graph" in r.getMessage()]
    assert len(warned) == 1 and "runs eagerly: the same tokens" in warned[0], warned
    assert f"model passes: {first.stats.passes}" in report_text(first, "SJD-VP")


class StepFailsToRecord(StaticReplay):
    def __init__(self, fn, args, pool, held=frozenset(), reset=lambda: None):
        if held:  # only the step writes in place
            raise RuntimeError("an op of the step reads the host")
        super().__init__(fn, args, pool, held, reset)


def test_a_step_that_fails_to_record_runs_eagerly_beside_recorded_passes(replayed_on_cpu, caplog):
    replayed_on_cpu["cpu"] = StepFailsToRecord
    toy = ToyGridAdapter(height=6, width=6)
    with caplog.at_level(logging.WARNING, logger="sjdvp"):
        res = decode(toy, [1, 2], settings())
    assert torch.equal(res.tokens, decode(toy, [1, 2], settings("eager")).tokens)
    kind = res.stats.passes
    assert re.fullmatch(
        r"captured: 1 shapes of the pass and 0 of the step recorded in .*; the step eager: recording "
        r"failed \(RuntimeError: an op of the step reads the host\)",
        kind,
    ), kind
    assert sum("engine's step is not replayed" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize("method", ["sjd", "sjd-vp", "lantern-vp"])
def test_recorded_steps_count_what_the_eager_steps_count(replayed_on_cpu, method):
    """A step writes the canvas and the statistics' and VP auto's accumulators in place: recording
    it (a warm-up run, a capture, a checking replay) must leave them as one eager step leaves
    them, so the report's figures are eager's."""
    toy = ToyGridAdapter(height=8, width=8)
    base = replace(method_settings(method, 6, SAMPLED, seed=2, batch_size=2), passes="eager")
    eager, recorded = (decode(toy, [1, 2], replace(base, passes=p)) for p in ("eager", "auto"))
    assert recorded.stats.passes.startswith("captured: 1 shapes of the pass and 1 of the step")
    assert torch.equal(recorded.tokens, eager.tokens)
    for figure in (
        "slot_verified",
        "slot_accepted",
        "rose_verified",
        "flat_accepted",
        "vp_drafts",
        "entropy_sum",
        "vp_auto",
    ):
        a, b = getattr(recorded.stats, figure), getattr(eager.stats, figure)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, figure


def test_where_passes_cannot_be_recorded_the_reason_is_named(replayed_on_cpu, monkeypatch):
    toy = ToyGridAdapter(height=6, width=6)
    assert captured.eager_reason(toy, "eager") == "eager, as asked"
    assert (
        captured.eager_reason(toy, "auto") is None and captured.pass_kind(toy, "auto") == "captured"
    )
    toy.device_map = {"": "cpu"}
    assert "device map" in captured.eager_reason(toy, "captured")
    del toy.device_map
    quantised = type("Linear4bit", (torch.nn.Module,), {"__module__": "bitsandbytes.nn.modules"})
    toy.module = torch.nn.Sequential(quantised())
    # auto leaves bitsandbytes' kernels eager
    assert "bitsandbytes" in captured.eager_reason(toy, "auto")
    assert captured.eager_reason(toy, "captured") is None  # captured tries them
    monkeypatch.delitem(captured.GRAPHS, "cpu")
    assert captured.eager_reason(toy, "captured") == "eager: no CUDA graphs on the CPU"
    assert (
        decode(ToyGridAdapter(height=6, width=6), [1, 2], settings()).stats.passes
        == "eager: no CUDA graphs on the CPU"
    )
    with pytest.raises(
        ValueError, match=r"passes='fast' is out of range: passes must be one of \['auto', "
    ):
        settings("fast")


def test_a_pass_cost_is_measured_for_the_pass_that_will_run(replayed_on_cpu, monkeypatch):
    """The automatic window chooses by t(k) of the pass the decode will use: recorded and eager are
    measured and cached apart."""
    toy = ToyGridAdapter(height=6, width=6)
    recorded, eager = cost_key(toy, settings()), cost_key(toy, settings("eager"))
    assert recorded["passes"] == "captured" and eager["passes"] == "eager"
    monkeypatch.delitem(captured.GRAPHS, "cpu")
    assert cost_key(toy, settings())["passes"] == "eager"


def test_recorded_passes_are_counted_in_the_memory_estimate(replayed_on_cpu):
    """While graphs live they hold a pass's transients in their pool and each shape's logits: the
    estimate adds them where the passes are recorded, for every plan an automatic window may run."""
    demo = load_model("demo")
    fixed = method_settings("sjd-vp", 16, demo.default_sampling)
    auto = method_settings("sjd-vp", 64, demo.default_sampling, auto=True, auto_tree=True)
    extra = {
        name: decode_bytes(demo, s) - decode_bytes(demo, replace(s, passes="eager"))
        for name, s in (("fixed", fixed), ("auto", auto))
    }
    logits = 2 * 16 * demo.config.vocab_size * 4  # CFG's two rows, fp32
    assert extra["fixed"] >= logits and extra["auto"] > extra["fixed"]
