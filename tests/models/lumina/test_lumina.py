"""Lumina-mGPT 1.0: Meta's Chameleon VQGAN from its official file layout, and a tiny random model
folder laid out as Alpha-VLLM/Lumina-mGPT-7B-* is, loaded through the user-facing loader:
upstream's prompt, image prefix and image-only CFG branch; row ends and end of image forced where
upstream's processor forces them; AR == upstream's unbatched-CFG loop; rollback == recompute;
decoded images; sizes and the VQGAN's files explained. The contract every family keeps is
test_family_contract.py's."""

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from sjdvp_core import DecodeSettings, WindowSettings, decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.hf_adapter import read_tensor
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.lumina.adapter import (
    IMAGE_START,
    LuminaAdapter,
    image_token_ids,
    resolution_token,
    supported_sizes,
    trained_size,
)
from sjdvp_core.models.lumina.vqgan import ChameleonVQGAN, VQGANConfig, load_vqgan
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.lumina_reference import (
    assert_ar_equals_upstream_unbatched_cfg,
    assert_lumina_windows_match_recompute,
    upstream_allowed,
)
from tests.helpers.tiny_hf import PROMPTS, byte_bpe_tokenizer
from tests.helpers.tiny_lumina import CODES, write_lumina

WIDE = dict(width=64, height=32)  # 2 rows of 4 codes (+ row ends) at the tiny f16 VQGAN


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # "trained" at 64 px
    return write_lumina(str(tmp_path_factory.mktemp("models") / "Lumina-mGPT-tiny-64"))


@pytest.fixture(scope="module")
def adapter(folder):
    return load_model(folder, **WIDE)


def test_vqgan_loads_the_official_layout_and_decodes(folder):
    # Lightning checkpoint: encoder and loss keys are skipped
    vq = load_vqgan(folder + "/tokenizer")
    assert vq.config == VQGANConfig(
        n_embed=CODES,
        embed_dim=8,
        ch=32,
        ch_mult=(1, 1, 1, 1, 1),
        num_res_blocks=1,
        z_channels=32,
        resolution=64,
    )
    image = vq.decode_code(torch.randint(0, CODES, (2, 4, 3)))
    assert image.shape == (2, 3, 64, 48)


def test_vqgan_matches_the_released_architecture():
    """Key names and shapes of Meta's vqgan.ckpt (taming's VQModel, ch 128, ch_mult 1 1 2 2 4)."""
    with torch.device("meta"):
        state = ChameleonVQGAN(VQGANConfig()).state_dict()
    shapes = {
        "quantize.embedding.weight": (8192, 256),
        "post_quant_conv.weight": (256, 256, 1, 1),
        "decoder.conv_in.weight": (512, 256, 3, 3),
        "decoder.mid.attn_1.proj_out.weight": (512, 512, 1, 1),
        "decoder.up.4.block.0.conv1.weight": (512, 512, 3, 3),
        "decoder.up.4.upsample.conv.weight": (512, 512, 3, 3),
        "decoder.up.3.block.0.nin_shortcut.weight": (256, 512, 1, 1),
        "decoder.up.0.block.2.conv2.weight": (128, 128, 3, 3),
        "decoder.norm_out.weight": (128,),
        "decoder.conv_out.weight": (3, 128, 3, 3),
    }
    assert {k: tuple(state[k].shape) for k in shapes} == shapes
    # no attn_resolutions
    assert not any(k.startswith("decoder.up.0.upsample") or ".attn." in k for k in state)
    # 5 levels of 3 blocks (8 tensors each), 4 upsamples, 2 channel-changing shortcuts
    assert sum(1 for k in state if k.startswith("decoder.up.")) == 5 * 3 * 8 + 4 * 2 + 2 * 2


def test_folder_is_detected_listed_and_loaded(folder, adapter):
    assert detect_family(folder) == "lumina"
    assert list_models([folder + "/.."]) == ["demo", "Lumina-mGPT-tiny-64"]
    assert isinstance(adapter, LuminaAdapter) and adapter.family == "Lumina-mGPT"
    assert adapter.layout.grid.shape == (2, 4) and adapter.layout.length == 2 * 5 + 1
    assert adapter.default_sampling == SamplingSettings(cfg_scale=4.0, top_k=2000)
    names = [adapter.tokenizer.tok.id_to_token(int(t)) for t in adapter.layout.image_tokens]
    # local id == code
    assert names == [f"IMGIMG{''.join(chr(65 + int(d)) for d in str(c))}Z" for c in range(CODES)]
    img2bpe = adapter.model.model.vocabulary_mapping.img2bpe  # transformers' reading of config.json
    assert adapter.layout.image_tokens.tolist() == [img2bpe[c] for c in range(CODES)]
    with (
        torch.device("meta"),
        pytest.raises(CheckpointError, match="16 IMGIMG image tokens do not fit the VQGAN"),
    ):
        image_token_ids(adapter.tokenizer, ChameleonVQGAN(VQGANConfig()))
    assert torch.equal(adapter.codebook(), adapter.vqgan.quantize.embedding.weight)
    # [1, D]: one model-parallel shard
    stored = read_tensor(folder, "model.layers.1.self_attn.k_norm.weight")
    loaded = adapter.model.model.layers[1].self_attn.k_norm.weight  # [H, D]: per head
    assert stored.shape == (1, 8) and torch.equal(loaded, stored.expand(4, 8))


