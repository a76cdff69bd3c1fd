"""The benchmark harness: a torchrun run sharded over 2 CPU processes (gloo) gives the same records
as one process, and writes its table, JSON and plots."""

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from benchmarks import ar_baseline
from sjdvp_core.demo import load_demo
from sjdvp_core.engine.decode import decode
from sjdvp_core.engine.settings import method_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = [
    "--model",
    "toy",
    "--windows",
    "4",
    "--seeds",
    "2",
    "--prompts",
    "2",
    "--methods",
    "ar",
    "sjd",
    "sjd-vp",
    "--coupling",
    "off",
    "on",
    "--trees",
    "1x1",
    "3x1",
]


def run(cmd, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    subprocess.run(
        cmd + ARGS + ["--out", out], cwd=REPO, env=env, check=True, capture_output=True, timeout=600
    )
    with open(out + ".json") as f:
        return json.load(f)


def test_sharded_run_matches_one_process(tmp_path):
    one = run([sys.executable, "-m", "benchmarks.compare_methods"], str(tmp_path / "one"))
    two = run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node",
            "2",
            "--master_port",
            "29533",
            "-m",
            "benchmarks.compare_methods",
        ],
        str(tmp_path / "two"),
    )
    keys = (
        "method",
        "window",
        "coupled",
        "init",
        "tree",
        "runs",
        "nfe",
        "step_compression",
        "acceptance",
        "tv_from_ar",
        "slot_acceptance",
        "committed_cumulative",
        "tokens_per_forward",
        "extra_mib",
    )
    assert [{k: r[k] for k in keys} for r in one] == [{k: r[k] for k in keys} for r in two]
    assert [r["method"] for r in one] == ["ar"] + ["sjd", "sjd-vp"] * 4
    assert [r["tree"] for r in one] == ["chain"] + ["chain", "chain", "3x1", "3x1"] * 2
    assert all(
        r["extra_mib"] > 0 and r["tokens_per_forward"] > 4 for r in one if r["tree"] == "3x1"
    )
    assert all(r["runs"] == 4 for r in one) and one[0]["step_compression"] == 1.0
    assert all(r["step_compression"] > 1.5 for r in one[1:])
    assert "| sjd-vp | 4 | coupled | repeat_above | chain |" in (tmp_path / "two.md").read_text()
    assert "| sjd-vp | 4 | coupled | repeat_above | 3x1 |" in (tmp_path / "two.md").read_text()
    assert (tmp_path / "two_step_compression.png").stat().st_size > 1000


def test_plain_ar_loop_is_the_same_model_run(monkeypatch):
    """benchmarks.ar_baseline's plain loop feeds the demo as the engine does: with its draw made
    greedy it gives the engine's greedy AR image, token for token."""
    adapter = load_demo()
    greedy = method_settings("ar", 1, replace(adapter.default_sampling, greedy=True))
    engine = decode(adapter, "a red circle on grass", greedy).tokens
    monkeypatch.setattr(
        torch, "multinomial", lambda probs, n, generator=None: probs.argmax(-1, keepdim=True)
    )
    assert torch.equal(ar_baseline.plain_ar(adapter, "a red circle on grass", 0), engine)


def test_interleaved_takes_turns_and_leaves_the_warm_up_out(monkeypatch):
    """Every contender runs once per round in order; warm-up rounds are run but not counted; the
    result is the last run's; no contender is timed with another's work."""
    from sjdvp_core import timing

    calls, clock = [], iter(range(100))
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    runs = {
        "a": lambda: calls.append("a") or len(calls),
        "b": lambda: calls.append("b") or len(calls),
    }
    timed = timing.interleaved(runs, repeats=3, warmup=1)
    assert calls == ["a", "b"] * 4
    assert [t.seconds for t in timed.values()] == [[1, 1, 1], [1, 1, 1]] and timed["b"].result == 8
    assert timed["a"].to_json() == {"seconds": 1, "runs_s": [1, 1, 1], "repeats": 3}
    with pytest.raises(ValueError, match="at least once"):
        timing.interleaved(runs, repeats=0)


def test_gpu_check_tiny_runs_every_section_and_writes_its_tables(
    tmp_path, monkeypatch, replayed_on_cpu
):
    """`python -m benchmarks.gpu_check --tiny`: the GPU check's code path on the CPU, every family
    shape (the offload section needs CUDA and says so; captured passes through
    tests/helpers/static_replay.py), one JSON and one markdown page."""
    from benchmarks import gpu_check

    # the engine's step at one vocabulary
    monkeypatch.setattr(gpu_check, "VOCABS", gpu_check.VOCABS[:1])
    out = str(tmp_path / "gpu_check")
    report = gpu_check.main(tiny=True, out=out, repeats=1)
    assert [r["model"] for r in report["forward"]] == [a.name for a in gpu_check.ARCHS]
    for row in report["forward"]:
        assert "error" not in row, row
        timed = [row[k] for k in ("rows_1", "rows_2") if k in row]
        assert timed and all(r["relative"][1] == 1.0 for r in timed)
        assert all(
            r["passes"].startswith("captured: ") and set(r["captured_ms"]) == set(r["ms"])
            for r in timed
        )
        assert row["memory"]["estimate_gb"] > 0
    assert [r["precision"] for r in report["quantised"]] == ["bf16", "int8", "nf4"]
    assert all("error" not in r for r in report["quantised"]), report["quantised"]
    assert report["quantised"][0]["max_logit_diff_relative"] == 0
    assert "needs a CUDA device" in report["offload"]["skipped"]
    assert {(r["passes"], r["method"]) for r in report["demo"]} == {
        (p, m) for p in ("eager", "captured") for m in ("ar", "sjd", "sjd-vp")
    }
    assert (
        all("error" not in r for r in report["engine"])
        and report["engine"][-1]["same_tokens_as_eager"]
    )
    with open(out + ".json") as f:
        assert json.load(f)["forward"] == json.loads(json.dumps(report["forward"]))
    with open(out + ".md") as f:
        page = f.read()
    assert all(a.name in page for a in gpu_check.ARCHS) and "## Quantised layers" in page
    assert "## Forward passes captured" in page and "## Token stage per image" in page


def test_edit_speed_compares_edits_and_text_on_the_same_prompts():
    """benchmarks/edit_speed.py: each mode runs AR, SJD and SJD-VP; an edit draws half the demo's
    tokens, and AR takes a pass for each."""
    from benchmarks import edit_speed

    rows = edit_speed.run(prompts=1, seeds=1, window=8)
    assert [(r["mode"], r["method"]) for r in rows] == [
        (mode, method) for mode in ("text", "edit") for method in edit_speed.METHODS
    ]
    ar = {r["mode"]: r for r in rows if r["method"] == "ar"}
    assert ar["text"]["tokens"] == 2 * ar["edit"]["tokens"] == ar["text"]["passes"]
    assert all(r["step_compression"] >= 1 for r in rows)
