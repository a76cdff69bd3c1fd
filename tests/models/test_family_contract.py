"""The contract every model family keeps, run on each family's tiny real-layout fixture (as
diffusers' PipelineTesterMixin runs one suite on every pipeline): detected from its files and
loaded; greedy SJD and SJD-VP return AR's tokens, on a chain, on a draft tree and with the
automatic window (the nodes' default), and with reference images where the family edits (others
refuse them); a tree's forward equals its branches' forwards;
decode_image gives an IMAGE (a diffusion decoder's from the prompts); every missing or broken
file is named with the repository to download; the check command finds no problem. A family's
original release, where its loader takes one beside the converted layout, is a fixture of its
own. A new family adds its fixture to FIXTURES and keeps only its own special tests (prompt
layout, sizes, upstream equivalence) in its test file."""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import pytest
import torch

from sjdvp_core import decode, method_settings
from sjdvp_core.engine.adapter import Edit, PixelSettings
from sjdvp_core.engine.settings import SamplingSettings, TreeSettings
from sjdvp_core.hub.check import check
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import DIT_FAMILIES, detect_family, pixels_source
from tests.helpers.tiny_hf import (
    assert_greedy_sjd_equals_ar,
    hf_broken_folders,
    variant,
    widened,
    without_a_tensor,
)
from tests.helpers.tree_check import assert_tree_matches_chains

PROMPTS = ["a red fox in the snow", "a blue sky"]


def _emu3(folder: str) -> str:
    from tests.helpers.tiny_emu3 import write_converted

    os.makedirs(folder)
    return str(write_converted(Path(folder)))


def _janus(folder: str) -> str:
    from tests.helpers.tiny_janus import write_converted

    os.makedirs(folder)
    return str(write_converted(Path(folder)))


def _emu3_original(folder: str) -> str:
    from tests.helpers.tiny_emu3 import write_folders

    return write_folders(Path(folder))[1]


def _janus_original(folder: str) -> str:
    from tests.helpers.tiny_janus import write_converted, write_original

    converted = Path(folder) / "converted"
    converted.mkdir(parents=True)
    write_converted(converted)
    return write_original(str(converted), Path(folder) / "Janus-Pro-7B", sharded=True)


def _llamagen(folder: str) -> str:
    """A class-conditional release folder: the GPT (ImageNet's 1000 classes) and its tokenizer
    side by side."""
    from safetensors.torch import save_file

    from tests.helpers.tiny_llamagen import GPT_TINY, random_gpt, random_vq

    os.makedirs(folder)
    gpt = random_gpt(replace(GPT_TINY, num_classes=1000)).state_dict()
    save_file(
        {k: v.contiguous() for k, v in gpt.items()}, os.path.join(folder, "c2i_B_256.safetensors")
    )
    torch.save({"model": random_vq().state_dict()}, os.path.join(folder, "vq_ds16_c2i.pt"))
    return folder


def _llamagen_edits() -> list:
    from tests.helpers.tiny_llamagen import edits

    return edits()


def _llamagen_broken(folder: str, tmp_path) -> list[tuple[str, str]]:
    return [
        (
            variant(folder, tmp_path, "no_vq", drop=["vq_*"]),
            r"no tokenizer for the c2i model.*vq_ds16_c2i\.pt",
        ),
        (
            variant(
                folder,
                tmp_path,
                "bad_gpt",
                write={"c2i_B_256.safetensors": "not a safetensors file"},
            ),
            "c2i_B_256.safetensors",
        ),
    ]


def _lumina(folder: str) -> str:
    from tests.helpers.tiny_lumina import write_lumina

    return write_lumina(folder)


def _lumina2(folder: str) -> str:
    from tests.helpers.tiny_lumina2 import write_lumina2

    return write_lumina2(folder, image_names="<MOVQGAN_{}>")  # the release's likely tokenizer


def _lumina2_omni(folder: str) -> str:
    from tests.helpers.tiny_lumina2 import OMNI_POSITIONS, write_lumina2

    return write_lumina2(folder, positions=OMNI_POSITIONS)


def _lumina2_edits() -> list:
    from tests.helpers.tiny_lumina2 import edits

    return edits()


def _glm_image(folder: str) -> str:
    from tests.helpers.tiny_glm_image import write_glm_image

    return write_glm_image(folder)


def _janus_edits() -> list:
    from tests.helpers.tiny_janus import edits

    return edits()


