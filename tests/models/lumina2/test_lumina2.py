"""Lumina-mGPT 2.0: a tiny random folder laid out as Alpha-VLLM/Lumina-mGPT-2.0 is (Qwen-style
tokenizer with Lumina's special tokens from id 151665, image codes from id 155000, MoVQGAN-270M's
plain checkpoint in movqgan/), loaded through the user-facing loader: detection by vocabulary,
upstream's prompt, BOS rule and image-only guidance branch; f8 rows closed by the row end where
upstream's processor forces it; greedy SJD == AR == upstream's unbatched-CFG loop; rollback ==
recompute; trees; sizes up to the positions; the tokenizer pitfalls and missing files explained.
Every shared test runs on both tokenizer shapes: the image ids without entries, and listed as
`<MOVQGAN...>` added tokens (the release's likely shape)."""

import json
import os
import shutil

import pytest
import torch

from sjdvp_core import decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.hf_adapter import read_tensor
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.lumina.adapter import IMAGE_START, resolution_token
from sjdvp_core.models.lumina2.adapter import IMAGE_BASE, Lumina2Adapter
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.lumina_reference import (
    assert_ar_equals_upstream_unbatched_cfg,
    assert_lumina_windows_match_recompute,
    upstream_allowed,
)
from tests.helpers.tiny_hf import PROMPTS, assert_greedy_sjd_equals_ar
from tests.helpers.tiny_lumina2 import CODES, write_lumina2

WIDE = dict(width=64, height=32)  # 4 rows of 8 codes (+ row ends) at the tiny f8 MoVQGAN


LISTED = "<MOVQGAN_{}>"


@pytest.fixture(
    scope="module", params=[None, LISTED], ids=["image-ids-unlisted", "image-ids-listed"]
)
def folder(tmp_path_factory, request):
    return write_lumina2(
        str(tmp_path_factory.mktemp("models") / "Lumina-mGPT-2.0"), image_names=request.param
    )


@pytest.fixture(scope="module")
def adapter(folder):
    return load_model(folder, **WIDE)


def test_lumina2_folder_is_detected_listed_and_loaded(folder, adapter):
    assert detect_family(folder) == "lumina2"
    assert list_models([folder + "/.."]) == ["demo", "Lumina-mGPT-2.0"]
    assert isinstance(adapter, Lumina2Adapter) and adapter.family == "Lumina-mGPT 2.0"
    assert adapter.default_sampling == SamplingSettings(cfg_scale=4.0, top_k=4096)
    assert adapter.layout.grid.shape == (4, 8) and adapter.layout.length == 4 * 9 + 1
    assert adapter.layout.image_tokens.tolist() == list(range(IMAGE_BASE, IMAGE_BASE + CODES))
    assert torch.equal(adapter.codebook(), adapter.movq.quantize.embedding.weight)
    # [1, D]: one model-parallel shard
    stored = read_tensor(folder, "model.layers.1.self_attn.q_norm.weight")
    assert stored.shape == (1, 8) and torch.equal(
        adapter.model.model.layers[1].self_attn.q_norm.weight, stored.expand(2, 8)
    )
    # Lumina's special tokens keep the ids past Qwen's vocabulary that upstream hardcodes
    tok = adapter.tokenizer
    assert [tok.id(n) for n in ("<racm3:break>", "<eoss>", "<reserved08799>")] == [
        151665,
        151666,
        151670,
    ]


def test_lumina2_prompt_bos_and_image_only_guidance_branch(adapter):
    tok = adapter.tokenizer
    # height, then width
    prefix = [
        tok.id(IMAGE_START),
        tok.id(resolution_token(1)),
        tok.id(resolution_token(2)),
    ]
    cond, uncond = adapter.prompt_ids(["a red fox"], None, cfg=True)
    text = "Generate an image of 64x32 according to the following prompt:\na red fox<reserved08706>"
    # Qwen's tokenizer_config.json has no bos_token: xllmx's Tokenizer takes the eos_token instead
    assert cond == [tok.id("<|endoftext|>")] + tok.encode(text) + prefix
    assert uncond == prefix
    with pytest.raises(ValueError, match="Lumina-mGPT 2.0's guidance branch sees only the image"):
        adapter.prompt_ids(["a red fox"], ["blurry"], cfg=True)


