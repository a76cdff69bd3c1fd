"""Finding models by their files, and the report's text and commit map."""

import os
import re

import pytest
import torch

from benchmarks.toy import ToyGridAdapter
from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    TreeSettings,
    VPSettings,
    WindowSettings,
    decode,
)
from sjdvp_core.engine.cost import PassCost
from sjdvp_core.engine.report import colour_ramp, commit_map, report_data, report_text
from sjdvp_core.engine.settings import decode_settings
from sjdvp_core.figures import commit_figure
from sjdvp_core.models.loading import load_model, resolve_dtype
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.tiny_llamagen import random_gpt, random_vq


def test_family_detection_and_listing(tmp_path):
    folder = tmp_path / "llamagen-c2i"
    folder.mkdir()
    torch.save({"model": random_gpt().state_dict()}, folder / "c2i_B_256.pt")
    torch.save({"model": random_vq().state_dict()}, folder / "vq_ds16_c2i.pt")
    (tmp_path / "empty").mkdir()
    assert detect_family(str(folder)) == "llamagen" and detect_family("demo") == "demo"
    # by file
    assert list_models([str(tmp_path)]) == [
        "demo",
        os.path.join("llamagen-c2i", "c2i_B_256.pt"),
    ]
    # another root (ComfyUI's extra_model_paths.yaml) with the same folder name and another GPT, and
    # a link to a folder elsewhere (a larger disk), with a link back up that must not be walked
    # forever: every model listed, sorted, each resolving to its own root
    other = tmp_path / "other"
    (other / "llamagen-c2i").mkdir(parents=True)
    torch.save({"model": random_gpt().state_dict()}, other / "llamagen-c2i" / "c2i_L_256.pt")
    (other / "llamagen-c2i" / "up").symlink_to(other)
    disk = tmp_path.parent / f"{tmp_path.name}-disk"
    disk.mkdir()
    torch.save({"model": random_gpt().state_dict()}, disk / "c2i_B_384.pt")
    (tmp_path / "linked").symlink_to(disk)
    listed = list_models([str(other), str(tmp_path)])
    assert listed == [
        "demo",
        os.path.join("linked", "c2i_B_384.pt"),
        os.path.join("llamagen-c2i", "c2i_B_256.pt"),
        os.path.join("llamagen-c2i", "c2i_L_256.pt"),
    ]
    with pytest.raises(ValueError, match="no model family recognised.*LlamaGen GPT file"):
        detect_family(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="pick 'demo'"):
        detect_family(str(tmp_path / "missing"))
    adapter = load_model(str(folder))
    assert adapter.family == "LlamaGen c2i" and adapter.layout.length == 256


def test_missing_tokenizer_names_the_file(tmp_path):
    torch.save({"model": random_gpt().state_dict()}, tmp_path / "c2i_B_256.pt")
    with pytest.raises(
        ValueError, match=r"no tokenizer for the c2i model c2i_B_256\.pt\. Download vq_ds16_c2i\.pt"
    ):
        load_model(str(tmp_path))


