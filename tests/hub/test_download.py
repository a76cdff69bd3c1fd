"""Downloads (sjdvp_core.hub.download) with the real huggingface_hub client against a tiny Hub on
127.0.0.1 (tests/helpers/fake_hub.py, HF_ENDPOINT pointing at it): a fetched folder loads and
decodes; an interrupted download is not listed, is explained by check, and resumes with a range
request; a dropped connection resumes within the run; truncated, corrupt and wrongly pinned files
are caught; gated, missing and unreachable repositories say what to do; the catalogue is
consistent with the families and the shipped workflows."""

import hashlib
import io
import json
import os

import pytest
import torch

from sjdvp_core import DecodeSettings, WindowSettings, decode
from sjdvp_core.hub import catalogue
from sjdvp_core.hub.check import check
from sjdvp_core.hub.download import DownloadError, download, main, on_disk
from sjdvp_core.models.folders import incomplete, marker
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import FAMILIES, detect_family, list_models
from tests.helpers import paths
from tests.helpers.fake_hub import FakeHub
from tests.helpers.tiny_llamagen import C2I, random_gpt, random_vq, saved

REPO = str(paths.REPO)


@pytest.fixture(scope="module")
def tiny_llamagen() -> dict[str, bytes]:
    vq = random_vq().state_dict()
    return {
        "c2i_B_256.pt": saved({"model": random_gpt().state_dict()}),
        "vq_ds16_c2i.pt": saved({"model": vq}),
        "README.md": b"---\nlicense: mit\n---\n",
    }


@pytest.fixture
def hub(tiny_llamagen, monkeypatch):
    with FakeHub(lifetime=120) as h:
        h.add(C2I, tiny_llamagen)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield h


ENTRY = catalogue.BY_NAME["LlamaGen-c2i-B-256"]


class Stop(Exception):
    pass


def test_download_fetches_verifies_lists_loads_and_decodes(hub, tmp_path):
    seen = []
    path = download(ENTRY, str(tmp_path), lambda done, total: seen.append((done, total)))
    folder = tmp_path / "llamagen-c2i"
    assert path == str(folder / "c2i_B_256.pt") and not os.path.exists(
        marker(str(folder), ENTRY.model)
    )
    # the allow patterns only
    assert sorted(os.listdir(folder)) == [
        "c2i_B_256.pt",
        "vq_ds16_c2i.pt",
    ]
    total = len(hub.repos[C2I]["c2i_B_256.pt"]) + len(hub.repos[C2I]["vq_ds16_c2i.pt"])
    assert seen[-1] == (total, total) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    assert list_models([str(tmp_path)]) == ["demo", os.path.join("llamagen-c2i", "c2i_B_256.pt")]
    assert on_disk(ENTRY, [str(tmp_path)]) == path
    adapter = load_model(path)
    result = decode(adapter, 3, DecodeSettings(window=WindowSettings(16), seed=0))
    image = adapter.decode_image(result.codes)
    assert image.shape == (1, 256, 256, 3) and torch.isfinite(image).all()
    gets = len([r for r in hub.requests if r[0] == "GET"])
    assert download(ENTRY, str(tmp_path)) == path  # on disk: nothing fetched
    assert len([r for r in hub.requests if r[0] == "GET"]) == gets


