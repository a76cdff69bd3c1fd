"""`python -m sjdvp_core.check`: what it prints for sound folders of each family, and that a broken
folder (corrupt download, missing shard, wrong family) is a non-zero exit with the problem named."""

import io
import os
import shutil
import subprocess
import sys

import pytest
import torch

from sjdvp_core.hub.check import check
from tests.comfy.server import REPO
from tests.helpers.tiny_janus import write_converted
from tests.helpers.tiny_llamagen import random_gpt, random_vq
from tests.helpers.tiny_lumina import write_lumina
from tests.helpers.tiny_lumina2 import write_lumina2


def run(path, **kw) -> tuple[int, str]:
    out = io.StringIO()
    return check(str(path), out=out, **kw), out.getvalue()


def test_help_and_exit_codes_from_the_command_line(tmp_path):
    cli = [sys.executable, "-m", "sjdvp_core.check"]
    shown = subprocess.run(cli + ["--help"], capture_output=True, text=True, cwd=REPO)
    assert shown.returncode == 0 and "paste" not in shown.stdout and "--no-forward" in shown.stdout
    demo = subprocess.run(cli + ["demo"], capture_output=True, text=True, cwd=REPO)
    assert demo.returncode == 0 and "no problems found" in demo.stdout, demo.stdout + demo.stderr
    empty = subprocess.run(cli + [str(tmp_path)], capture_output=True, text=True, cwd=REPO)
    assert (
        empty.returncode == 1
        and "PROBLEM  detection" in empty.stdout
        and "1 problem(s) found" in empty.stdout
    )


def test_llamagen_folder_and_a_corrupt_download(tmp_path):
    torch.save({"model": random_gpt().state_dict()}, tmp_path / "c2i_B_256.pt")
    torch.save({"model": random_vq().state_dict()}, tmp_path / "vq_ds16_c2i.pt")
    problems, text = run(tmp_path)
    assert problems == 0, text
    assert (
        "detected: llamagen" in text
        and "c2i_B_256.pt: 0.00 GiB, torch checkpoint (zip), intact" in text
    )
    assert (
        "model: c2i, 2 layers, width 128, 10 classes, codebook 64" in text
        and "logits finite" in text
    )
    data = (tmp_path / "vq_ds16_c2i.pt").read_bytes()
    # half a download
    (tmp_path / "vq_ds16_c2i.pt").write_bytes(data[: len(data) // 2] + bytes(len(data) // 2))
    problems, text = run(tmp_path)
    assert problems >= 1 and "PROBLEM  vq_ds16_c2i.pt" in text and "re-download" in text


def test_janus_folder_shows_its_key_ids(tmp_path):
    (tmp_path / "Janus-Pro-1B").mkdir()
    folder = write_converted(tmp_path / "Janus-Pro-1B")
    problems, text = run(folder)
    assert "BOS, pad, <begin_of_image>" in text and "<begin_of_image>" in text
    # the tiny model's 4 x 4 grid
    assert "PROBLEM  image size: 64 px (Janus-Pro generates 384 x 384)" in text
    assert problems == 1, text


def test_lumina_folder_and_a_missing_shard(tmp_path):
    folder = write_lumina(str(tmp_path / "Lumina-mGPT-tiny-64"))
    problems, text = run(folder)
    assert problems == 0, text
    assert (
        "trained size: 64 px" in text and "<racm3:break>" in text and "tokenizer/vqgan.ckpt" in text
    )
    os.remove(os.path.join(folder, "model-00002-of-00002.safetensors"))
    problems, text = run(folder, run_forward=False)
    assert (
        "PROBLEM  model-00002-of-00002.safetensors: listed in model.safetensors.index.json but missing"
        in text
    )
    assert "PROBLEM  load" in text and problems == 2


def test_lumina2_folder_and_a_missing_movqgan(tmp_path):
    folder = write_lumina2(str(tmp_path / "Lumina-mGPT-2.0"))
    problems, text = run(folder)
    assert problems == 0, text
    assert "detected: lumina2" in text and "movqgan/movqgan_270M.ckpt" in text
    assert (
        "(151665, '<racm3:break>'), (151673, '<reserved08802>'), (151673, '<reserved08802>')"
        in text
    )
    assert "row end, image end: [(151670, '<reserved08799>'), (151666, '<eoss>')]" in text
    assert "codes 0..31 are ids 155000..155031, none of them a tokenizer entry" in text
    shutil.rmtree(os.path.join(folder, "movqgan"))
    problems, text = run(folder, run_forward=False)
    assert "PROBLEM  load" in text and "movqgan_270M.ckpt missing" in text and problems == 1


def test_lumina2_folder_whose_tokenizer_lists_the_image_tokens_has_no_problem(tmp_path):
    """The release's likely tokenizer: the image codes as `<MOVQGAN...>` added tokens at 155000 +
    c."""
    folder = write_lumina2(str(tmp_path / "Lumina-mGPT-2.0"), image_names="<MOVQGAN_{}>")
    shown = subprocess.run(
        [sys.executable, "-m", "sjdvp_core.check", folder], capture_output=True, text=True, cwd=REPO
    )
    assert shown.returncode == 0 and "PROBLEM" not in shown.stdout, shown.stdout + shown.stderr
    assert (
        "codes 0..31 are ids 155000..155031, 32 of them listed as image tokens in the tokenizer (<MOVQGAN_0> .. "
        "<MOVQGAN_31>)"
    ) in shown.stdout


def test_a_chameleon_folder_is_named_for_what_it_is(tmp_path):
    import json

    folder = write_lumina(str(tmp_path / "chameleon-7b"), vqgan=False)
    config = json.load(open(os.path.join(folder, "config.json")))
    config["architectures"] = ["ChameleonForConditionalGeneration"]
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    problems, text = run(folder)
    assert problems == 1 and "not Lumina-mGPT" in text


@pytest.mark.parametrize("bad", ["model.safetensors.index.json", "tokenizer.json"])
def test_unreadable_json_is_a_problem(tmp_path, bad):
    folder = write_lumina(str(tmp_path / "Lumina-mGPT-tiny-64"))
    with open(os.path.join(folder, bad), "w") as f:
        f.write("{ cut off")
    problems, text = run(folder, run_forward=False)
    assert f"PROBLEM  {bad}" in text and problems >= 1
    shutil.rmtree(folder)


def test_a_broken_link_and_an_index_without_a_weight_map_are_problems(tmp_path):
    """What a moved Hugging Face cache leaves (a link to nothing), and an index that names no
    shards: each a line of the report, not a crash of the command that exists to find them."""
    folder = write_lumina(str(tmp_path / "Lumina-mGPT-tiny-64"))
    os.remove(os.path.join(folder, "model-00002-of-00002.safetensors"))
    os.symlink(
        str(tmp_path / "gone.safetensors"), os.path.join(folder, "model-00002-of-00002.safetensors")
    )
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        f.write('{"metadata": {}}')
    problems, text = run(folder, run_forward=False)
    assert (
        "PROBLEM  model-00002-of-00002.safetensors: a link to" in text
        and "which is missing" in text
    )
    assert (
        "PROBLEM  model.safetensors.index.json" in text
        and "without its weight_map" in text
        and problems >= 2
    )
