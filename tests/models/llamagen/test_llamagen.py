"""LlamaGen: tiny random models written in the official layouts and key names, loaded through the
user-facing loader; rollback == recompute; clear errors (the family contract,
test_family_contract.py, runs the rest)."""

import pytest
import torch
from safetensors.torch import save_file

from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    WindowSettings,
    decode,
)
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.llamagen.adapter import LlamaGenAdapter, imagenet_classes, load_gpt, load_vq
from sjdvp_core.models.llamagen.gpt import LlamaGenGPT
from tests.helpers.tiny_llamagen import random_gpt, random_vq


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("llamagen")
    gpt, vq = random_gpt().state_dict(), random_vq().state_dict()
    vq["quantize.codebook_used"] = torch.zeros(65536)  # a training buffer the official files carry
    paths = {
        "ddp": d / "c2i_B_256.pt",
        "deepspeed": d / "c2i_L_256.pt",
        "bare": d / "c2i_XL_256.pt",
        "safetensors": d / "c2i_B_256.safetensors",
        "vq": d / "vq_ds16_c2i.pt",
        "vq_safetensors": d / "vq_ds16_c2i.safetensors",
    }
    torch.save({"model": gpt, "optimizer": {}, "steps": 10}, paths["ddp"])
    torch.save({"module": {"module." + k: v for k, v in gpt.items()}}, paths["deepspeed"])
    torch.save(gpt, paths["bare"])
    save_file({k: v.contiguous() for k, v in gpt.items()}, paths["safetensors"])
    torch.save({"model": vq}, paths["vq"])
    save_file(vq, paths["vq_safetensors"])  # converted as is: the training buffer comes along
    return {k: str(v) for k, v in paths.items()}


@pytest.mark.parametrize("layout", ["ddp", "deepspeed", "bare", "safetensors"])
def test_official_layouts_load_to_the_same_model(files, layout):
    model = load_gpt(files[layout])
    # 256 px / 16 = 16 x 16 tokens
    assert model.config.model_type == "c2i" and model.config.block_size == 256
    ref = random_gpt().state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[k]), k


@pytest.mark.parametrize("layout", ["vq", "vq_safetensors"])
def test_vq_loads_and_decodes(files, layout):
    vq = load_vq(files[layout])
    assert vq.config.ch_mult == [1, 1, 2, 2, 4] and vq.config.downsample == 16
    img = vq.decode_code(torch.randint(0, 64, (2, 4, 4)))
    assert img.shape == (2, 3, 64, 64)


def adapter(files, dtype=torch.float32):
    return LlamaGenAdapter(
        load_gpt(files["ddp"], image_tokens=16),
        load_vq(files["vq"]),
        class_names=[f"class {i}" for i in range(10)],
        dtype=dtype,
    )


def test_window_cache_matches_full_recompute(files):
    ad = adapter(files)
    gpt = ad.gpt
    g = torch.Generator().manual_seed(0)
    truth = torch.randint(0, 64, (2, 16), generator=g)
    cond = gpt.embed_condition(torch.tensor([1, 2]))
    full = gpt(cond, truth)  # teacher forcing, no cache
    ad.start([1, 2], None, False)
    n = torch.tensor([1, 1])
    for W, acc in [(5, (2, 0)), (3, (1, 2)), (6, (4, 3)), (4, (3, 3))]:
        window = torch.randint(0, 64, (2, W), generator=g)
        for r in range(2):
            window[r, 0] = truth[r, n[r] - 1]
            window[r, 1 : 1 + acc[r]] = truth[r, n[r] : n[r] + acc[r]]
        positions = ((n - 1)[:, None] + torch.arange(W)).clamp(max=15)
        logits = ad.forward(window, positions)
        for r in range(2):
            valid = acc[r] + 1
            assert torch.allclose(logits[r, :valid], full[r, n[r] : n[r] + valid], atol=1e-4)
        n = n + torch.tensor(acc) + 1


