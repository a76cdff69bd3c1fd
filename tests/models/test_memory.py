"""The memory estimator (models.memory) against what a decode really holds, for the tiny model of
every family in every precision: the estimate, made from the model loaded in fp32, is within 10%
of the measured peak (the weights' storage as loaded at that precision + the decode's peak CPU
allocation, read from torch.profiler's memory events). And auto's choice: the compute dtype where
it fits, else int8, else nf4, with its figures."""

from __future__ import annotations

import json

import pytest
from torch.profiler import ProfilerActivity, profile

from sjdvp_core import decode
from sjdvp_core.engine.settings import method_settings
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.memory import choose_precision, need
from sjdvp_core.models.quantize import weight_bytes
from tests.helpers.tiny_families import FAMILIES

PRECISIONS = ("fp32", "bf16", "int8", "nf4")


def decode_peak(adapter, prompts, settings, tmp_path) -> int:
    """Bytes the decode allocated on the CPU at its peak, beyond what was allocated when it
    started."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        decode(adapter, prompts, settings)
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    total = [
        e["args"]["Total Allocated"]
        for e in json.loads(trace.read_text())["traceEvents"]
        if e.get("name") == "[memory]"
    ]
    return max(total) - total[0]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_estimate_is_within_10_percent_of_the_measured_peak(family, tmp_path):
    path, options, prompts = FAMILIES[family](tmp_path)
    full = load_model(path, precision="fp32", **options)
    for precision in PRECISIONS:
        adapter = full if precision == "fp32" else load_model(path, precision=precision, **options)
        settings = method_settings("sjd-vp", 32, adapter.default_sampling)
        measured = weight_bytes(adapter.module) + decode_peak(
            adapter, prompts[:1], settings, tmp_path
        )
        estimate = need(
            full, precision, "bf16" if precision == "bf16" else "fp32", settings, prompts[:1]
        ).total
        assert abs(estimate / measured - 1) <= 0.10, (family, precision, estimate, measured)


def test_auto_takes_the_compute_dtype_where_it_fits_then_int8_then_nf4():
    demo = load_model("demo")
    needs = {p: need(demo, p, "bf16").total for p in ("bf16", "int8", "nf4")}
    assert needs["bf16"] > needs["int8"] > needs["nf4"]
    assert choose_precision(demo, "bf16", needs["bf16"])[0] == "bf16"
    precision, why = choose_precision(demo, "bf16", needs["bf16"] - 1)
    assert precision == "int8" and "bf16" in why and "GB free" in why
    assert choose_precision(demo, "bf16", needs["int8"] - 1)[0] == "nf4"
    precision, why = choose_precision(demo, "bf16", needs["nf4"] - 1)
    assert precision == "nf4" and "nothing fits" in why