def test_download_interrupted_is_not_listed_is_explained_and_resumes(hub, tmp_path, monkeypatch):
    import sjdvp_core.hub.download as dl

    monkeypatch.setattr(dl, "CHUNK", 4096)  # stop inside a file, not at its end

    def stop_midway(done, total):
        if done > total // 2:
            raise Stop

    with pytest.raises(Stop):
        download(ENTRY, str(tmp_path), stop_midway)
    folder = str(tmp_path / "llamagen-c2i")
    # the GPT's marker, not the folder's
    assert incomplete(folder, ENTRY.model) and not incomplete(folder)
    assert list_models([str(tmp_path)]) == ["demo"]  # never taken for a model
    with pytest.raises(
        ValueError, match="unfinished download of LlamaGen-c2i-B-256.*resume"
    ) as told:
        detect_family(folder)
    # not ./models/sjdvp
    assert f"sjdvp_core.download LlamaGen-c2i-B-256 --dir {tmp_path}`" in str(told.value)
    assert f"If you finished it by hand, delete {marker(folder, ENTRY.model)}" in str(told.value)
    out = io.StringIO()
    assert (
        check(folder, run_forward=False, out=out) == 1 and "unfinished download" in out.getvalue()
    )
    parts = [f for f in os.listdir(folder) if f.endswith(".part")]
    assert len(parts) == 1
    kept = os.path.getsize(os.path.join(folder, parts[0]))
    with pytest.raises(
        DownloadError,
        match=f"cannot reach .* What was downloaded so far is kept in {folder}; "
        r"download it again \(choose the model again in ComfyUI, or run the "
        r"same command\) to resume",
    ):
        download(ENTRY, str(tmp_path), endpoint="http://127.0.0.1:1")
    path = download(ENTRY, str(tmp_path))
    assert not incomplete(folder, ENTRY.model)
    assert list_models([str(tmp_path)]) == ["demo", os.path.join("llamagen-c2i", "c2i_B_256.pt")]
    name = parts[0][: -len(".part")]
    assert hub.gets(C2I, name)[-1] == f"bytes={kept}-"  # resumed where it stopped
    other = "vq_ds16_c2i.pt" if name == "c2i_B_256.pt" else "c2i_B_256.pt"
    assert len(hub.gets(C2I, other)) == 1  # a finished file: fetched once
    with open(os.path.join(folder, name), "rb") as f:
        assert f.read() == hub.repos[C2I][name]
    assert path.endswith("c2i_B_256.pt")


def test_download_refuses_without_the_disk_space_and_counts_what_is_there(
    hub, tmp_path, monkeypatch
):
    """Checked before the first byte, against every file less what is already downloaded (a part
    file)."""
    from collections import namedtuple

    import sjdvp_core.hub.download as dl

    files = hub.repos[C2I]
    total = len(files["c2i_B_256.pt"]) + len(files["vq_ds16_c2i.pt"])
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(dl.shutil, "disk_usage", lambda path: usage(10**12, 0, total - 1))
    with pytest.raises(
        DownloadError,
        match=r"LlamaGen-c2i-B-256 needs .* more in .*llamagen-c2i, but only .* is "
        r"free on that disk. Free some space",
    ) as err:
        download(ENTRY, str(tmp_path))
    assert not [r for r in hub.requests if r[0] == "GET" and "/resolve/" in r[1]]  # nothing fetched
    folder = tmp_path / "llamagen-c2i"
    assert f"({total:,} bytes) more" in str(err.value) and f"({total - 1:,} bytes) is free" in str(
        err.value
    )
    folder.mkdir()  # (nothing was fetched: the folder went with the marker)
    # a download that stopped
    (folder / "vq_ds16_c2i.pt.part").write_bytes(files["vq_ds16_c2i.pt"][:1000])
    monkeypatch.setattr(dl.shutil, "disk_usage", lambda path: usage(10**12, 0, total - 1000))
    assert download(ENTRY, str(tmp_path)).endswith("c2i_B_256.pt")


@pytest.mark.parametrize("drop", ["closed", "reset"])
def test_download_resumes_a_dropped_connection_within_the_run(hub, tmp_path, monkeypatch, drop):
    """The server closes the connection early (an incomplete body) or resets it (ECONNRESET)."""
    import sjdvp_core.hub.download as dl

    monkeypatch.setattr(dl, "CHUNK", 1000)  # whole chunks reach the file
    hub.cut[(C2I, "c2i_B_256.pt")] = 5000
    if drop == "reset":
        hub.reset.add((C2I, "c2i_B_256.pt"))
    path = download(ENTRY, str(tmp_path))
    assert hub.gets(C2I, "c2i_B_256.pt") == [None, "bytes=5000-"]
    with open(path, "rb") as f:
        assert f.read() == hub.repos[C2I]["c2i_B_256.pt"]