def _glm_image_edits() -> list:
    from tests.helpers.tiny_glm_image import edits

    return edits()


def _glm_image_broken(folder: str, tmp_path) -> list[tuple[str, str]]:
    """The release's diffusers folder: a part's folder missing, the token stage's or the DiT's
    weights broken or incomplete, the processor's tokenizer missing or broken."""

    def copy(name: str, drop=(), write=None) -> str:
        return variant(folder, tmp_path, name, drop, write)

    encoder = "vision_language_encoder/model.safetensors"
    return [
        (copy("no_vae", drop=["vae"]), "missing the folders vae"),
        (copy("bad_encoder", write={encoder: "not a safetensors file"}), "cannot be loaded"),
        (without_a_tensor(copy("partial_encoder"), encoder), "the weights lack 1 tensors"),
        (
            copy(
                "another_models_config",
                write={
                    "vision_language_encoder/config.json": json.dumps(
                        widened(
                            json.load(
                                open(os.path.join(folder, "vision_language_encoder", "config.json"))
                            )
                        )
                    )
                },
            ),
            r"is stored as .* needs .*\(config\.json and the weights are of different models\)",
        ),
        (
            copy(
                "bad_dit",
                write={"transformer/diffusion_pytorch_model.safetensors": "not a safetensors file"},
            ),
            "DiT, VAE or glyph encoder cannot be loaded",
        ),
        (copy("no_tokenizer", drop=["tokenizer.json"]), "cannot be read as GLM-Image's processor"),
        (
            copy("bad_tokenizer", write={"processor/tokenizer.json": "{}"}),
            "cannot be read as GLM-Image's processor",
        ),
    ]


@dataclass(frozen=True)
class Fixture:
    """A family's tiny folder: its writer, the name the folder takes, how to load it at a size its
    positions hold, the guidance scale the family uses, the repository its error messages name,
    what the check command rightly finds wrong with a tiny model, its prompts, and its broken
    copies."""

    family: str
    write: Callable[[str], str]
    name: str
    repo: str
    cfg: float
    size: dict = field(default_factory=dict)
    problems: tuple[str, ...] = ()
    prompts: tuple = tuple(PROMPTS)
    # (folder, tmp_path) -> [(a broken copy, the message it must give)]; None: the release's own
    # test module names each of its files (several repositories, .bin shards),
    # test_<family>_original.py
    broken: Callable | None = hf_broken_folders
    freed: Callable = lambda adapter: adapter.cache is None  # whether finish() freed the KV cache
    # () -> conditions with reference images (engine.adapter.Edit), for a family that edits; None:
    # the family takes no reference images and must refuse them
    edits: Callable | None = None


FIXTURES = [
    Fixture(
        "llamagen",
        _llamagen,
        "LlamaGen-c2i-B-256",
        "FoundationVision/LlamaGen",
        4.0,
        prompts=("golden retriever", "tabby"),
        broken=_llamagen_broken,
        freed=lambda adapter: all(layer.attention.kv_cache is None for layer in adapter.gpt.layers),
        edits=_llamagen_edits,
    ),
    Fixture(
        "emu3", _emu3, "Emu3-Gen-hf", "BAAI/Emu3-Gen-hf", 3.0, dict(image_area=128, ratio="2:1")
    ),
    Fixture(
        "emu3",
        _emu3_original,
        "Emu3-Gen",
        "BAAI/Emu3-Gen",
        3.0,
        dict(image_area=128, ratio="2:1"),
        broken=None,
    ),
    # the tiny model's 4 x 4 grid
    Fixture(
        "janus",
        _janus,
        "Janus-Pro-1B",
        "deepseek-community/Janus-Pro-1B",
        5.0,
        problems=("image size: 64 px (Janus-Pro generates 384 x 384)",),
        edits=_janus_edits,
    ),
    Fixture(
        "janus",
        _janus_original,
        "Janus-Pro-7B",
        "deepseek-ai/Janus-Pro-7B",
        5.0,
        problems=("image size: 64 px (Janus-Pro generates 384 x 384)",),
        broken=None,
        edits=_janus_edits,
    ),
    Fixture(
        "lumina",
        _lumina,
        "Lumina-mGPT-tiny-64",
        "Alpha-VLLM/Lumina-mGPT-7B-768 (or -512, -1024)",
        4.0,
        dict(width=64, height=32),
    ),
    Fixture(
        "lumina2",
        _lumina2,
        "Lumina-mGPT-2.0",
        "Alpha-VLLM/Lumina-mGPT-2.0",
        4.0,
        dict(width=64, height=32),
    ),
    # Omni's edits: a dual panel whose upper half is the reference
    Fixture(
        "lumina2",
        _lumina2_omni,
        "Lumina-mGPT-2.0-Omni",
        "Alpha-VLLM/Lumina-mGPT-2.0",
        4.0,
        dict(width=32, height=32),
        broken=None,
        edits=_lumina2_edits,
    ),
    Fixture(
        "glm_image",
        _glm_image,
        "GLM-Image",
        "zai-org/GLM-Image",
        1.0,
        dict(width=64, height=96),
        broken=_glm_image_broken,
        edits=_glm_image_edits,
    ),
]