def test_sizes_follow_the_training_crop_list(folder):
    assert trained_size("models/Lumina-mGPT-7B-768-Omni") == 768 and trained_size("lumina/") is None
    assert (
        trained_size("Lumina-mGPT-7B-1024") == 1024 and trained_size("Lumina-mGPT-34B-512") == 512
    )
    assert (768, 768) in supported_sizes(768) and (1536, 384) in supported_sizes(768)
    # at most 4:1
    assert (384, 1536) in supported_sizes(768) and (1600, 384) not in supported_sizes(768)
    assert load_model(folder).layout.grid.shape == (4, 4)  # default: the trained size, 64 x 64
    with pytest.raises(
        ValueError, match="not a size Lumina-mGPT trained at 64 px generates.*64x32"
    ):
        load_model(folder, width=64, height=48)


def test_prompt_and_image_only_guidance_branch(adapter):
    tok = adapter.tokenizer
    # height, then width
    prefix = [
        tok.id(IMAGE_START),
        tok.id(resolution_token(1)),
        tok.id(resolution_token(2)),
    ]
    cond, uncond = adapter.prompt_ids(["a red fox"], None, cfg=True)
    text = "Generate an image of 64x32 according to the following prompt:\na red fox<reserved08706>"
    assert cond == [tok.id("<s>")] + tok.encode(text) + prefix
    assert uncond == prefix
    with pytest.raises(ValueError, match="negative prompt"):
        adapter.prompt_ids(["a red fox"], ["blurry"], cfg=True)


def test_forced_tokens_sit_where_upstream_puts_them(adapter):
    layout = adapter.layout
    image_ids = sorted(layout.image_tokens.tolist())
    allowed = upstream_allowed(adapter.tokenizer, image_ids, 2, 4, layout.length)
    for j, ids in enumerate(allowed):
        assert (ids == image_ids) == (int(layout.forced[j]) < 0)
        assert ids == image_ids or ids == [int(layout.forced[j])], j


def test_ar_equals_upstream_unbatched_cfg(adapter):
    assert_ar_equals_upstream_unbatched_cfg(adapter, PROMPTS[0], 3.0)


def test_windows_with_rollback_match_recompute(adapter):
    assert_lumina_windows_match_recompute(adapter)