@pytest.mark.parametrize("fault", ["truncated", "corrupt"])
def test_download_detects_a_truncated_or_corrupt_file(hub, tmp_path, fault):
    data = hub.repos[C2I]["vq_ds16_c2i.pt"]
    hub.served[(C2I, "vq_ds16_c2i.pt")] = (
        data[:-100] if fault == "truncated" else data[:-1] + bytes([data[-1] ^ 1])
    )
    expected = (
        r"\d+ bytes where the Hub lists"
        if fault == "truncated"
        else "sha256 .* where the Hub lists"
    )
    with pytest.raises(
        DownloadError, match=f"vq_ds16_c2i.pt did not download correctly: {expected}"
    ):
        download(ENTRY, str(tmp_path))
    folder = tmp_path / "llamagen-c2i"
    assert incomplete(str(folder), ENTRY.model) and not (folder / "vq_ds16_c2i.pt").exists()
    assert not (folder / "vq_ds16_c2i.pt.part").exists()  # the bad copy is gone
    del hub.served[(C2I, "vq_ds16_c2i.pt")]
    download(ENTRY, str(tmp_path))  # and the next run repairs it
    assert not incomplete(str(folder), ENTRY.model) and len(hub.gets(C2I, "c2i_B_256.pt")) == 1


def test_download_part_file_a_server_ignores_or_cannot_serve_past(hub, tmp_path):
    """A server that ignores the range (a proxy) sends the whole file, which replaces the part
    rather than following it; a part the server has nothing past (416) is verified and deleted,
    not resumed forever."""
    vq, gpt = hub.repos[C2I]["vq_ds16_c2i.pt"], hub.repos[C2I]["c2i_B_256.pt"]
    first, second = tmp_path / "first" / "llamagen-c2i", tmp_path / "second" / "llamagen-c2i"
    first.mkdir(parents=True)
    (first / "vq_ds16_c2i.pt.part").write_bytes(vq[:1000])
    hub.no_ranges.add((C2I, "vq_ds16_c2i.pt"))
    download(ENTRY, str(first.parent))
    assert (first / "vq_ds16_c2i.pt").read_bytes() == vq
    assert hub.gets(C2I, "vq_ds16_c2i.pt") == ["bytes=1000-"]  # answered 200, whole
    second.mkdir(parents=True)
    (second / "c2i_B_256.pt.part").write_bytes(gpt[:-50])
    hub.served[(C2I, "c2i_B_256.pt")] = gpt[:-100]
    bad = rf"c2i_B_256.pt did not download correctly: {len(gpt) - 50} bytes "
    with pytest.raises(DownloadError, match=bad):
        download(ENTRY, str(second.parent))
    assert hub.gets(C2I, "c2i_B_256.pt")[-1] == f"bytes={len(gpt) - 50}-"  # answered 416
    assert not (second / "c2i_B_256.pt.part").exists()
    del hub.served[(C2I, "c2i_B_256.pt")]
    download(ENTRY, str(second.parent))  # and the next run repairs it
    assert (second / "c2i_B_256.pt").read_bytes() == gpt


def test_download_stops_while_hashing_a_file(hub, tmp_path, monkeypatch):
    """A file put there by hand into an unfinished download is hashed before it is kept; a stop
    (ComfyUI's Cancel, through the progress call) lands between blocks, not after the whole file
    (tens of seconds for a multi-GB one), and leaves the file."""
    import sjdvp_core.hub.download as dl

    monkeypatch.setattr(dl, "CHUNK", 64)  # many blocks in a tiny file
    folder = tmp_path / "llamagen-c2i"
    folder.mkdir()
    data = hub.repos[C2I]["c2i_B_256.pt"]
    (folder / "c2i_B_256.pt").write_bytes(data)
    # a download that stopped, finished by hand
    open(marker(str(folder), ENTRY.model), "w").write("{}")
    calls = []

    def stop_while_hashing(done, total):
        calls.append(done)
        if len(calls) > 3:
            raise Stop

    with pytest.raises(Stop):
        download(ENTRY, str(tmp_path), stop_while_hashing)
    # before the file's end
    assert calls[1:] == [0] * (len(calls) - 1) and len(calls) < len(data) // (64 * 8)
    assert (folder / "c2i_B_256.pt").read_bytes() == data