def test_lumina2_bos_token_when_the_tokenizer_names_one(folder, tmp_path):
    other = shutil.copytree(folder, tmp_path / "Lumina-mGPT-2.0")
    config = json.loads((other / "tokenizer_config.json").read_text())
    config["bos_token"] = {"content": "<|im_start|>", "special": True}
    (other / "tokenizer_config.json").write_text(json.dumps(config))
    assert load_model(str(other), **WIDE).prompt_ids(["a"], None, cfg=False)[0][0] == 151644


def test_lumina2_forced_tokens_sit_where_upstream_puts_them(adapter):
    """Upstream's MultiModalLogitsProcessor at h_latent, w_latent = 4 x the resolution tokens'
    grids."""
    layout = adapter.layout
    image_ids = list(range(IMAGE_BASE, IMAGE_BASE + CODES))
    allowed = upstream_allowed(adapter.tokenizer, image_ids, 1 * 4, 2 * 4, layout.length)
    for j, ids in enumerate(allowed):
        assert (ids == image_ids) == (int(layout.forced[j]) < 0)
        assert ids == image_ids or ids == [int(layout.forced[j])], j


def test_lumina2_greedy_sjd_equals_ar(adapter):
    assert_greedy_sjd_equals_ar(adapter, PROMPTS, windows=(4, 16), cfg_scales=(1.0, 4.0))


def test_lumina2_ar_equals_upstream_unbatched_cfg(adapter):
    """At upstream's default (constant) scale 4; the image ids are 155000 + code, the rows f8."""
    assert_ar_equals_upstream_unbatched_cfg(adapter, PROMPTS[0], 4.0)


def test_lumina2_windows_with_rollback_match_recompute(adapter):
    assert_lumina_windows_match_recompute(adapter)


