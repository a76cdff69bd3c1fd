"""LlamaGen text-to-image: a tiny T5 encoder folder (config, safetensors, tokenizer.json) and a tiny
t2i GPT in the official key layout; captions left-padded and masked; greedy SJD == AR with CFG."""

import json

import pytest
import torch

from sjdvp_core import DecodeSettings, SamplingSettings, WindowSettings, decode
from sjdvp_core.models.llamagen.adapter import LlamaGenAdapter, load_gpt, load_vq
from sjdvp_core.models.llamagen.gpt import GPTConfig, LlamaGenGPT
from sjdvp_core.models.llamagen.t5_text import T5CaptionEncoder, left_pad
from tests.helpers.paths import TESTS
from tests.helpers.tiny_llamagen import random_t2i_gpt, random_vq, write_t5
from tests.helpers.tree_check import assert_tree_matches_chains


@pytest.fixture(scope="module")
def t5_folder(tmp_path_factory):
    return write_t5(tmp_path_factory.mktemp("flan-t5-xl"))


def test_left_pad_moves_valid_tokens_to_the_end():
    feats = torch.arange(1, 6).float().view(1, 5, 1).repeat(2, 1, 1)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]).bool()
    out, m = left_pad(feats, mask)
    assert out[0, :, 0].tolist() == [0, 0, 1, 2, 3] and m[0].tolist() == [
        False,
        False,
        True,
        True,
        True,
    ]
    assert out[1, :, 0].tolist() == [1, 2, 3, 4, 5] and m[1].all()


def test_t5_encoder_reads_a_local_folder(t5_folder, tmp_path):
    enc = T5CaptionEncoder(t5_folder)
    feats, mask = enc(["a red fox", "a blue sky in the snow"])
    assert feats.shape == (2, 120, 32) and mask.sum(1).tolist() == [4, 7]
    assert (feats[~mask] == 0).all()
    with pytest.raises(FileNotFoundError, match="download google/flan-t5-xl"):
        T5CaptionEncoder(str(tmp_path))


def test_t2i_greedy_sjd_equals_ar_and_padding_is_masked(t5_folder, tmp_path):
    gpt = random_t2i_gpt()
    gpt.cls_embedding.uncond_embedding.normal_()
    torch.save({"model": gpt.state_dict()}, tmp_path / "t2i_XL_stage1_256.pt")
    torch.save({"model": random_vq().state_dict()}, tmp_path / "vq_ds16_t2i.pt")
    loaded = load_gpt(str(tmp_path / "t2i_XL_stage1_256.pt"), image_tokens=16)
    assert loaded.config.model_type == "t2i" and loaded.config.cls_token_num == 120
    ad = LlamaGenAdapter(
        loaded, load_vq(str(tmp_path / "vq_ds16_t2i.pt")), text_encoder=T5CaptionEncoder(t5_folder)
    )
    prompts = ["a red fox in the snow", "a blue sky"]
    kw = dict(sampling=SamplingSettings(cfg_scale=5.0, greedy=True, temperature=0.0), batch_size=2)
    ar = decode(ad, prompts, DecodeSettings(window=WindowSettings(1), **kw)).tokens
    sjd = decode(ad, prompts, DecodeSettings(window=WindowSettings(8), **kw)).tokens
    assert torch.equal(ar, sjd)
    # its guidance branch is the learned empty caption
    with pytest.raises(ValueError, match="no negative prompt"):
        decode(ad, prompts, DecodeSettings(window=WindowSettings(8), **kw), negatives="blurry")
    # T5 would caption it "none"
    with pytest.raises(ValueError, match="needs a text prompt, got None"):
        decode(ad, [prompts[0], None], DecodeSettings(window=WindowSettings(8), **kw))
    assert_tree_matches_chains(ad, prompts, True)  # the tree mask keeps the caption padding masked
    # what sits in the masked padding does not matter
    feats, mask = ad.text_encoder(prompts)
    with torch.inference_mode():
        gpt_ = ad.gpt
        gpt_.setup_caches(2, prefix_valid=mask)
        a = gpt_.prefill(gpt_.embed_condition(feats))
        gpt_.setup_caches(2, prefix_valid=mask)
        b = gpt_.prefill(
            gpt_.embed_condition(torch.where(mask[..., None], feats, torch.randn_like(feats)))
        )
    assert torch.allclose(a, b, atol=1e-5)


def test_golden_captions_are_cleaned_as_upstream():
    """Prompts go through LlamaGen's caption cleaning (lower case, URLs, HTML, ids, ...), as
    recorded from upstream's T5Embedder.clean_caption in tests/golden/captions.json."""

    from sjdvp_core.models.llamagen.captions import clean_caption

    with open(TESTS / "golden" / "captions.json", encoding="utf-8") as f:
        golden = json.load(f)
    assert "FoundationVision/LlamaGen" in golden["source"]
    for caption, cleaned in golden["pairs"]:
        assert clean_caption(caption) == cleaned, caption


def test_the_encoder_sees_cleaned_captions_in_the_gpts_precision(t5_folder, tmp_path):
    from sjdvp_core.models.loading import load_model

    enc = T5CaptionEncoder(t5_folder)
    a, mask_a = enc(["A RED FOX in the <b>snow</b>"])
    b, mask_b = enc(["a red fox in the snow"])
    assert torch.equal(a, b) and torch.equal(mask_a, mask_b)
    torch.manual_seed(1)
    gpt = LlamaGenGPT(
        GPTConfig(
            dim=64,
            n_layer=1,
            n_head=1,
            vocab_size=64,
            block_size=16,
            model_type="t2i",
            caption_dim=32,
            cls_token_num=120,
        )
    )
    torch.save({"model": gpt.state_dict()}, tmp_path / "t2i_XL_stage1_256.pt")
    torch.save({"model": random_vq().state_dict()}, tmp_path / "vq_ds16_t2i.pt")
    import shutil

    shutil.copytree(t5_folder, tmp_path / "flan-t5-xl")
    ad = load_model(str(tmp_path), precision="bf16")  # what "auto" picks on a GPU with bf16
    assert (
        ad.text_encoder.model.dtype == torch.bfloat16
        and ad.gpt.output.weight.dtype == torch.bfloat16
    )
    feats, _ = ad.text_encoder(["a red fox"])
    assert feats.dtype == torch.float32  # the GPT's prefix casts them back to its own dtype


def test_t5_encoder_names_what_it_does_not_read(t5_folder, caplog):
    """Upstream's cleaning deletes Chinese characters and truncation cuts a long caption, both
    silently: a warning names what the model will not see; the features are what they were."""
    enc = T5CaptionEncoder(t5_folder, max_length=8)
    with caplog.at_level("WARNING"):
        feats, mask = enc(["a red fox", "红色 a red fox"])
    assert "deletes Chinese characters (红色)" in caplog.text and "'a red fox'" in caplog.text
    assert torch.equal(feats[0], feats[1]) and "T5 tokens" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        # 7 words fit
        feats, mask = enc(["a red fox in the snow blue sky a fox", "a red fox in the snow blue"])
    assert "read the first 7 T5 tokens of a prompt; this one has 10" in caplog.text
    assert "'sky a fox'" in caplog.text and caplog.text.count("not read") == 1
    assert torch.equal(feats[0], feats[1]) and mask.all()
    caplog.clear()
    with caplog.at_level("WARNING"):
        # said once per prompt, not per image and decode
        enc(["a red fox in the snow blue sky a fox"] * 2)
    assert not caplog.text
