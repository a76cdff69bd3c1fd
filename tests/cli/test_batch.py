"""python -m sjdvp_core.batch: prompts (text or JSONL) x seeds x methods, every image written once
with its JSONL line; sharded over 2 processes by torchrun (gloo, CPU); a run killed mid-way,
started again, redoes only what it had not finished."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sjdvp_core.cli.batch import jobs, parse_seeds, read_prompts, run
from tests.helpers.paths import REPO

ROOT = str(REPO)
PROMPTS = ["a red circle on grass", "a blue square on snow", "a green triangle on sand"]


def env():
    return dict(os.environ, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")  # two processes share two cores


def prompt_file(tmp_path, jsonl=False):
    path = tmp_path / ("prompts.jsonl" if jsonl else "prompts.txt")
    if jsonl:
        path.write_text("\n".join(json.dumps({"prompt": p}) for p in PROMPTS) + "\n")
    else:
        path.write_text("# demo scenes\n" + "\n".join(PROMPTS) + "\n\n")
    return str(path)


def finished(out) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, "images.jsonl"))]


def test_prompts_seeds_and_jobs(tmp_path):
    assert read_prompts(prompt_file(tmp_path)) == [(p, None) for p in PROMPTS]
    assert read_prompts(prompt_file(tmp_path, jsonl=True)) == [(p, None) for p in PROMPTS]
    assert parse_seeds(["0-2", "7"]) == [0, 1, 2, 7]
    for bad in ("x", "5-2", "0-"):
        with pytest.raises(ValueError, match="ranges like 0-99"):
            parse_seeds([bad])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        read_prompts(str(bad))
    # null would be drawn as "None"
    bad.write_text('{"prompt": "a", "negative": ""}\n{"prompt": null}\n')
    with pytest.raises(ValueError, match='bad.jsonl:2: "prompt" .* must be text'):
        read_prompts(str(bad))
    bad.write_text('{"prompt": "a", "negative": ""}\n')
    assert read_prompts(str(bad)) == [("a", None)]  # an empty negative is none
    listed = jobs(read_prompts(prompt_file(tmp_path)), [0, 1], ["ar", "sjd-vp"])
    assert len(listed) == 12 and len({j.name for j in listed}) == 12


def test_one_process_writes_every_image_once_and_a_rerun_does_nothing(tmp_path):
    out = str(tmp_path / "run")
    # a typo stops the run before its first image: the folder stays open
    with pytest.raises(FileNotFoundError):
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            model=str(tmp_path / "typo"),
        )
    assert (
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            window="8",
            device="cpu",
        )
        == 12
    )
    records = finished(out)
    assert [r["index"] for r in records] == list(range(12))
    assert all(os.path.isfile(os.path.join(out, r["image"])) for r in records)
    r = records[1]
    assert (r["prompt"], r["seed"], r["method"]) == (PROMPTS[0], 0, "sjd-vp") and r["settings"][
        "window"
    ] == 8
    # SJD-VP beats AR's steps
    assert r["stats"]["forward_passes"] < records[0]["stats"]["forward_passes"]
    assert (
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            window="8",
            device="cpu",
        )
        == 0
    )
    assert len(finished(out)) == 12
    # a method named twice: the same jobs
    assert (
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp", "ar"],
            out,
            window="8",
            device="cpu",
        )
        == 0
    )
    # a line cut short by a kill: its image is redone, and the next record does not stick to it
    log = os.path.join(out, "images.rank0.jsonl")
    text = open(log).read().splitlines(keepends=True)
    open(log, "w").write("".join(text[:-1]) + text[-1][:20])
    assert (
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            window="8",
            device="cpu",
        )
        == 1
    )
    assert [r["index"] for r in finished(out)] == list(range(12))
    other = tmp_path / "other.txt"
    other.write_text("a purple diamond on night\n")
    # other prompts into the same folder
    with pytest.raises(ValueError, match="another run's images"):
        run(str(other), ["0"], ["ar"], out, window="8", device="cpu")
    # other settings, or other seeds, would add images made otherwise, or replace images.jsonl's
    # index of them
    with pytest.raises(ValueError, match="made with other top_k, window: give a new --out"):
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            window="16",
            top_k=5,
            device="cpu",
        )
    with pytest.raises(ValueError, match="made with other jobs"):
        run(
            prompt_file(tmp_path, jsonl=True),
            ["2"],
            ["ar", "sjd-vp"],
            out,
            window="8",
            device="cpu",
        )
    # another kind of device draws other images from the same seeds: resumed there, it is refused by
    # name
    run_json = json.load(open(os.path.join(out, "run.json")))
    assert run_json["device"].startswith("cpu")
    run_json["device"] = "cuda: NVIDIA H100 80GB HBM3"  # as a run started on a GPU leaves it
    json.dump(run_json, open(os.path.join(out, "run.json"), "w"))
    with pytest.raises(ValueError, match="made with other device: give a new --out"):
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            window="8",
            device="cpu",
        )
    del run_json["device"]  # an older version's run.json
    json.dump(run_json, open(os.path.join(out, "run.json"), "w"))
    assert (
        run(
            prompt_file(tmp_path, jsonl=True),
            ["0", "1"],
            ["ar", "sjd-vp"],
            out,
            window="8",
            device="cpu",
        )
        == 0
    )
    assert (
        len(finished(out)) == 12 and len(open(os.path.join(out, "images.jsonl")).readlines()) == 12
    )


def test_a_bad_prompt_is_told_before_the_first_image_and_ctrl_c_keeps_the_index(
    tmp_path, monkeypatch, capsys
):
    import sjdvp_core.cli.batch as batch

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a red circle on grass\na cat\n")
    with pytest.raises(ValueError, match="prompt 'a cat': .*one shape"):
        run(str(prompts), ["0"], ["ar"], str(tmp_path / "bad"), window="8", device="cpu")
    assert not [f for f in os.listdir(tmp_path / "bad") if f.endswith(".png")]
    decode, calls = batch.decode, []

    def interrupted(*args, **kwargs):  # Ctrl-C during the second image
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return decode(*args, **kwargs)

    monkeypatch.setattr(batch, "decode", interrupted)
    out = tmp_path / "stopped"
    assert (
        batch.main(
            [
                "--prompts",
                prompt_file(tmp_path),
                "--seeds",
                "0",
                "--methods",
                "ar",
                "--window",
                "8",
                "--device",
                "cpu",
                "--out",
                str(out),
            ]
        )
        == 130
    )
    assert "interrupted;" in capsys.readouterr().err and len(finished(out)) == 1


def test_torchrun_two_processes_share_the_jobs_and_a_killed_run_resumes(tmp_path):
    out = str(tmp_path / "run")
    args = [
        "--prompts",
        prompt_file(tmp_path),
        "--seeds",
        "0-1",
        "--methods",
        "ar",
        "sjd",
        "--out",
        out,
        "--window",
        "8",
    ]
    # a single process, killed once its first images are on disk
    first = subprocess.Popen(
        [sys.executable, "-m", "sjdvp_core.batch", *args],
        env=env(),
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while (
        time.time() < deadline
        and len([f for f in os.listdir(out) if f.endswith(".png")] if os.path.isdir(out) else [])
        < 2
    ):
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    killed_log = os.path.join(out, "images.rank0.jsonl")
    kept = {}
    for line in open(killed_log):
        if line.endswith("\n"):
            name = json.loads(line)["image"]
            kept[name] = os.stat(os.path.join(out, name)).st_mtime_ns
    assert 1 <= len(kept) < 12
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "sjdvp_core.batch",
            *args,
        ],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert [r["index"] for r in finished(out)] == list(range(12))  # every image, once, in job order
    lines = [
        json.loads(line)
        for rank in (0, 1)
        for line in open(os.path.join(out, f"images.rank{rank}.jsonl"))
    ]
    assert len(lines) == 12 == len({x["image"] for x in lines})  # nothing decoded twice
    assert {x["index"] % 2 for x in open_lines(out, 1)} == {1}  # rank 1 took the odd jobs left
    for name, mtime in kept.items():  # what was finished was kept
        assert os.stat(os.path.join(out, name)).st_mtime_ns == mtime
    assert not [f for f in os.listdir(out) if f.endswith(".tmp.png")]


def open_lines(out, rank) -> list[dict]:
    return [json.loads(line) for line in open(os.path.join(out, f"images.rank{rank}.jsonl"))]


FAILING_RANK = """
import os, sys
import sjdvp_core.cli.batch as batch
if os.environ["RANK"] == "1":
    def fails(*args, **kwargs):
        raise RuntimeError("the disk is full")
    batch.decode = fails