@pytest.fixture(scope="module", params=FIXTURES, ids=[f.name for f in FIXTURES])
def family(request, tmp_path_factory):
    spec = request.param
    folder = spec.write(str(tmp_path_factory.mktemp("models") / spec.name))
    return spec, folder, load_model(folder, **spec.size)


def test_family_is_detected_and_loaded(family):
    spec, folder, adapter = family
    assert detect_family(folder) == spec.family
    assert adapter.layout.grid.numel() > 0 and adapter.default_sampling.cfg_scale == spec.cfg
    # what the web extension greys Tokens to Image's DiT widgets by (registry.pixels_source, nodes'
    # /sjdvp/pixels)
    assert adapter.pixels_apart == (spec.family in DIT_FAMILIES) == (pixels_source(folder) == "dit")


def test_family_greedy_sjd_equals_ar_on_chains_and_trees(family):
    spec, _, adapter = family
    assert_greedy_sjd_equals_ar(
        adapter, list(spec.prompts), windows=(4, 16), cfg_scales=(1.0, spec.cfg)
    )
    assert spec.freed(adapter)


def test_family_automatic_window_is_exact(family, tmp_path, monkeypatch):
    """The nodes' default, the automatic window (and tree where the family scores trees), measured
    from the family's example condition on this device: greedy, its plans switching between
    chains and trees, it returns AR's tokens."""
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    spec, _, adapter = family
    sampling, n = (
        SamplingSettings(cfg_scale=spec.cfg, greedy=True, temperature=0.0),
        len(spec.prompts),
    )
    ar = decode(adapter, list(spec.prompts), method_settings("ar", 1, sampling, batch_size=n))
    res = decode(
        adapter,
        list(spec.prompts),
        method_settings("sjd-vp", 32, sampling, batch_size=n, auto=True, auto_tree=adapter.trees),
    )
    assert torch.equal(res.tokens, ar.tokens) and res.stats.pass_cost.source.startswith(
        "measured on"
    )
    assert res.stats.forward_passes <= ar.stats.forward_passes


@pytest.mark.parametrize(
    "tree", [TreeSettings(), TreeSettings(width=3, depth=2)], ids=["chain", "tree"]
)
def test_family_captured_pass_gives_the_plain_tokens(family, tree, replayed_on_cpu):
    """The model's pass recorded per shape and replayed from static buffers (engine/captured.py; on
    the CPU through tests/helpers/static_replay.py) decodes the eager pass's tokens: greedy and
    sampled, chains and trees, with CFG rows and a batch of two; the report says it was captured."""
    spec, _, adapter = family
    if tree.on and not adapter.trees:
        pytest.skip(f"{spec.name} scores no trees")
    n = len(spec.prompts)
    for sampling in (
        SamplingSettings(cfg_scale=spec.cfg, greedy=True, temperature=0.0),
        SamplingSettings(cfg_scale=spec.cfg, top_k=8),
    ):
        settings = method_settings("sjd-vp", 6, sampling, seed=3, batch_size=n, tree=tree)
        eager = decode(adapter, list(spec.prompts), replace(settings, passes="eager"))
        recorded = decode(adapter, list(spec.prompts), settings)
        assert torch.equal(recorded.tokens, eager.tokens), sampling
        assert eager.stats.passes == "eager, as asked"
        assert (
            recorded.stats.passes.startswith("captured: ")
            and " 0 replays" not in recorded.stats.passes
        )