def test_precision_choice():
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("bf16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="precision"):
        resolve_dtype("int3", torch.device("cpu"))


def test_report_text_and_commit_map():
    toy = ToyGridAdapter(height=4, width=4)
    res = decode(toy, 1, DecodeSettings(window=WindowSettings(8), batch_size=2))
    text = report_text(res, "SJD")
    assert (
        f"in {res.stats.forward_passes} forward passes (AR needs {toy.layout.length - 2})" in text
    )
    auto = decode(
        toy,
        1,
        DecodeSettings(
            window=WindowSettings(8), drafter=DrafterSettings(vp=VPSettings(), coupled=True)
        ),
    )
    assert "VP auto settled on strength" in report_text(auto, "SJD-VP")
    assert "draft tree" not in text
    tree = decode(
        toy, 1, DecodeSettings(window=WindowSettings(8, tree=TreeSettings(width=4)), batch_size=2)
    )
    assert "where a draft was rejected an alternative passed" in report_text(tree, "SJD")
    assert "carried drafts accepted: " in text and "drafts accepted" in text.splitlines()[2]
    assert text.splitlines()[0].startswith("SJD: decoded in ")  # not priced: the time alone leads
    flat = PassCost((1, 64), (1.0, 1.0), "flat")
    priced = report_text(decode(toy, 1, DecodeSettings(window=WindowSettings(8)), cost=flat), "SJD")
    assert re.match(
        r"SJD: about \d+\.\d\dx faster than AR on this device, \d+\.\d s saved \(estimated\); "
        r"decoded in ",
        priced,
    )
    # a window too wide for the device
    steep = PassCost((1, 64), (1.0, 64.0), "each token a pass's time")
    slower = report_text(
        decode(toy, 1, DecodeSettings(window=WindowSettings(8)), cost=steep), "SJD"
    )
    assert re.match(
        r"SJD: about \d+\.\d\dx slower than AR on this device, \d+\.\d s lost \(estimated\); ",
        slower,
    )
    picture = commit_map(res, cell=2)
    assert picture.shape == (2, 8, 8, 3) and 0 <= float(picture.min()) and float(picture.max()) <= 1
    assert torch.allclose(
        colour_ramp(torch.tensor([0.0, 1.0])), torch.tensor([[0.27, 0.0, 0.33], [0.99, 0.91, 0.14]])
    )


def test_ar_report_leaves_out_what_does_not_apply():
    """AR verifies no drafts: no acceptance rate, no momentum line, and never a nan."""
    toy = ToyGridAdapter(height=4, width=4)
    text = report_text(decode(toy, 1, decode_settings(None, None, DecodeSettings().sampling)), "AR")
    assert "nan" not in text and "drafts accepted" not in text and "carried drafts" not in text
    assert (
        "fewer steps" not in text
        and "(AR needs 19)\n" in text
        and "tokens per pass: mean 1.00, max 1" in text
    )
    summary = decode(toy, 1, decode_settings(None, None, DecodeSettings().sampling)).stats.summary()
    # no draft: no figure, no NaN
    assert summary["acceptance_rate"] is None and summary["accept_if_rose"] is None


def test_command_line_runs_a_llamagen_folder_with_its_defaults(tmp_path, capsys):
    from sjdvp_core.cli.generate import main

    folder = tmp_path / "llamagen-c2i"
    folder.mkdir()
    torch.save({"model": random_gpt().state_dict()}, folder / "c2i_B_256.pt")
    torch.save({"model": random_vq().state_dict()}, folder / "vq_ds16_c2i.pt")
    rows = main(
        "3", methods=("ar", "sjd-vp"), model=str(folder), window=8, out=str(tmp_path / "out")
    )
    assert [r["method"] for r in rows] == ["ar", "sjd-vp"] and all(
        os.path.isfile(r["path"]) for r in rows
    )
    assert "cfg_scale=4.0, temperature=1.0, top_k=2000" in capsys.readouterr().out


def test_command_lines_default_to_the_gpu_when_there_is_one(monkeypatch):
    """As the loader node does: `python -m sjdvp_core` and the check command pick the GPU unless
    told."""
    from sjdvp_core.cli.generate import parser
    from sjdvp_core.engine.devices import default_device
    from sjdvp_core.hub import check as check_command

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert default_device() == "cpu" and parser().parse_args([]).device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert parser().parse_args([]).device == "cuda"
    assert parser().parse_args(["--device", "cpu"]).device == "cpu"
    seen = {}
    monkeypatch.setattr(
        check_command,
        "check",
        lambda path, device, *a, **k: seen.setdefault("device", device) and 0,
    )
    check_command.main(["demo", "--no-forward"])
    assert seen["device"] == "cuda"


def test_at_size_keeps_fixed_size_families_and_says_so():
    from benchmarks.toy import ToyGridAdapter
    from sjdvp_core.engine.adapter import at_size

    toy = ToyGridAdapter()
    assert at_size(toy, 0, 0) is toy
    with pytest.raises(ValueError, match="give both"):
        at_size(toy, 64, 0)
    with pytest.raises(ValueError, match="generates at one size.*set width and height to 0"):
        at_size(toy, 64, 64)


def test_report_data_and_the_commit_figure():
    """The figures the nodes send to the UI match the text; the commit map carries its legend."""
    toy = ToyGridAdapter(height=4, width=4)
    res = decode(toy, 1, DecodeSettings(window=WindowSettings(8), batch_size=2))
    data = report_data(res, "SJD")
    assert data["forward_passes"] == res.stats.forward_passes
    # the forced row end and end of image need no pass
    assert data["ar_passes"] == toy.layout.length - 2
    assert f"{data['step_compression']:.2f}x fewer steps" in report_text(res, "SJD")
    # a batch's tokens per pass are over its passes, as its step compression (the mean of each
    # image's own rate read higher than the batch achieved)
    st = res.stats
    assert data["tokens_per_pass"] == round((st.ar_passes - 1) / (st.forward_passes - 1), 4)
    assert int(st.row_forward_passes.min()) < st.forward_passes  # the images did finish apart
    # the text and the badge's figure say faster or slower alike, however close to 1 the estimate is
    priced = decode(
        toy, 1, DecodeSettings(window=WindowSettings(8)), cost=PassCost((1, 64), (1.0, 1.0), "flat")
    )
    priced.stats.estimated_speedup = lambda cost=None: 0.99996
    assert report_data(priced, "SJD")[
        "estimated_speedup"
    ] == 1.0 and "x faster than AR" in report_text(priced, "SJD")
    figure = commit_figure(res, "SJD", min_width=64)
    # map + legend band
    assert figure.shape[0] == 2 and figure.shape[2] == 64 and figure.shape[1] > 64
    last = int(res.stats.commit_iter[:, res.layout.grid].max())  # one colour scale for the batch
    assert torch.equal(figure[:, :64], commit_map(res, cell=16, last=last))
