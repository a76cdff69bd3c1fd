"""The engine's step through torch.compile (engine/compiled.py): the same decodes as the eager step,
one compilation reused by later decodes, and the eager step, with one warning, where compiling
fails."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import replace

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from sjdvp_core import decode
from sjdvp_core.engine import compiled as compiled_module
from sjdvp_core.engine.settings import (
    DrafterSettings,
    SamplingSettings,
    TreeSettings,
    method_settings,
)
from sjdvp_core.models.loading import load_model

PROMPTS = ["a red circle on grass", "a blue square on snow"]


@pytest.fixture(scope="module")
def demo():
    return load_model("demo")


def tokens(adapter, settings, prompts=PROMPTS):
    result = decode(adapter, prompts, replace(settings, batch_size=len(prompts)))
    return result.tokens, result.stats.forward_passes


@pytest.mark.parametrize(
    "method,drafter",
    [
        ("sjd-vp", {}),  # coupled, VP auto: the default
        ("sjd", {"coupled": False, "continuation": True}),  # sampled re-drafts, continuation
        ("lantern", {"coupled": False}),
    ],
)
def test_the_compiled_step_makes_the_eager_steps_decode(demo, method, drafter):
    settings = method_settings(method, 12, demo.default_sampling, seed=3)
    settings = replace(settings, drafter=replace(settings.drafter, **drafter))
    eager, passes = tokens(demo, settings)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    fast, fast_passes = tokens(demo, replace(settings, compile=True))
    assert (
        torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs
        and not compiled_module._FAILED
    )
    assert passes == fast_passes and torch.equal(eager, fast)


def test_a_chains_whole_step_is_one_graph_timed_as_one(demo):
    """Verification and drafting compile together (what CUDA can capture and replay as one graph): a
    decode at a window no other test compiles adds exactly one graph, without a break, and its
    time is the step's."""
    torch._dynamo.reset()  # nothing compiled before: this decode's shape is the first
    settings = method_settings("sjd-vp", 10, demo.default_sampling, seed=0, compile=True)
    graphs, breaks = (torch._dynamo.utils.counters[k].copy() for k in ("stats", "graph_break"))
    stats = decode(demo, PROMPTS[0], settings, timing=True).stats
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs["unique_graphs"] + 1
    assert torch._dynamo.utils.counters["graph_break"] == breaks
    assert stats.time_step > 0 and stats.time_verify == stats.time_draft == 0


def test_windows_after_the_second_reuse_its_graph(demo):
    """The first window compiles a graph for its shape, the second one for any window size (torch's
    automatic dynamic shapes), which later windows reuse: an automatic window's calibration,
    which times a dozen windows, compiles twice rather than once per window."""
    torch._dynamo.reset()
    added = []
    for window in (5, 7, 9, 13):
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        decode(
            demo,
            PROMPTS[0],
            method_settings("sjd-vp", window, demo.default_sampling, seed=0, compile=True),
        )
        added.append(torch._dynamo.utils.counters["stats"]["unique_graphs"] - graphs)
    assert added == [1, 1, 0, 0] and not compiled_module._FAILED


def host_reads(adapter, settings) -> int:
    """Values a decode reads back from the device (on a GPU each one waits for it)."""
    with profile(activities=[ProfilerActivity.CPU]) as trace:
        decode(adapter, PROMPTS[0], settings)
    return sum(e.name == "aten::_local_scalar_dense" for e in trace.events())


@pytest.mark.parametrize("method,window", [("sjd-vp", 8), ("ar", 1)])
def test_the_compiled_step_reads_nothing_back(demo, method, window):
    """Calling the compiled step, guards included, reads no value back: as many reads as the eager
    decode (a guard on a 0-d float input reads its value at every call)."""
    settings = method_settings(method, window, demo.default_sampling, seed=0)
    decode(demo, PROMPTS[0], replace(settings, compile=True))  # compiled before it is counted
    assert host_reads(demo, replace(settings, compile=True)) == host_reads(demo, settings)


def test_a_compiled_step_is_reused_by_later_decodes(demo):
    settings = method_settings("sjd", 8, demo.default_sampling, seed=0, compile=True)
    tokens(demo, settings)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    tokens(demo, replace(settings, seed=1), ["a green diamond on sand", "a red circle on grass"])
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_where_compiling_fails_the_step_runs_eagerly_with_one_warning(demo, monkeypatch, caplog):
    def broken(fn, **kwargs):
        def raise_(*args):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler found")

        return raise_

    monkeypatch.setattr(compiled_module, "_FAILED", set())
    monkeypatch.setattr(torch, "compile", broken)
    settings = replace(
        method_settings("sjd", 8, demo.default_sampling, seed=5),
        drafter=DrafterSettings(coupled=False),
    )
    eager, _ = tokens(demo, settings)
    with caplog.at_level(logging.WARNING, logger="sjdvp"):
        fast, _ = tokens(demo, replace(settings, compile=True))
        tokens(demo, replace(settings, compile=True))
    assert torch.equal(eager, fast)
    warnings = [r.getMessage() for r in caplog.records if "does not compile" in r.getMessage()]
    # once, for the one function a chain runs (its whole step); no retry in the second decode
    assert len(warnings) == 1 and "no C++ compiler found" in warnings[0] and "step" in warnings[0]


