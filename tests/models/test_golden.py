"""Golden numerics: our hand-written LlamaGen GPT, LlamaGen VQ, Chameleon VQGAN and MoVQGAN against
outputs that the upstream reference code computed on the same tiny random weights and inputs.

Each tests/golden/<name>.safetensors holds the state dict upstream ran (in upstream's key names, as
"state.<key>"; float16 storage of float16-exact values, run as float32), the inputs ("input.*"),
upstream's outputs ("output.*") and a "golden" metadata entry (JSON): upstream repository, file,
commit and git blob, the tiny config, the seed, the call protocol and every adaptation needed to run
upstream on CPU at tiny size. The weights go through our user-facing loaders in upstream's
checkpoint layouts, so this also pins key names.

The recorder is deliberately not in this repository (no upstream code is committed here); the
metadata says what it ran. To re-record: copy upstream's gpt.py, vq_model.py (+ utils/drop_path.py),
Chameleon's vqgan.py and Lumina-mGPT 2.0's movqgan/ package at the recorded commits into a scratch
folder, build the same configs with the same seeds, run the recorded protocol, and save the same
tensor names."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch.testing import assert_close

from sjdvp_core.models.llamagen import gpt as llamagen_gpt
from sjdvp_core.models.llamagen.adapter import load_gpt, load_vq, vq_config_from_state
from sjdvp_core.models.llamagen.gpt import GPTConfig
from sjdvp_core.models.llamagen.vq import VQConfig
from sjdvp_core.models.lumina import vqgan as chameleon_vqgan
from sjdvp_core.models.lumina.vqgan import load_vqgan
from sjdvp_core.models.lumina2 import movqgan
from tests.helpers.paths import TESTS

GOLDEN = TESTS / "golden"
NAMES = (
    "llamagen_gpt_c2i",
    "llamagen_gpt_t2i",
    "llamagen_vq",
    "chameleon_vqgan",
    "movqgan",
    "movqgan_encoder",
)
TOL = dict(atol=1e-5, rtol=1e-5)  # fp32 on CPU; the outputs are of order 1


def read_golden(name: str):
    """(state in fp32 with dropped training buffers re-added, inputs, outputs, metadata)."""
    with safe_open(GOLDEN / f"{name}.safetensors", framework="pt") as f:
        meta = json.loads(f.metadata()["golden"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    part = lambda prefix: {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}  # noqa: E731
    state = {k: v.float() for k, v in part("state.").items()}
    state.update({k: torch.zeros(shape) for k, shape in meta["dropped_from_state"].items()})
    return state, part("input."), part("output."), meta


def test_golden_files_name_their_upstream():
    total = 0
    for name in NAMES:
        _, _, outputs, meta = read_golden(name)
        up = meta["upstream"]
        assert (
            up["repo"].startswith("github.com/")
            and len(up["commit"]) == 40
            and up["path"].endswith(".py")
        )
        assert outputs and "seed" in meta and meta["config"]
        total += (GOLDEN / f"{name}.safetensors").stat().st_size
    assert total < 1.8e6


# --- LlamaGen GPT ---------------------------------------------------------------------------------
def gpt_config(meta) -> dict:
    fields = {f.name for f in dataclasses.fields(GPTConfig)}
    return {k: v for k, v in meta["config"].items() if k in fields}


def load_golden_gpt(name: str, tmp_path):
    state, inputs, outputs, meta = read_golden(name)
    config = gpt_config(meta)
    if config["dim"] // config["n_head"] == 64:
        # LlamaGen's head size: the official .pt layout loads with the config read off the weights
        # alone
        path = tmp_path / f"{config['model_type']}_tiny_256.pt"
        torch.save({"model": state, "optimizer": {}, "steps": 1}, path)
        gpt = load_gpt(str(path), image_tokens=config["block_size"])
        assert {
            k: getattr(gpt.config, k)
            for k in config
            if k not in ("multiple_of", "ffn_dim_multiplier")
        } == {k: v for k, v in config.items() if k not in ("multiple_of", "ffn_dim_multiplier")}
    else:
        # other head sizes cannot be read off the weights: safetensors with a config entry
        path = tmp_path / f"{name}.safetensors"
        save_file(state, str(path), metadata={"config": json.dumps(config)})
        gpt = load_gpt(str(path))
    return gpt, inputs, outputs


@torch.inference_mode()
def check_gpt(gpt, inputs, outputs):
    c = gpt.config
    T, steps = c.cls_token_num, inputs["tokens"].shape[1]
    cond, tokens = inputs["cond"], inputs["tokens"]
    mask = inputs["emb_masks"].bool() if "emb_masks" in inputs else None
    R = cond.shape[0]
    # prefill + one-token cached decode steps, as upstream's generate() runs them
    gpt.setup_caches(R, prefix_valid=mask)
    assert_close(gpt.prefill(gpt.embed_condition(cond)), outputs["prefill_logits"], **TOL)
    for i in range(steps):
        logits = gpt.decode(tokens[:, i : i + 1], torch.full((R, 1), T + i))
        assert_close(logits[:, 0], outputs["decode_logits"][:, i], **TOL)
    # the same tokens as one Jacobi window
    gpt.setup_caches(R, prefix_valid=mask)
    gpt.prefill(gpt.embed_condition(cond))
    assert_close(
        gpt.decode(tokens, T + torch.arange(steps).expand(R, -1)), outputs["decode_logits"], **TOL
    )
    gpt.release_caches()
    # teacher-forced full sequence (upstream's training forward)
    assert_close(
        gpt(gpt.embed_condition(inputs["train_cond"]), inputs["train_tokens"]),
        outputs["train_logits"],
        **TOL,
    )


def test_golden_llamagen_gpt_c2i_gqa(tmp_path):
    gpt, inputs, outputs = load_golden_gpt("llamagen_gpt_c2i", tmp_path)
    assert gpt.config.kv_heads == 2 < gpt.config.n_head == 4 and gpt.config.grid == 5
    check_gpt(gpt, inputs, outputs)


def test_golden_llamagen_gpt_t2i_caption_prefix(tmp_path):
    gpt, inputs, outputs = load_golden_gpt("llamagen_gpt_t2i", tmp_path)
    assert gpt.config.model_type == "t2i" and gpt.config.cls_token_num == 120
    assert not inputs["emb_masks"].all()  # a left-padded caption, junk in its padding
    check_gpt(gpt, inputs, outputs)


def half_split_rope(x, rope):
    """A plausible mistake: rotate (x[i], x[i + D/2]) (HF Llama's rotate_half) instead of (x[2i],
    x[2i+1])."""
    x1, x2 = x.float().chunk(2, -1)
    cos, sin = rope[:, :, None, :, 0], rope[:, :, None, :, 1]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).type_as(x)


def columns_first(table, c):
    """Another: the first half of each head rotating by the column and the second by the row."""
    q = c.head_dim // 4
    return torch.cat([table[:, q:], table[:, :q]], 1)


@pytest.mark.parametrize("mistake", ["half_split_pairs", "columns_first", "gqa_tiled_heads"])
@torch.inference_mode()
def test_golden_gpt_catches_a_wrong_rope_or_head_mapping(tmp_path, monkeypatch, mistake):
    """The comparison has teeth: one plausible slip in the rotary pairing, the row/column split or
    the GQA head mapping changes the logits far beyond the tolerance."""
    gpt, inputs, outputs = load_golden_gpt("llamagen_gpt_c2i", tmp_path)
    ref = gpt(gpt.embed_condition(inputs["train_cond"]), inputs["train_tokens"])
    assert_close(ref, outputs["train_logits"], **TOL)
    if mistake == "half_split_pairs":
        monkeypatch.setattr(llamagen_gpt, "apply_rope", half_split_rope)
    elif mistake == "columns_first":
        gpt.rope = columns_first(gpt.rope, gpt.config)
    # kv head h serves query heads h, h + kv_heads, ... instead of h * group .. (h + 1) * group - 1
    else:
        monkeypatch.setattr(
            torch.Tensor,
            "repeat_interleave",
            lambda t, n, dim: t.repeat(*[n if d == dim else 1 for d in range(t.dim())]),
        )
    wrong = gpt(gpt.embed_condition(inputs["train_cond"]), inputs["train_tokens"])
    assert (wrong - outputs["train_logits"]).abs().max() > 1e-2


# --- LlamaGen VQ ----------------------------------------------------------------------------------
def test_golden_llamagen_vq(tmp_path):
    state, inputs, outputs, meta = read_golden("llamagen_vq")
    c = meta["config"]
    assert c["encoder_ch_mult"] == c["decoder_ch_mult"] == [1, 1, 2, 2, 4] and c["codebook_l2_norm"]
    config = VQConfig(
        codebook_size=c["codebook_size"],
        codebook_embed_dim=c["codebook_embed_dim"],
        ch=c["ch"],
        ch_mult=c["decoder_ch_mult"],
        z_channels=c["z_channels"],
        num_res_blocks=c["num_res_blocks"],
        norm_groups=c["norm_groups"],
    )
    # the official .pt layout: everything but the GroupNorm group count (code, not weights) is read
    # off the keys
    inferred = vq_config_from_state(state, {}, "vq_ds16_c2i.pt")
    assert dataclasses.replace(inferred, norm_groups=config.norm_groups) == config
    # the tiny width needs fewer groups than 32, which only a config entry can say: load that way
    path = tmp_path / "vq_tiny.safetensors"
    save_file(
        {k: v for k, v in state.items() if k != "quantize.codebook_used"},
        str(path),
        metadata={"config": json.dumps(config.to_dict())},
    )
    vq = load_vq(str(path), encoder=True)
    with torch.inference_mode():
        assert_close(vq.decode_code(inputs["codes"]), outputs["decoded"], **TOL)
        assert_close(vq.encode_latent(inputs["images"]), outputs["latent"], **TOL)
        assert torch.equal(vq.encode(inputs["images"]), outputs["indices"])


# --- Chameleon VQGAN ------------------------------------------------------------------------------
def write_vqgan_folder(folder: Path, state, meta) -> str:
    p = meta["config"]
    dd = "\n".join(f"      {k}: {json.dumps(v)}" for k, v in p["ddconfig"].items())
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vqgan.yaml").write_text(
        f"model:\n  target: taming.models.vqgan.VQModel\n  params:\n    embed_dim: {p['embed_dim']}\n"
        f"    n_embed: {p['n_embed']}\n    ddconfig:\n{dd}\n"
    )
    # Lightning layout
    torch.save({"epoch": 1, "global_step": 1, "state_dict": state}, folder / "vqgan.ckpt")
    return str(folder)


def test_golden_chameleon_vqgan(tmp_path):
    state, inputs, outputs, meta = read_golden("chameleon_vqgan")
    assert (
        len(meta["config"]["ddconfig"]["ch_mult"]) >= 3
        and meta["config"]["ddconfig"]["attn_resolutions"]
    )
    vqgan = load_vqgan(write_vqgan_folder(tmp_path / "tokenizer", state, meta))
    assert any(len(level.attn) for level in vqgan.decoder.up)
    with torch.inference_mode():
        quant = vqgan.quantize.embedding(inputs["codes"]).permute(0, 3, 1, 2)
        assert_close(quant, outputs["quant"], **TOL)
        assert_close(vqgan.decode_code(inputs["codes"]), outputs["decoded"], **TOL)


def test_golden_vqgan_catches_reversed_up_blocks(tmp_path, monkeypatch):
    """With equal widths per level, running `up` in the wrong order raises nothing: only the
    numbers tell."""
    state, inputs, outputs, meta = read_golden("chameleon_vqgan")
    vqgan = load_vqgan(write_vqgan_folder(tmp_path / "tokenizer", state, meta))

    def forward_wrong_order(self, z):
        h = self.mid(self.conv_in(z))
        for level in self.up:  # level 0 first: the slip
            h = level(h)
        return self.conv_out(chameleon_vqgan.swish(self.norm_out(h)))

    monkeypatch.setattr(chameleon_vqgan.Decoder, "forward", forward_wrong_order)
    with torch.inference_mode():
        wrong = vqgan.decode_code(inputs["codes"])
    assert (
        wrong.shape == outputs["decoded"].shape and (wrong - outputs["decoded"]).abs().max() > 1e-2
    )


@torch.inference_mode()
def test_golden_vqgan_codebook_agrees_with_transformers(tmp_path):
    """transformers' ChameleonVQVAE has the encoder and quantizer but no decoder; the parts it
    shares with our decoding side (codebook under quantize.embedding, post_quant_conv) take the
    same weights by the same keys, and its nearest-code search maps the golden code vectors back
    to the golden codes (plain L2, no l2-normalising)."""
    from transformers import ChameleonVQVAE, ChameleonVQVAEConfig

    state, inputs, outputs, meta = read_golden("chameleon_vqgan")
    p, dd = meta["config"], meta["config"]["ddconfig"]
    hf = ChameleonVQVAE(
        ChameleonVQVAEConfig(
            embed_dim=p["embed_dim"],
            num_embeddings=p["n_embed"],
            latent_channels=dd["z_channels"],
            base_channels=dd["ch"],
            channel_multiplier=dd["ch_mult"],
            num_res_blocks=dd["num_res_blocks"],
            attn_resolutions=dd["attn_resolutions"],
            resolution=dd["resolution"],
            in_channels=dd["in_channels"],
            double_latent=dd["double_z"],
        )
    )
    shared = {k: v for k, v in state.items() if k.startswith(("quantize.", "post_quant_conv."))}
    missing, unexpected = hf.load_state_dict(shared, strict=False)
    assert not unexpected and not [
        k for k in missing if k.startswith(("quantize.", "post_quant_conv."))
    ]
    quant, _, indices = hf.quantize(outputs["quant"])
    assert torch.equal(indices.view_as(inputs["codes"]), inputs["codes"])
    assert_close(quant, outputs["quant"], **TOL)
    ours = load_vqgan(write_vqgan_folder(tmp_path / "tokenizer", state, meta))
    assert_close(ours.post_quant_conv(outputs["quant"]), hf.post_quant_conv(quant), **TOL)


# --- MoVQGAN (Lumina-mGPT 2.0's image decoder) ----------------------------------------------------
def write_movqgan(folder: Path, state) -> str:
    """The released layout: a plain state dict in movqgan_270M.ckpt, here in the model folder's
    movqgan/."""
    (folder / "movqgan").mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "movqgan" / "movqgan_270M.ckpt")
    return movqgan.find_movqgan(str(folder), "movqgan_270M.ckpt")


def test_golden_movqgan(tmp_path):
    state, inputs, outputs, meta = read_golden("movqgan")
    dd = meta["config"]["ddconfig"]
    vq, _ = movqgan.load_movqgan(write_movqgan(tmp_path, state))
    assert vq.config.channels == tuple(
        dd["ch"] * m for m in dd["ch_mult"]
    ) and vq.config.attn_levels == (3,)
    assert vq.config.blocks == dd["num_res_blocks"] + 1 and vq.config.downsample == 8
    with torch.inference_mode():
        assert_close(vq.decode_code(inputs["codes"]), outputs["decoded"], **TOL)


def test_golden_movqgan_catches_an_unmodulated_norm(tmp_path, monkeypatch):
    """The spatial modulation is what MoVQ adds to taming's decoder: a plain GroupNorm in its place
    runs without an error, and only the numbers tell."""
    state, inputs, outputs, _ = read_golden("movqgan")
    vq, _ = movqgan.load_movqgan(write_movqgan(tmp_path, state))
    monkeypatch.setattr(movqgan.SpatialNorm, "forward", lambda self, f, zq: self.norm_layer(f))
    with torch.inference_mode():
        wrong = vq.decode_code(inputs["codes"])
    assert (
        wrong.shape == outputs["decoded"].shape and (wrong - outputs["decoded"]).abs().max() > 1e-2
    )


def test_golden_movqgan_encoder():
    """The encoding side Lumina-mGPT 2.0 edits tokenise a reference with (MOVQ.encode: taming's
    encoder, quant_conv, VectorQuantizer2's nearest code): upstream's codes, every one."""
    state, inputs, outputs, meta = read_golden("movqgan_encoder")
    encoder = movqgan.load_encoder(state, state["quantize.embedding.weight"], "golden")
    dd = meta["config"]["ddconfig"]
    assert (
        len(encoder.encoder.down) == len(dd["ch_mult"]) and len(encoder.encoder.down[1].attn) == 1
    )
    with torch.inference_mode():
        codes = encoder(inputs["pixels"].float())
    assert torch.equal(codes, outputs["codes"])
    assert len(codes.unique()) > 8  # the check can tell codes apart