def test_family_refuses_a_prompt_past_its_positions(family):
    """A prompt that leaves the image no room within the positions the model was trained on is
    refused by name before anything decodes (transformers runs past them without a word)."""
    spec, _, adapter = family
    if not getattr(adapter, "sequential_positions", False):
        pytest.skip(f"{spec.name}: prompts are class names, or positions follow the image's grids")
    too_long = " ".join(["fox"] * adapter.text_config.max_position_embeddings)
    with pytest.raises(
        ValueError, match=r"the prompt is \d+ tokens; .*has room for \d+\. Shorten it"
    ):
        decode(adapter, too_long, method_settings("sjd", 4, adapter.default_sampling))
    # a prompt that fits still does
    assert adapter.prompt_length([spec.prompts[0]], None, spec.cfg > 1) > 0


def test_family_edits_keep_the_law_or_are_refused(family):
    """Editing is a capability of the contract. A family that takes reference images decodes greedy
    SJD and SJD-VP to AR's tokens with them, on chains and trees, its tree forward equals its
    branches' forwards with them, LANTERN-VP and GSD-VP decode them, and a reference too small for
    its encoder is named. A family
    that takes none refuses an edit by name before anything decodes."""
    spec, _, adapter = family
    settings = method_settings("sjd", 4, adapter.default_sampling)
    if spec.edits is None and adapter.takes_images:
        # Lumina-mGPT 2.0's: its dual-panel request needs more positions than this fixture has
        assert any(f.family == spec.family and f.edits for f in FIXTURES), spec.name
        pytest.skip(f"{spec.name}'s edits are checked on another fixture of its family")
    if spec.edits is None:
        assert not adapter.takes_images
        edit = Edit(str(spec.prompts[0]), (torch.rand(16, 16, 3),))
        with pytest.raises(
            ValueError, match=f"{re.escape(adapter.family)} does not take reference"
        ):
            decode(adapter, [edit], settings)
        return
    assert adapter.takes_images
    edits = spec.edits()
    assert_greedy_sjd_equals_ar(adapter, edits, windows=(4, 16), cfg_scales=sorted({1.0, spec.cfg}))
    assert_tree_matches_chains(adapter, edits, spec.cfg > 1)
    # the relaxed verifiers draft and verify edits too (their law is not the model's: no equality)
    for method in ("lantern-vp", "gsd-vp"):
        settings = method_settings(method, 8, adapter.default_sampling, batch_size=len(edits))
        codes = decode(adapter, edits, settings).codes
        assert (
            codes.shape[0] == len(edits)
            and 0 <= int(codes.min())
            and int(codes.max()) < (adapter.layout.image_tokens.numel())
        )
    small = Edit(edits[0].text, (edits[0].images[0][:4, :4],))
    with pytest.raises(ValueError, match=r"reference images \(4x4 px\)"):
        decode(adapter, [small], settings)


def test_family_tree_forward_equals_its_chains(family):
    spec, _, adapter = family
    assert_tree_matches_chains(adapter, list(spec.prompts), spec.cfg > 1)


@torch.no_grad()
def test_family_decode_image_is_an_image(family):
    spec, _, adapter = family
    sampling = SamplingSettings(cfg_scale=spec.cfg, top_k=8)
    res = decode(adapter, list(spec.prompts), method_settings("sjd-vp", 8, sampling, batch_size=2))
    # a VQ decoder ignores it
    image = adapter.decode_image(res.codes, PixelSettings(spec.prompts, steps=2))
    h, w = adapter.layout.grid.shape
    assert res.codes.shape == (2, h, w) and image.shape[0] == 2 and image.shape[3] == 3
    assert image.dtype == torch.float32 and 0 <= float(image.min()) and float(image.max()) <= 1


def test_family_missing_files_are_named(family, tmp_path):
    spec, folder, _ = family
    if spec.broken is None:
        pytest.skip(
            f"{spec.name}'s files are named by tests/models/{spec.family}/test_{spec.family}_original.py"
        )
    for path, message in spec.broken(folder, tmp_path):
        with pytest.raises(CheckpointError, match=message) as err:
            load_model(path, **spec.size)
        assert spec.repo in str(err.value), str(err.value)


def test_family_check_command_finds_no_problem(family):
    spec, folder, _ = family
    out = io.StringIO()
    check(folder, out=out, **spec.size)
    found = [
        line.split("PROBLEM", 1)[1].strip()
        for line in out.getvalue().splitlines()
        if "PROBLEM" in line
    ]
    assert found == list(spec.problems), out.getvalue()
    assert f"detected: {spec.family}" in out.getvalue()