class Replays:
    """torch.compile as CUDA graphs behave (mode "reduce-overhead"), on the CPU: the function runs
    eagerly, and the next call of a compiled function overwrites what the previous calls returned
    (filled with NaN, out-of-range ids, flipped flags), as a replay reuses its graph's memory
    pool. An output that is one of its call's inputs is not in the pool and stays."""

    def __init__(self):
        self.pool: list[torch.Tensor] = []

    def __call__(self, fn, **kwargs):
        def replay(*args):
            for t in self.pool:
                if t.is_floating_point():
                    t.fill_(float("nan"))
                elif t.dtype == torch.bool:
                    t.logical_not_()
                else:
                    t.fill_(torch.iinfo(t.dtype).min)
            out = fn(*args)
            inputs = {t.untyped_storage().data_ptr() for t in _tensors(args)}
            self.pool = [t for t in _tensors(out) if t.untyped_storage().data_ptr() not in inputs]
            return out

        return replay


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if dataclasses.is_dataclass(x):
        return [t for f in dataclasses.fields(x) for t in _tensors(getattr(x, f.name))]
    return []


@pytest.mark.parametrize(
    "tree", [TreeSettings(), TreeSettings(width=6, branch=4)], ids=["chain", "tree"]
)
def test_under_cuda_graphs_the_loop_keeps_only_copies_of_a_steps_outputs(demo, monkeypatch, tree):
    """With a mode that captures CUDA graphs, whose next replay overwrites a step's outputs
    (Replays), every output is copied as it is returned: the same tokens as the eager step, chain
    and tree (the tree's re-draft is compiled on its own). Without the copies the next step would
    read its window after it was overwritten."""
    settings = method_settings("sjd-vp", 16, demo.default_sampling, seed=3, tree=tree)
    eager, _ = tokens(demo, settings)
    monkeypatch.setattr(torch, "compile", Replays())
    for mode, same in (("reduce-overhead", True), ("default", False)):
        monkeypatch.setenv("SJDVP_COMPILE_MODE", mode)
        monkeypatch.setattr(compiled_module, "_FAILED", set())
        try:
            fast, _ = tokens(demo, replace(settings, compile=True))
        except (RuntimeError, IndexError):  # an overwritten id out of range
            fast = None
        assert (fast is not None and torch.equal(eager, fast)) == same, mode


def test_compile_is_validated():
    with pytest.raises(ValueError, match="compile"):
        replace(method_settings("sjd", 8, SamplingSettings()), compile="yes")


def test_more_windows_than_torchs_default_recompile_limit_stay_compiled(caplog):
    """An automatic window's calibration times a dozen windows, each its own shape (torch's default
    limit is 8 graphs per function, past which fullgraph compilation fails)."""
    from benchmarks.toy import ToyGridAdapter

    toy = ToyGridAdapter(height=8, width=8, levels=8)
    with caplog.at_level(logging.WARNING, logger="sjdvp"):
        for window in (2, 3, 4, 6, 8, 12, 16, 24, 32, 48):
            decode(
                toy, 0, method_settings("sjd", window, toy.default_sampling, seed=0, compile=True)
            )
    assert not compiled_module._FAILED and "does not compile" not in caplog.text


def test_the_step_writes_only_into_tensors_held_in_place(demo, monkeypatch):
    """CUDA graphs capture a step that writes into its inputs only where those keep their address
    (inductor's static inputs; it skips the capture otherwise, "mutated inputs"). The same check
    on the CPU: every input the compiled step mutates is one `hold_in_place` marked (canvas,
    statistics, VP auto's scores)."""
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def inspect(gm, example_inputs):
        def forward(gm, inputs):
            meta = torch._guards.TracingContext.get().fw_metadata
            graphs.append(
                (
                    {i for i, info in enumerate(meta.input_info) if info.mutates_data},
                    set(meta.static_input_indices),
                )
            )
            return gm

        return aot_autograd(fw_compiler=forward)(gm, example_inputs)

    real = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda fn, **kwargs: real(fn, backend=inspect, fullgraph=True)
    )
    monkeypatch.setattr(compiled_module, "_FAILED", set())
    torch._dynamo.reset()
    for method in ("sjd-vp", "sjd"):  # VP auto's scores, and a drafter without them
        decode(
            demo,
            PROMPTS[0],
            method_settings(method, 6, demo.default_sampling, seed=0, compile=True),
        )
    assert graphs and not compiled_module._FAILED
    for mutated, static in graphs:
        assert mutated and mutated <= static