@torch.no_grad()
def test_lumina2_decode_image_with_movqgan(adapter):
    res = decode(
        adapter,
        PROMPTS,
        method_settings("sjd-vp", 8, SamplingSettings(cfg_scale=4.0, top_k=8), batch_size=2),
    )
    image = adapter.decode_image(res.codes)
    assert res.codes.shape == (2, 4, 8) and image.shape == (2, 32, 64, 3)
    expected = ((adapter.movq.decode_code(res.codes) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    assert torch.allclose(image, expected, atol=1e-6)


def test_lumina2_sizes_up_to_the_positions(adapter):
    """Any multiple of 32 px whose sequence fits: the tiny model has 160 positions (the release
    10,240)."""
    assert adapter.with_size(128, 32).layout.grid.shape == (4, 16)
    assert adapter.with_size(64, 64).layout.length == 8 * 9 + 1
    with pytest.raises(ValueError, match="multiples of 32 px"):
        adapter.with_size(48, 32)
    with pytest.raises(
        ValueError,
        match=r"96x96 px needs 157 image tokens per row; Lumina-mGPT 2\.0 has 160 "
        r"positions.*64x64 at this aspect ratio, 64x64 square",
    ):
        adapter.with_size(96, 96)
    # 768 px does not fit: the largest square does
    loaded = load_model(adapter.tokenizer.path.rsplit("/", 1)[0])
    assert (loaded.width, loaded.height) == (64, 64)


def test_lumina2_tokenizer_whose_ids_leave_a_gap_is_refused(tmp_path):
    """The tokenizers library renumbers added tokens whose ids leave a gap after the base
    vocabulary, silently: <racm3:break> would become another id, and every image prompt a wrong
    one."""
    cut = write_lumina2(str(tmp_path / "Lumina-mGPT-2.0"), gap=True, movqgan=False)
    with pytest.raises(
        CheckpointError,
        match=r"<\|endoftext\|> is 151643 in the file, 150643 as read.*download "
        r"tokenizer\.json again from Alpha-VLLM/Lumina-mGPT-2\.0",
    ):
        load_model(cut)


def test_lumina2_missing_movqgan_says_where_it_goes(folder, tmp_path):
    bare = shutil.copytree(
        folder, tmp_path / "Lumina-mGPT-2.0", ignore=shutil.ignore_patterns("movqgan")
    )
    with pytest.raises(
        CheckpointError,
        match=r"movqgan_270M\.ckpt missing.*https://huggingface\.co/ai-forever/"
        r"MoVQGAN into .*Lumina-mGPT-2\.0/movqgan",
    ):
        load_model(str(bare))
    upstream = bare / "movqgan" / "270M"  # upstream's README puts it at movqgan/270M/
    upstream.mkdir(parents=True)
    shutil.copy(folder + "/movqgan/movqgan_270M.ckpt", upstream)
    assert load_model(str(bare), **WIDE).movq.config.n_embed == CODES


@pytest.mark.parametrize("names", [LISTED, "<img{:05d}>"])
def test_lumina2_tokenizer_listing_the_image_ids_loads_and_says_so(tmp_path, names):
    """The ids are the contract, the names a check: any one pattern of special names counting
    with the code."""
    folder = write_lumina2(str(tmp_path / "Lumina-mGPT-2.0"), image_names=names)
    facts = dict((what, detail) for what, detail, _ in load_model(folder, **WIDE).facts())
    assert facts["image ids"].startswith(
        f"codes 0..31 are ids 155000..155031, 32 of them listed as image tokens in "
        f"the tokenizer ({names.format(0)} .. {names.format(31)})"
    )


def _edit_tokenizer(folder, change) -> None:
    path = os.path.join(folder, "tokenizer.json")
    data = json.load(open(path))
    change(data)
    json.dump(data, open(path, "w"))


def _swap_two_image_names(data):
    image = [t for t in data["added_tokens"] if t["id"] >= IMAGE_BASE]
    image[3]["content"], image[4]["content"] = image[4]["content"], image[3]["content"]


def _text_at_the_image_ids(data):
    """A vocabulary that runs on through the image ids (its specials also in it, as converted
    files have them)."""
    data["added_tokens"] = [t for t in data["added_tokens"] if t["id"] < IMAGE_BASE]
    data["model"]["vocab"].update({t["content"]: t["id"] for t in data["added_tokens"]})
    data["model"]["vocab"].update({f"word{c}": IMAGE_BASE + c for c in range(CODES)})


def _an_image_token_elsewhere(data):
    data["added_tokens"][-1]["content"] = "<MOVQGAN_extra>"
    data["added_tokens"][-40]["content"] = "<MOVQGAN_31>"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            _swap_two_image_names,
            r"2 entries at the image ids 155000\.\.155031 are not image tokens \('<MOVQGAN_4>' at "
            r"155003, '<MOVQGAN_3>' at 155004\); the ids moved",
        ),
        (
            _text_at_the_image_ids,
            r"32 of them are text tokens here \('word0' at 155000, 'word1' at 155001",
        ),
        (
            _an_image_token_elsewhere,
            r"image token <MOVQGAN_31> is id 154992 \(1 outside 155000\.\.155031\).*the ids "
            r"moved",
        ),
    ],
    ids=["renumbered", "text", "image-name-elsewhere"],
)
def test_lumina2_tokenizer_with_text_or_moved_entries_at_the_image_ids_is_refused(
    tmp_path, change, message
):
    folder = write_lumina2(str(tmp_path / "Lumina-mGPT-2.0"), image_names=LISTED)
    _edit_tokenizer(folder, change)
    with pytest.raises(CheckpointError, match=message):
        load_model(folder, **WIDE)


def test_lumina2_vocabulary_map_naming_image_tokens_at_other_ids_is_refused(tmp_path):
    """Upstream's Jacobi sampler takes its image vocabulary from config.json's `<MOVQGAN` names."""
    folder = write_lumina2(str(tmp_path / "Lumina-mGPT-2.0"), image_names=LISTED)
    config = json.load(open(os.path.join(folder, "config.json")))
    config["vocabulary_map"]["<MOVQGAN_0>"] = 151000
    json.dump(config, open(os.path.join(folder, "config.json"), "w"))
    with pytest.raises(CheckpointError, match=r"image token <MOVQGAN_0> is id 151000"):
        load_model(folder, **WIDE)