@torch.inference_mode()
def test_attention_cut_to_the_written_slots_equals_the_whole_cache(files, monkeypatch):
    """On the CPU attention reads the cache only up to the last slot a forward writes
    (LlamaGenGPT.keys); with junk in every slot past it, the logits are those of attention over
    the whole cache."""
    ad = adapter(files)
    gpt = ad.gpt
    ad.start([1, 2], None, False)
    for cache in gpt.caches():
        cache.k.normal_(), cache.v.normal_()
    tokens = torch.randint(0, 64, (2, 4), generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([[3, 4, 5, 6], [8, 9, 10, 11]])
    assert gpt.keys(positions) == 12 < gpt.cache_len
    cut = ad.forward(tokens, positions)
    monkeypatch.setattr(LlamaGenGPT, "keys", lambda self, slots: self.cache_len)
    assert torch.allclose(cut, ad.forward(tokens, positions), atol=1e-5)
    ad.finish()


def test_sampled_decode_is_deterministic_and_uses_lantern_neighbours(files):
    ad = adapter(files)
    s = DecodeSettings(
        window=WindowSettings(8),
        drafter=DrafterSettings(verifier="lantern", lantern_k=8),
        sampling=SamplingSettings(cfg_scale=2.0, top_k=20),
        seed=5,
    )
    a, b = decode(ad, 1, s), decode(ad, 1, s)
    assert torch.equal(a.tokens, b.tokens) and a.codes.shape == (1, 4, 4)
    from sjdvp_core.engine.verify import _NEIGHBOURS

    # computed once for this model, kept with its weights
    assert _NEIGHBOURS[ad.module].shape == (
        64,
        8,
    )


class Evil:
    """An arbitrary object in a pickle: loading must refuse it, not run its reduce hooks."""


def test_wrong_files_say_what_was_expected(files, tmp_path):
    with pytest.raises(CheckpointError, match="no such file"):
        load_gpt(str(tmp_path / "c2i_B_256.pt"))
    with pytest.raises(CheckpointError, match="is not a LlamaGen GPT"):
        load_gpt(files["vq"])
    with pytest.raises(CheckpointError, match="is not a LlamaGen VQ"):
        load_vq(files["ddp"])
    corrupt = tmp_path / "c2i_B_256.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_gpt(str(corrupt))
    torch.save({"model": Evil()}, tmp_path / "evil_256.pt")
    # never unpickled
    with pytest.raises(
        CheckpointError, match=r"holds Python objects \((tests\.)?test_llamagen\.Evil\)"
    ):
        load_gpt(str(tmp_path / "evil_256.pt"))
    torch.save(random_gpt().state_dict(), tmp_path / "c2i_model.pt")
    with pytest.raises(CheckpointError, match="image size"):
        load_gpt(str(tmp_path / "c2i_model.pt"))


def test_class_names():
    names = imagenet_classes()
    assert len(names) == 1000 and names[207] == "golden retriever"


def test_namespace_args_of_the_training_scripts_load(tmp_path):
    """LlamaGen's train_c2i.py / vq_train.py save {"model", "optimizer", "steps", "args":
    Namespace}."""
    import argparse

    args = argparse.Namespace(
        gpt_model="GPT-B", image_size=256, lr=1e-4, mixed_precision="bf16", no_compile=False
    )
    gpt = random_gpt().state_dict()
    optimizer = {
        "state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.zeros(3)}},
        "param_groups": [{"lr": 1e-4, "betas": (0.9, 0.95), "params": [0]}],
    }
    torch.save(
        {"model": gpt, "optimizer": optimizer, "steps": 5000, "args": args},
        tmp_path / "c2i_B_256.pt",
    )
    torch.save(
        {
            "model": random_vq().state_dict(),
            "optimizer": optimizer,
            "discriminator": {},
            "optimizer_disc": optimizer,
            "steps": 10,
            "args": args,
        },
        tmp_path / "vq_ds16_c2i.pt",
    )
    model = load_gpt(str(tmp_path / "c2i_B_256.pt"))
    assert all(torch.equal(v, gpt[k]) for k, v in model.state_dict().items())
    assert load_vq(str(tmp_path / "vq_ds16_c2i.pt")).config.codebook_size == 64


def test_namespace_is_the_only_object_let_through(tmp_path):
    import argparse

    torch.save(
        {"model": random_gpt().state_dict(), "args": argparse.Namespace(lr=1e-4), "evil": Evil()},
        tmp_path / "c2i_B_256.pt",
    )
    with pytest.raises(
        CheckpointError,
        match=r"holds Python objects \((tests\.)?test_llamagen\.Evil\) that are "
        "never unpickled",
    ) as err:
        load_gpt(str(tmp_path / "c2i_B_256.pt"))
    assert "argparse" not in str(err.value)


def test_a_tokenizer_of_the_other_kind_is_refused(files, tmp_path):
    import shutil

    from sjdvp_core.models.loading import load_model

    shutil.copy(files["ddp"], tmp_path / "c2i_B_256.pt")
    # same codebook shape
    torch.save({"model": random_vq().state_dict()}, tmp_path / "vq_ds16_t2i.pt")
    with pytest.raises(
        CheckpointError,
        match=r"no tokenizer for the c2i model c2i_B_256\.pt; vq_ds16_t2i\.pt is "
        r"the t2i models' tokenizer.*Download vq_ds16_c2i\.pt from "
        r"huggingface\.co/FoundationVision/LlamaGen",
    ):
        load_model(str(tmp_path))
    torch.save({"model": random_vq(seed=1).state_dict()}, tmp_path / "vq_ds8_c2i.pt")
    torch.save({"model": random_vq().state_dict()}, tmp_path / "vq_ds16_c2i.pt")
    ad = load_model(str(tmp_path))  # its own kind, the ds16 one first
    assert torch.equal(ad.vq.quantize.embedding.weight, random_vq().quantize.embedding.weight)