@torch.no_grad()
def test_decode_image(adapter):
    res = decode(
        adapter,
        PROMPTS,
        method_settings("sjd", 8, SamplingSettings(cfg_scale=3.0, top_k=8), batch_size=2),
    )
    image = adapter.decode_image(res.codes)
    assert res.codes.shape == (2, 2, 4) and image.shape == (2, 32, 64, 3)
    assert image.min() >= 0 and image.max() <= 1
    expected = ((adapter.vqgan.decode_code(res.codes) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    assert torch.allclose(image, expected, atol=1e-6)


def test_other_shape_mismatches_are_errors(folder, tmp_path):
    broken = shutil.copytree(folder, tmp_path / "Lumina-mGPT-tiny-64")
    shard = next(p for p in broken.glob("*.safetensors") if "model.norm.weight" in load_file(p))
    state = load_file(shard)
    state["model.norm.weight"] = state["model.norm.weight"][:1]
    save_file(state, shard)
    with pytest.raises(
        CheckpointError, match=r"model\.norm\.weight is stored as \(1,\).*needs \(32,\)"
    ):
        load_model(str(broken), **WIDE)


def test_a_1_0_config_with_a_foreign_vocabulary_is_refused_with_a_reason(folder, tmp_path):
    """1.0's config.json (IMGIMG names in its vocabulary map) beside a Qwen-style tokenizer
    without them."""
    v2 = shutil.copytree(folder, tmp_path / "Lumina-mGPT-2.0")
    byte_bpe_tokenizer(str(v2), ["<|endoftext|>", "<racm3:break>", "<eoss>", "<reserved08799>"])
    with pytest.raises(CheckpointError, match="so not Lumina-mGPT 1.0. A Lumina-mGPT 2.0 folder"):
        load_model(str(v2))


class Evil:
    """An arbitrary object in a pickle: loading must refuse it, not run its reduce hooks."""


def test_vqgan_files_missing_or_wrong_say_what_to_do(folder, tmp_path):
    bare = tmp_path / "Lumina-mGPT-tiny-64"
    shutil.copytree(folder, bare, ignore=shutil.ignore_patterns("tokenizer"))
    with pytest.raises(
        CheckpointError,
        match=r"vqgan\.yaml and vqgan\.ckpt missing.*Meta's\s+Chameleon release.*"
        r"Lumina-mGPT-tiny-64/tokenizer",
    ) as err:
        load_model(str(bare))
    assert "tokenizer/ folder" in str(err.value)
    # the files may also sit in the model folder
    shutil.copytree(folder + "/tokenizer", bare, dirs_exist_ok=True)
    assert load_model(str(bare), **WIDE).vqgan.config.n_embed == CODES
    (bare / "vqgan.yaml").write_text("model: {}\n")
    with pytest.raises(CheckpointError, match=r"vqgan\.yaml: is not a VQGAN config"):
        load_model(str(bare))
    shutil.copy(folder + "/tokenizer/vqgan.yaml", bare / "vqgan.yaml")
    torch.save({"state_dict": {"decoder.conv_in.weight": Evil()}}, bare / "vqgan.ckpt")
    # never unpickled
    with pytest.raises(
        CheckpointError, match=r"holds Python objects \((tests\.)?test_lumina\.Evil\)"
    ):
        load_model(str(bare))
    torch.save({"state_dict": {"decoder.conv_in.weight": torch.zeros(1)}}, bare / "vqgan.ckpt")
    with pytest.raises(CheckpointError, match=r"does not match Meta's Chameleon VQGAN.*missing"):
        load_model(str(bare))
    (bare / "vqgan.ckpt").unlink()  # a checkpoint converted to safetensors loads too
    state = torch.load(folder + "/tokenizer/vqgan.ckpt", weights_only=True)["state_dict"]
    save_file(state, bare / "vqgan.safetensors")
    assert load_model(str(bare), **WIDE).vqgan.config.n_embed == CODES


def test_with_size_changes_the_grid_and_keeps_the_model(adapter):
    tall = adapter.with_size(32, 64)
    assert tall.layout.grid.shape == (4, 2) and adapter.layout.grid.shape == (2, 4)
    assert tall.module is adapter.module and tall.image_prefix != adapter.image_prefix
    res = decode(
        tall,
        PROMPTS[0],
        DecodeSettings(window=WindowSettings(4), sampling=SamplingSettings(greedy=True)),
    )
    assert tall.decode_image(res.codes).shape == (1, 64, 32, 3)
    with pytest.raises(ValueError, match="not a size"):
        adapter.with_size(48, 48)


def test_trained_size_is_given_or_read_from_the_name_else_warned(folder, tmp_path, caplog):
    from sjdvp_core.models.lumina.adapter import _trained_from_name

    renamed = shutil.copytree(folder, tmp_path / "my-lumina")
    with caplog.at_level("WARNING"):
        assert _trained_from_name(str(renamed)) == 768  # the main release's size
    assert (
        "does not say which size" in caplog.text
        and "Lumina-mGPT-7B-512, -768 or -1024" in caplog.text
    )
    caplog.clear()
    with caplog.at_level("WARNING"):
        # given: no warning, its sizes
        assert load_model(str(renamed), trained=64).layout.grid.shape == (
            4,
            4,
        )
    assert not [r for r in caplog.records if r.name.startswith("sjdvp")]
    with pytest.raises(ValueError, match="trained=100"):
        load_model(str(renamed), trained=100)


def test_chameleon_and_anole_folders_are_not_taken_for_lumina(folder, tmp_path):
    import json

    for name, architectures in (
        ("chameleon-7b", ["ChameleonForConditionalGeneration"]),
        ("anole", None),
    ):
        other = shutil.copytree(folder, tmp_path / name)
        config = json.loads((other / "config.json").read_text())
        config["architectures"] = architectures
        (other / "config.json").write_text(json.dumps(config))
        with pytest.raises(ValueError, match="a Chameleon-type model .* not Lumina-mGPT"):
            load_model(str(other))
        assert name in list_models([str(tmp_path)])  # listed, so choosing it shows why


def test_vqgan_extra_tensors_are_listed_not_fatal(folder, tmp_path, caplog):
    ckpt = torch.load(folder + "/tokenizer/vqgan.ckpt", weights_only=True)
    # e.g. a later taming version's buffer
    ckpt["state_dict"]["decoder.up.0.extra_scale"] = torch.ones(3)
    where = shutil.copytree(folder + "/tokenizer", tmp_path / "tokenizer")
    torch.save(ckpt, where / "vqgan.ckpt")
    with caplog.at_level("WARNING"):
        vq = load_vqgan(str(where))
    assert "ignoring 1 tensors the decoder does not use: decoder.up.0.extra_scale" in caplog.text
    assert torch.equal(vq.codebook(), ckpt["state_dict"]["quantize.embedding.weight"])