def test_download_subfolders_and_pinned_checksums(hub, tmp_path):
    """A second repository into a subfolder with a leading folder kept (as the Chameleon VQGAN lands
    in tokenizer/), and an MD5 pin that catches a file the Hub itself lists consistently."""
    hub.add("someone/vqgan", {"tokenizer/vqgan.yaml": b"model: {}\n", "tokenizer/other.txt": b"x"})

    def entry(md5: str):
        vqgan = catalogue.Source(
            "someone/vqgan", ("tokenizer/vqgan.yaml",), md5=(("tokenizer/vqgan.yaml", md5),)
        )
        return catalogue.Entry(
            "test",
            "llamagen",
            "llamagen-c2i",
            ENTRY.sources + (vqgan,),
            1,
            "MIT",
            model="c2i_B_256.pt",
        )

    with pytest.raises(DownloadError, match="MD5 .* where the published checksum is 0000"):
        download(entry("0" * 32), str(tmp_path))
    download(entry(hashlib.md5(b"model: {}\n").hexdigest()), str(tmp_path))
    folder = tmp_path / "llamagen-c2i"
    assert (folder / "tokenizer" / "vqgan.yaml").read_bytes() == b"model: {}\n"
    assert not (folder / "tokenizer" / "other.txt").exists()
    missing = catalogue.Entry(
        "test", "llamagen", "x", (catalogue.Source("someone/vqgan", ("vqgan.ckpt",)),), 0, ""
    )
    with pytest.raises(DownloadError, match="has no file matching 'vqgan.ckpt'"):
        download(missing, str(tmp_path))