sys.exit(batch.main(sys.argv[1:]))
"""


def test_a_rank_that_fails_does_not_leave_the_others_waiting(tmp_path):
    """Two ranks as on two hosts (no torchrun agent to stop the rest): rank 1 raises at its first
    image; rank 0 finishes its own, indexes them, and exits saying which rank failed and how to
    resume (it ended in the end-of-run barrier with gloo's traceback about a crashed peer, and no
    index)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "run")
    args = ["--prompts", prompt_file(tmp_path), "--methods", "ar", "--out", out, "--window", "8"]
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", FAILING_RANK, *args],
            cwd=ROOT,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(
                env(),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                WORLD_SIZE="2",
                RANK=str(r),
                LOCAL_RANK="0",
            ),
        )
        for r in (0, 1)
    ]
    results = [p.communicate(timeout=120) for p in ranks]
    assert ranks[1].returncode != 0 and "the disk is full" in results[1][1]
    assert ranks[0].returncode == 1, results[0][1][-2000:]
    assert (
        "rank 1 of 2 stopped with an error" in results[0][1]
        and "run the same command again" in results[0][1]
    )
    assert [r["index"] for r in finished(out)] == [0, 2]  # rank 0's images, indexed


def test_under_torchrun_a_failed_rank_lets_the_others_finish(tmp_path):
    """torchrun's agent stops every process once one exits with an error (so rank 0 was killed
    mid-run, with no index): the failed rank waits at the end exchange instead, and rank 0
    finishes and indexes its images."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING_RANK)
    out = str(tmp_path / "run")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            "--prompts",
            prompt_file(tmp_path),
            "--methods",
            "ar",
            "--out",
            out,
            "--window",
            "8",
        ],
        env=env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and "the disk is full" in done.stderr
    assert "rank 1 of 2 stopped with an error" in done.stderr, done.stderr[-3000:]
    assert [r["index"] for r in finished(out)] == [0, 2]
