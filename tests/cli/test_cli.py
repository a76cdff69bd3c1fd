"""The command lines meet a user's mistake as argparse meets its own: one line on stderr naming what
to do, exit status 2, no traceback. A bug (any other exception) keeps its traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sjdvp_core.batch import main as batch
from sjdvp_core.cli.generate import command as generate
from sjdvp_core.cli.mistakes import run_command
from sjdvp_core.hub.check import main as check
from sjdvp_core.hub.download import main as download
from tests.comfy.server import REPO
from tests.helpers.tiny_lumina2 import write_lumina2


@pytest.fixture(scope="module")
def lumina2(tmp_path_factory):
    return write_lumina2(str(tmp_path_factory.mktemp("models") / "Lumina-mGPT-2.0"))


def one_line(capsys, prog: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith(f"{prog}: error: "), err
    return last


def test_cli_a_wrong_size_is_one_line_and_exit_2(lumina2, tmp_path):
    shown = subprocess.run(
        [
            sys.executable,
            "-m",
            "sjdvp_core",
            "--model",
            lumina2,
            "--width",
            "256",
            "--height",
            "256",
            "--methods",
            "ar",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert shown.returncode == 2 and "Traceback" not in shown.stderr, shown.stderr
    last = shown.stderr.splitlines()[-1]  # after transformers' bar of the weights it loaded
    assert last.startswith("python -m sjdvp_core: error: 256x256 px needs ") and last.endswith(
        "64x64 square"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--width", "48", "--height", "32"], "Lumina-mGPT 2.0 generates multiples of 32 px"),
        (
            ["--model", "demo", "--width", "128", "--height", "128"],
            "generates at one size (64x64 px); set width and height to 0",
        ),
        (["--model", "{tmp}"], "no model family recognised here"),
        (["--window", "wide"], "give 'auto', 'auto:N' or a number N"),
        (["--repeats", "0"], "time each method at least once"),
        (["--model", "{tmp}/nothing"], "nothing: not found. Put a model folder there"),
        (["--device", "gpu"], "device='gpu' is not a device"),
        (["--device", "cuda:9"], "cuda device(s); give cpu or another device"),
        (["--out", "{tmp}/a-file/out"], "a-file"),
        (["--out", "{tmp}/a-file"], "a-file: that is a file; give a folder"),
        (
            ["--trained-size", "512"],
            "a Lumina-mGPT 2.0 folder takes only width, height; got trained",
        ),
    ],
    ids=[
        "size",
        "fixed-size-family",
        "folder",
        "window",
        "repeats",
        "no-path",
        "device",
        "no-cuda",
        "out",
        "out-file",
        "option",
    ],
)
def test_cli_generate_mistakes(lumina2, tmp_path, capsys, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    (tmp_path / "a-file").write_text("a file where --out wants a folder")
    assert (
        generate(["--model", lumina2, "--methods", "ar", "--out", str(tmp_path / "out"), *args])
        == 2
    )
    assert message in one_line(capsys, "python -m sjdvp_core")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--window", "500"], "window"),
        (["--top-p", "2"], "top_p"),
        (["--tree-width", "99"], "width"),
        (["--seed", "-1"], "seed"),
        (["--out", "{tmp}/a-file"], "that is a file"),
    ],
    ids=["window", "top-p", "tree", "seed", "out"],
)
def test_cli_mistakes_are_said_before_the_model_loads(tmp_path, capsys, monkeypatch, args, message):
    """A 7B model takes minutes to load: a setting out of range is said before it starts."""

    def loading(*a, **k):
        raise AssertionError("the model began loading")

    for command in ("generate", "batch"):  # wherever a command may call it
        monkeypatch.setattr(f"sjdvp_core.cli.{command}.load_model", loading, raising=False)
    (tmp_path / "a-file").write_text("")
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    assert generate(["--methods", "ar", "sjd-vp", "--out", str(tmp_path / "out"), *args]) == 2
    assert message in one_line(capsys, "python -m sjdvp_core")
    prompts = tmp_path / "p.txt"
    prompts.write_text("a red circle on grass\n")
    assert batch(["--prompts", str(prompts), "--out", str(tmp_path / "runs"), *args]) == 2
    assert message in one_line(capsys, "python -m sjdvp_core.batch")


def test_cli_trained_size_reaches_the_loader(tmp_path):
    """check takes --trained-size for a Lumina-mGPT folder whose name does not say it; so do the
    decoding commands."""
    from tests.helpers.tiny_lumina import write_lumina

    folder = write_lumina(str(tmp_path / "MyLumina"))  # "trained" at 64 px; the name does not say
    assert (
        generate(
            [
                "--model",
                folder,
                "--trained-size",
                "64",
                "--methods",
                "ar",
                "--repeats",
                "1",
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )


def test_cli_ctrl_c_is_one_line_and_exit_130(capsys):
    def stopped():
        raise KeyboardInterrupt

    assert run_command("prog", stopped) == 130
    err = capsys.readouterr().err
    assert err.strip() == "prog: interrupted" and "Traceback" not in err


def test_cli_writes_images_at_the_models_own_size(lumina2, tmp_path):
    """A 64 x 32 px Lumina-mGPT 2.0 image is written 64 x 32; only the demo's 64 px images are
    enlarged (4x, nearest), and the PNG says so."""
    from PIL import Image

    out = tmp_path / "out"
    assert (
        generate(
            [
                "--model",
                lumina2,
                "--width",
                "64",
                "--height",
                "32",
                "--methods",
                "ar",
                "sjd-vp",
                "--window",
                "8",
                "--repeats",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    for method in ("ar", "sjd-vp"):
        png = Image.open(out / f"{method}_seed0.png")
        assert png.size == (64, 32) and "Comment" not in png.info
    # the first run's is kept
    assert generate(["--methods", "ar", "--repeats", "1", "--out", str(out)]) == 0
    assert Image.open(out / "ar_seed0.png").size == (64, 32)
    demo = Image.open(out / "ar_seed0_2.png")
    assert (
        demo.size == (256, 256)
        and demo.info["Comment"] == "generated at 64x64 px, enlarged 4x (nearest)"
    )


def test_cli_a_missing_optional_package_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes -> ImportError
    assert generate(["--precision", "nf4", "--methods", "ar", "--out", str(tmp_path)]) == 2
    assert "pip install bitsandbytes" in one_line(capsys, "python -m sjdvp_core")


def test_cli_batch_mistakes(tmp_path, capsys):
    assert batch(["--prompts", str(tmp_path / "none.txt"), "--out", str(tmp_path)]) == 2
    assert "--prompts" in one_line(capsys, "python -m sjdvp_core.batch")
    (tmp_path / "p.txt").write_text("a red circle on grass\n")
    assert (
        batch(["--prompts", str(tmp_path / "p.txt"), "--seeds", "x", "--out", str(tmp_path)]) == 2
    )
    one_line(capsys, "python -m sjdvp_core.batch")
    # drawn as that text before
    (tmp_path / "p.json").write_text('{"prompt": "a red circle on grass"}\n')
    assert batch(["--prompts", str(tmp_path / "p.json"), "--out", str(tmp_path)]) == 2
    assert "give a .jsonl file" in one_line(capsys, "python -m sjdvp_core.batch")
    (tmp_path / "p.JSONL").write_text('{"prompt": ""}\n')
    assert batch(["--prompts", str(tmp_path / "p.JSONL"), "--out", str(tmp_path / "runs")]) == 2
    # read as JSONL, named once
    assert one_line(capsys, "python -m sjdvp_core.batch").count("prompt ''") == 1


def test_cli_check_and_download_mistakes(tmp_path, capsys):
    assert check([str(tmp_path), "--trained-size", "300"]) == 1  # problems are the report's, exit 1
    assert "PROBLEM  detection" in capsys.readouterr().out
    assert download(["No-Such-Model", "--dir", str(tmp_path)]) == 2
    assert "no catalogue entry" in one_line(capsys, "python -m sjdvp_core.download")


def test_cli_a_bug_keeps_its_traceback():
    def broken():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        run_command("prog", broken)