def test_download_gated_missing_offline_and_unreachable_say_what_to_do(
    hub, tmp_path, monkeypatch, tiny_llamagen
):
    hub.gated.add(C2I)
    with pytest.raises(
        DownloadError, match=r"FoundationVision/LlamaGen is gated: .*accept its licence.*HF_TOKEN"
    ):
        download(ENTRY, str(tmp_path))
    # nothing was fetched: no marker is left, so files put there by hand (as the messages say) are
    # listed and load
    assert not (tmp_path / "llamagen-c2i").exists() and list_models([str(tmp_path)]) == ["demo"]
    hub.gated.clear()
    del hub.repos[C2I]
    with pytest.raises(
        DownloadError, match="FoundationVision/LlamaGen was not found on http://127.0.0.1.*by hand"
    ):
        download(ENTRY, str(tmp_path))
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DownloadError, match="offline mode is on"):
        download(ENTRY, str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    nobody = "http://127.0.0.1:1"  # nothing listens there
    with pytest.raises(DownloadError, match=f"cannot reach {nobody} .*by hand") as failed:
        download(ENTRY, str(tmp_path / "models" / "sjdvp"), endpoint=nobody)
    # nothing was: nothing left
    assert "kept" not in str(failed.value) and not (tmp_path / "models").exists()
    (tmp_path / "a-file").write_text("")
    with pytest.raises(
        DownloadError, match="cannot write in .*a-file.*choose a models folder this user can write"
    ):
        download(ENTRY, str(tmp_path / "a-file"), endpoint=nobody)  # a raw OSError before
    # a folder model: a failed first try leaves no folder,
    janus = catalogue.BY_NAME["Janus-Pro-1B"]
    for _ in range(2):  # which would pass for the complete model next time
        with pytest.raises(DownloadError, match="was not found"):
            download(janus, str(tmp_path))
    assert not (tmp_path / janus.folder).exists() and not (tmp_path / "llamagen-c2i").exists()
    (tmp_path / janus.folder).mkdir()  # what an older version's failed try left: not the model
    with pytest.raises(DownloadError, match="was not found"):
        download(janus, str(tmp_path))
    (tmp_path / "llamagen-c2i").mkdir()
    for name, data in tiny_llamagen.items():  # what the messages say: the files, put there by hand
        (tmp_path / "llamagen-c2i" / name).write_bytes(data)
    assert list_models([str(tmp_path)]) == ["demo", os.path.join("llamagen-c2i", "c2i_B_256.pt")]


def test_download_cli_lists_and_fetches(hub, tmp_path, capsys):
    assert main(["--list"]) == 0
    listing = capsys.readouterr().out
    assert (
        all(e.name in listing for e in catalogue.ENTRIES)
        and "GAIR/Anole-7b-v0.1 -> " not in listing
    )
    assert main(["LlamaGen-c2i-B-256", "--dir", str(tmp_path)]) == 0
    assert "complete and verified" in capsys.readouterr().out
    # in place: not fetched, nor verified again
    assert main(["LlamaGen-c2i-B-256", "--dir", str(tmp_path)]) == 0
    assert (
        "already there (downloaded before, or put there by hand), so not fetched or verified"
        in capsys.readouterr().out
    )
    assert main(["No-Such-Model", "--dir", str(tmp_path)]) == 2  # a mistake, as argparse's own
    assert capsys.readouterr().err.startswith(
        "python -m sjdvp_core.download: error: no catalogue entry "
        "'No-Such-Model'; entries: LlamaGen-c2i-B-256"
    )


def test_download_catalogue_is_consistent_with_families_and_workflows():
    names = [e.name for e in catalogue.ENTRIES]
    assert len(set(names)) == len(names)
    for e in catalogue.ENTRIES:
        assert e.family in FAMILIES and e.sources and e.size > 0 and e.licence
        assert catalogue.find(e.choice) is e and catalogue.find(e.name) is e
        assert catalogue.find(e.name + " (download, 1.0 GB)") is e  # sizes may be corrected later
        for s in e.sources:
            assert s.files and "/" in s.repo
        if e.model:
            assert any(e.model in s.files for s in e.sources)
        if e.family == "lumina":
            locals_ = {s.local(f) for s in e.sources for f in s.files}
            assert {
                "tokenizer.json",
                os.path.join("tokenizer", "vqgan.ckpt"),
                os.path.join("tokenizer", "vqgan.yaml"),
            } <= locals_
    assert catalogue.find("Janus-Pro-1B").choice == "Janus-Pro-1B (download, ~4.2 GB)"
    # saved before
    assert catalogue.find("Janus-Pro-1B (download, 4.2 GB)") is catalogue.find("Janus-Pro-1B")
    assert catalogue.find("LlamaGen-c2i-B-256").choice.endswith("(download, ~732 MB)")
    shipped = {}
    for name in os.listdir(os.path.join(REPO, "workflows")):
        if name.endswith(".json"):
            with open(os.path.join(REPO, "workflows", name)) as f:
                nodes = json.load(f)["nodes"]
            shipped[name] = [
                n["widgets_values"][0] for n in nodes if n["type"] == "SJDVP_LoadModel"
            ]
    family = [v for name, values in shipped.items() if "demo" not in name for v in values]
    assert family and all(catalogue.DOWNLOAD.match(v) and catalogue.find(v) for v in family)
    assert {e.family for e in catalogue.ENTRIES} == set(FAMILIES)  # every family downloads


def test_download_marker_is_written_first(hub, tmp_path, monkeypatch):
    """Even a run stopped before the first byte leaves the folder marked as unfinished."""
    import sjdvp_core.hub.download as dl

    def fail(*a, **k):
        assert os.path.isfile(marker(str(tmp_path / "llamagen-c2i"), ENTRY.model))
        raise Stop

    monkeypatch.setattr(dl, "plan", fail)
    with pytest.raises(Stop):
        download(ENTRY, str(tmp_path))
    assert list_models([str(tmp_path)]) == ["demo"]


def test_download_of_one_gpt_leaves_its_siblings_in_the_shared_folder_loadable(
    hub, tmp_path, monkeypatch
):
    """LlamaGen's GPTs share a folder and its tokenizer: an unfinished download of one marks that
    GPT only, and a marker an older sjdvp put on the whole folder is taken over by its entry's
    next run."""
    import sjdvp_core.hub.download as dl

    # a larger sibling GPT
    hub.repos[C2I]["c2i_X_256.pt"] = hub.repos[C2I]["c2i_B_256.pt"] + b"\0" * 5000
    sibling = catalogue.Entry(
        "LlamaGen-c2i-X-256",
        "llamagen",
        "llamagen-c2i",
        (catalogue.Source(C2I, ("c2i_X_256.pt", "vq_ds16_c2i.pt")),),
        1,
        "MIT",
        model="c2i_X_256.pt",
    )
    path = download(ENTRY, str(tmp_path))
    folder = str(tmp_path / "llamagen-c2i")
    monkeypatch.setattr(dl, "CHUNK", 4096)

    def stop(done, total):
        if done > 4096:
            raise Stop

    with pytest.raises(Stop):
        download(sibling, str(tmp_path), stop)
    assert incomplete(folder, sibling.model) and not incomplete(folder, ENTRY.model)
    assert list_models([str(tmp_path)]) == ["demo", os.path.join("llamagen-c2i", "c2i_B_256.pt")]
    assert on_disk(ENTRY, [str(tmp_path)]) == path and on_disk(sibling, [str(tmp_path)]) is None
    assert detect_family(path) == "llamagen" and load_model(path).family == "LlamaGen c2i"
    with pytest.raises(ValueError, match="unfinished download of LlamaGen-c2i-X-256.*resume"):
        detect_family(folder)  # the folder may resolve to the unfinished GPT
    # as an older sjdvp left it: on the whole folder
    os.replace(marker(folder, sibling.model), marker(folder))
    assert list_models([str(tmp_path)]) == ["demo"] and on_disk(ENTRY, [str(tmp_path)]) is None
    assert download(sibling, str(tmp_path)).endswith("c2i_X_256.pt")
    assert not os.listdir(folder) or not [
        f for f in os.listdir(folder) if f.startswith(".sjdvp-download")
    ]
    assert len(hub.gets(C2I, "vq_ds16_c2i.pt")) == 1  # the shared file: fetched once
    assert list_models([str(tmp_path)]) == ["demo"] + [
        os.path.join("llamagen-c2i", f) for f in ("c2i_B_256.pt", "c2i_X_256.pt")
    ]


def test_a_second_download_of_an_entry_waits_for_the_first(hub, tmp_path, caplog):
    """Two processes downloading one entry into one folder (two ComfyUI instances sharing models/,
    or ComfyUI and the command) wrote the same part files, and one failed on a FileNotFoundError
    where the other had renamed its file. The second waits (saying who holds it; its progress
    call runs, so Cancel stops the wait) and finds the model complete: one copy fetched. Here the
    two are threads: the lock is the operating system's."""
    import logging
    import threading

    holding, go, results = threading.Event(), threading.Event(), {}

    def first_progress(done, total):
        if done and not go.is_set():  # its first bytes are in: it holds the download here
            holding.set()
            go.wait(30)

    first = threading.Thread(
        target=lambda: results.setdefault("first", download(ENTRY, str(tmp_path), first_progress))
    )
    first.start()
    assert holding.wait(30)
    waits = []

    def second_progress(done, total):
        waits.append((done, total))
        if len(waits) == 2:  # the second has waited: the first may finish
            go.set()

    with caplog.at_level(logging.WARNING, logger="sjdvp"):
        second = download(ENTRY, str(tmp_path), second_progress)
    first.join(30)
    assert (
        second == results["first"]
        and os.path.isfile(second)
        and not incomplete(os.path.dirname(second), ENTRY.model)
    )
    assert waits[:2] == [(0, 0), (0, 0)]
    assert (
        f"{ENTRY.name} is being downloaded into {tmp_path} by another process (pid {os.getpid()}"
        in caplog.text
    )
    fetched = [r for r in hub.requests if r[0] == "GET" and r[1].endswith("/c2i_B_256.pt")]
    assert len(fetched) == 1, fetched
