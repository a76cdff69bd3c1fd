"""Emu3 in its original release layout (BAAI/Emu3-Gen with BAAI/Emu3-VisionTokenizer), loaded
without remote code: a tiny random model written twice, as transformers' converter writes
BAAI/Emu3-Gen-hf and in the original layout (upstream's config fields, a tiktoken rank file with
the specials and vision tokens numbered after the ranks, original weight names in sharded
safetensors, the VisionTokenizer folder), so both folders must give the same ids, logits and
images (tests/helpers/tiny_emu3.py writes them, the original names by the inverse of the loader's
mapping). Size-string tests: the prompt's "H*W" is read digit by digit, as the original tokenizer
(and so training) split it, even when the tokenizer file merges digit runs."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from sjdvp_core import decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.emu3.adapter import BOI, BOS, EOL, WRAPPER, Emu3Adapter
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.tiny_emu3 import EXTRAS, SIZE, VISION, write_folders

PROMPTS = ["a red fox in the snow", "3 cats (cute), 1990s café"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_folders(tmp_path_factory.mktemp("emu3"))


@pytest.fixture(scope="module")
def adapters(folders):
    hf, original, _ = folders
    return load_model(hf, **SIZE), load_model(original, **SIZE)


def test_original_folders_are_detected_and_listed_without_the_vision_tokenizer(folders, adapters):
    hf, original, sibling = folders
    assert detect_family(original) == detect_family(sibling) == "emu3"
    assert isinstance(adapters[1], Emu3Adapter) and (adapters[1].height, adapters[1].width) == (
        4,
        8,
    )
    # no vision_tokenizer
    assert sorted(list_models([os.path.dirname(hf)])) == [
        "Emu3-Gen",
        "Emu3-Gen-hf",
        "demo",
    ]
    # not Emu3-VisionTokenizer
    assert list_models([os.path.dirname(sibling)]) == [
        "demo",
        "Emu3-Gen",
    ]
    assert load_model(sibling, **SIZE).pixel_mean == [0.4] * 3  # the sibling's preprocessor


def test_original_vocabulary_gives_the_converted_ids(adapters):
    converted, original = adapters
    for name in ["<|endoftext|>", "<|im_end|>", *EXTRAS[1:], *VISION]:
        assert original.tokenizer.id(name) == converted.tokenizer.id(name), name
    # the converter's rename
    assert original.tokenizer.id("<|extra_0|>") == converted.tokenizer.id("<image>")
    assert original.model.config.image_token_id == converted.model.config.image_token_id
    assert torch.equal(original.layout.image_tokens, converted.layout.image_tokens)
    for cfg in (False, True):
        assert original.prompt_ids(PROMPTS, None, cfg) == converted.prompt_ids(PROMPTS, None, cfg)


def test_original_tokenizer_follows_upstreams_rules(adapters):
    """NFC first, one token per special name, PAT_STR's pieces (a letter run takes one leading
    symbol)."""
    tok = adapters[1].tokenizer
    assert tok.encode("cafe\u0301") == tok.encode("café")
    assert tok.encode(f"{BOS}{EOL}<|visual token 000003|>") == [
        tok.id(BOS),
        tok.id(EOL),
        tok.id(VISION[6]),
    ]
    pieces = tok.tok.pre_tokenizer.pre_tokenize_str("(cats) don't 1990")
    assert [p for p, _ in pieces] == ["(cats", ")", "Ġdon", "'t", "Ġ", "1", "9", "9", "0"]


def test_size_string_is_read_digit_by_digit_even_where_the_tokenizer_merges_digits(
    folders, adapters
):
    from tokenizers import Tokenizer

    # as the converter writes it
    raw = Tokenizer.from_file(os.path.join(folders[0], "tokenizer.json"))
    merged = [raw.token_to_id(t) for t in ("90", "12", "10")]
    assert None not in merged and raw.encode("90*90").ids == [
        merged[0],
        raw.token_to_id("*"),
        merged[0],
    ]
    for adapter in adapters:
        tok = adapter.tokenizer
        digits = [tok.id(c) for c in "12*10"]
        tall = adapter.with_size(20, 24)  # 12 x 10 tokens at f2
        assert tall.image_prefix == f"{BOI}12*10{WRAPPER}"
        row = tall.prompt_ids(["a fox"], None, cfg=False)[0]
        assert row[-7:] == [tok.id(BOI), *digits, tok.id(WRAPPER)]
        assert not set(merged) & set(row)


@torch.inference_mode()
def test_original_logits_equal_the_converted(adapters):
    outs = []
    for adapter in adapters:
        layout, first = adapter.start(PROMPTS, None, True)
        window = layout.image_tokens[
            torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8], [9, 7, 9, 3]])
        ]
        outs.append((first, adapter.forward(window, torch.arange(4).expand(4, -1))))
        adapter.finish()
    for a, b in zip(*outs):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_original_decoded_images_equal_the_converted(adapters):
    converted, original = adapters
    res = decode(
        original,
        PROMPTS,
        method_settings("sjd", 8, SamplingSettings(cfg_scale=3.0, top_k=8), batch_size=2, seed=1),
    )
    image = original.decode_image(res.codes)
    assert image.shape == (2, 8, 16, 3) and original.pixel_mean == [0.4] * 3
    assert torch.allclose(image, converted.decode_image(res.codes), atol=1e-5)
    assert torch.equal(original.codebook(), converted.codebook())


def test_original_image_area_defaults_to_the_configs(folders):
    adapter = load_model(folders[1])  # config.json's image_area 144: 12 x 12 px -> 6 x 6 tokens
    assert (adapter.height, adapter.width) == (6, 6)


def _variant(folder, tmp_path, name, drop=()):
    d = tmp_path / name / "Emu3-Gen"
    shutil.copytree(folder, d, ignore=shutil.ignore_patterns(*drop))
    return d


def _drop_tensor(path, prefix):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(path))
    dropped = sorted(k for k in tensors if k.startswith(prefix))[0]
    del tensors[dropped]
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_original_missing_files_say_what_to_download(folders, tmp_path):
    original = folders[1]
    no_vision = _variant(original, tmp_path, "no_vision", drop=["vision_tokenizer"])
    with pytest.raises(CheckpointError, match="no Emu3 vision tokenizer") as err:
        load_model(str(no_vision), **SIZE)
    assert "BAAI/Emu3-VisionTokenizer" in str(err.value) and str(
        no_vision / "vision_tokenizer"
    ) in str(err.value)
    assert "Emu3-VisionTokenizer" in str(err.value).split(" (or into ")[1]

    no_shard = _variant(original, tmp_path, "no_shard", drop=["model-00002-of-00002.safetensors"])
    with pytest.raises(
        CheckpointError, match=r"missing model-00002-of-00002\.safetensors.*BAAI/Emu3-Gen "
    ):
        load_model(str(no_shard), **SIZE)

    no_vocab = _variant(original, tmp_path, "no_vocab", drop=["emu3.tiktoken"])
    with pytest.raises(CheckpointError, match=r"missing emu3\.tiktoken.*BAAI/Emu3-Gen "):
        load_model(str(no_vocab), **SIZE)

    partial = _variant(original, tmp_path, "partial")
    _drop_tensor(partial / "model-00001-of-00002.safetensors", "model.layers.")
    with pytest.raises(
        CheckpointError, match=r"lack 1 tensors \(model\.text_model\.layers\..*BAAI/Emu3-Gen$"
    ):
        load_model(str(partial), **SIZE)

    partial_vq = _variant(original, tmp_path, "partial_vq")
    _drop_tensor(partial_vq / "vision_tokenizer" / "model.safetensors", "decoder.")
    with pytest.raises(
        CheckpointError,
        match=r"vision_tokenizer: the weights lack 1 tensors \(model\.vqmodel\.decoder"
        r".*BAAI/Emu3-VisionTokenizer$",
    ):
        load_model(str(partial_vq), **SIZE)

    # JSON, but not the model's: a field of the wrong type, a config that is a list (was a traceback
    # from inside transformers' config classes)
    wrong_type = _variant(original, tmp_path, "wrong_type")
    config = json.loads((wrong_type / "config.json").read_text())
    (wrong_type / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "two"}))
    with pytest.raises(
        CheckpointError,
        match=r"the config\.json files: cannot be read as the model's configuration "
        r".*download the config\.json of BAAI/Emu3-Gen",
    ):
        load_model(str(wrong_type), **SIZE)
    a_list = _variant(original, tmp_path, "a_list")
    (a_list / "vision_tokenizer" / "config.json").write_text("[]")
    with pytest.raises(
        CheckpointError,
        match=r"vision_tokenizer/config\.json: cannot be read as the model's "
        r"configuration .*BAAI/Emu3-VisionTokenizer",
    ):
        load_model(str(a_list), **SIZE)


def test_a_vision_tokenizer_beside_the_model_under_any_name_is_found_and_named(folders, tmp_path):
    """People download with --local-dir and name folders as they like: the one sibling whose config
    is an Emu3 vision VQ is used (and the check says which); two are refused by name; other
    models are ignored."""
    import io

    from sjdvp_core.hub.check import check

    original = Path(folders[1])
    model = _variant(original, tmp_path, "renamed", drop=["vision_tokenizer"])
    shutil.copytree(original / "vision_tokenizer", model.parent / "Emu3-VisionTokenizer-original")
    shutil.copytree(folders[0], model.parent / "Emu3-Gen-hf")  # another model beside: not a VQ
    (model.parent / "notes").mkdir()
    assert load_model(str(model), **SIZE).vision_folder == str(
        model.parent / "Emu3-VisionTokenizer-original"
    )
    out = io.StringIO()
    assert check(str(model), run_forward=False, out=out) == 0, out.getvalue()
    assert f"vision tokenizer: {model.parent / 'Emu3-VisionTokenizer-original'}" in out.getvalue()
    # the VQs are not models
    assert sorted(list_models([str(model.parent)])) == [
        "Emu3-Gen",
        "Emu3-Gen-hf",
        "demo",
    ]
    shutil.copytree(original / "vision_tokenizer", model.parent / "emu3-vq-copy")
    with pytest.raises(
        CheckpointError,
        match=r"several folders beside it hold an Emu3 vision tokenizer "
        r"\(Emu3-VisionTokenizer-original, emu3-vq-copy\); move the one",
    ):
        load_model(str(model), **SIZE)


def test_original_folder_passes_the_check_with_its_size_string(folders):
    import io

    from sjdvp_core.hub.check import check

    out = io.StringIO()
    problems = check(folders[1], out=out)
    text = out.getvalue()
    assert problems == 0, text
    assert "vision_tokenizer/model.safetensors" in text and "<|image start|>" in text
    assert "('6', '6'" not in text and "'6'), (" in text  # "6*6": one token per digit
