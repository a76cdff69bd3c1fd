"""The benchmark harness: a torchrun run sharded over 2 CPU processes (gloo) gives the same records
as one process, and writes its table, JSON and plots."""
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ARGS = ["--model", "toy", "--windows", "4", "--seeds", "2", "--prompts", "2", "--methods", "ar", "sjd", "sjd-vp",
        "--coupling", "off", "on", "--trees", "1x1", "3x1"]


def run(cmd, out):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=REPO)
    subprocess.run(cmd + ARGS + ["--out", out], cwd=REPO, env=env, check=True, capture_output=True, timeout=600)
    with open(out + ".json") as f:
        return json.load(f)


def test_sharded_run_matches_one_process(tmp_path):
    one = run([sys.executable, "-m", "benchmarks.compare_methods"], str(tmp_path / "one"))
    two = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29533",
               "-m", "benchmarks.compare_methods"], str(tmp_path / "two"))
    keys = ("method", "window", "coupled", "tree", "runs", "nfe", "step_compression", "acceptance", "tv_from_ar",
            "slot_acceptance", "committed_cumulative", "tokens_per_forward", "extra_mib")
    assert [{k: r[k] for k in keys} for r in one] == [{k: r[k] for k in keys} for r in two]
    assert [r["method"] for r in one] == ["ar"] + ["sjd", "sjd-vp"] * 4
    assert [r["tree"] for r in one] == ["chain"] + ["chain", "chain", "3x1", "3x1"] * 2
    assert all(r["extra_mib"] > 0 and r["tokens_per_forward"] > 4 for r in one if r["tree"] == "3x1")
    assert all(r["runs"] == 4 for r in one) and one[0]["step_compression"] == 1.0
    assert all(r["step_compression"] > 1.5 for r in one[1:])
    assert "| sjd-vp | 4 | coupled | chain |" in (tmp_path / "two.md").read_text()
    assert "| sjd-vp | 4 | coupled | 3x1 |" in (tmp_path / "two.md").read_text()
    assert (tmp_path / "two_step_compression.png").stat().st_size > 1000
