"""int8 and NF4 weights (bitsandbytes, which runs both on the CPU): every family's tiny model loads
quantised and decodes greedy SJD == its own AR (chain and tree, with CFG); the quantised layers'
bytes shrink as promised while the head, embeddings and VQ decoder keep their dtype; the sampled
law is the quantised model's (chi-square against its enumerated law, which the unquantised
model's law fails); a machine without bitsandbytes gets a message with the fix."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

from sjdvp_core import SamplingSettings, decode
from sjdvp_core.engine.settings import TreeSettings, method_settings
from sjdvp_core.engine.target import cfg_mix
from sjdvp_core.models.llamagen.adapter import LlamaGenAdapter
from sjdvp_core.models.llamagen.gpt import GPTConfig, LlamaGenGPT
from sjdvp_core.models.llamagen.vq import LlamaGenVQ
from sjdvp_core.models.loading import load_model, quantize
from sjdvp_core.models.quantize import is_quantised, quantisable, stored_quantisation, weight_bytes
from sjdvp_core.models.registry import detect_family
from tests.helpers.tiny_families import FAMILIES
from tests.helpers.tiny_hf import PROMPTS
from tests.helpers.tiny_llamagen import VQ_TINY
from tests.helpers.tiny_lumina import write_lumina, write_lumina_4bit
from tests.helpers.toy_reference import chi2_pvalue, code_index

PRECISIONS = ("int8", "nf4")


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_quantised_decodes_greedy_sjd_equal_to_its_own_ar(family, precision, tmp_path):
    path, options, prompts = FAMILIES[family](tmp_path)
    full = load_model(path, precision="fp32", **options)
    adapter = load_model(path, precision=precision, **options)
    blocks = torch.nn.ModuleList(adapter.blocks())
    assert is_quantised(blocks) and not quantisable(blocks)  # every block linear was swapped
    assert not is_quantised(adapter.image_decoder)  # the VQ decoder keeps its dtype
    assert weight_bytes(adapter.image_decoder) == weight_bytes(full.image_decoder)
    # ratios: on the demo, below
    assert weight_bytes(blocks) < weight_bytes(torch.nn.ModuleList(full.blocks()))
    sampling = SamplingSettings(cfg_scale=3.0, greedy=True, temperature=0.0)
    B = len(prompts)
    ar = decode(adapter, prompts, method_settings("ar", 1, sampling, batch_size=B))
    for s in (
        method_settings("sjd-vp", 8, sampling, batch_size=B),
        method_settings("sjd", 4, sampling, batch_size=B, tree=TreeSettings(width=3, depth=2)),
    ):
        res = decode(adapter, prompts, s)
        assert torch.equal(res.tokens, ar.tokens), (family, precision, s.window)
        assert res.stats.forward_passes < ar.stats.forward_passes


def test_quantised_layers_take_at_most_055_int8_and_035_nf4_of_bf16():
    bf16 = weight_bytes(torch.nn.ModuleList(load_model("demo", precision="bf16").blocks()))
    for precision, most in (("int8", 0.55), ("nf4", 0.35)):
        adapter = load_model("demo", precision=precision)
        ratio = weight_bytes(torch.nn.ModuleList(adapter.blocks())) / bf16
        assert ratio <= most, (precision, ratio)
        # what stays unquantised (embeddings, the head, the VQ decoder) is as in bf16 -> fp32 on the
        # CPU
        assert adapter.gpt.output.weight.dtype == torch.float32


def test_without_bitsandbytes_the_message_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes -> ImportError
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        load_model("demo", precision="nf4")


def test_unknown_precisions_are_refused():
    with pytest.raises(ValueError, match="int8"):
        load_model("demo", precision="int4")
    # as ComfyUI's loader calls it, with its compute dtype
    with pytest.raises(ValueError, match="int8"):
        load_model("demo", precision="fp8", compute="fp32")


# --- a release stored 4-bit: Alpha-VLLM/Lumina-mGPT-7B-768-bnb-int4 -------------------------------
@pytest.fixture(scope="module")
def lumina_4bit(tmp_path_factory):
    return write_lumina_4bit(
        str(tmp_path_factory.mktemp("models") / "Lumina-mGPT-tiny-64-bnb-int4")
    )


def test_a_4bit_release_loads_as_stored_and_decodes_greedy_sjd_equal_to_ar(lumina_4bit):
    import bitsandbytes.functional as bnbf
    from transformers import ChameleonForConditionalGeneration

    assert detect_family(lumina_4bit) == "lumina"
    assert stored_quantisation(lumina_4bit) == "bitsandbytes 4-bit fp4"
    adapter = load_model(lumina_4bit, width=64, height=32)
    assert adapter.precision == "bitsandbytes 4-bit fp4, as stored (computes in fp32)"
    layer = adapter.model.model.layers[0].mlp.down_proj
    assert layer.weight.quant_state.quant_type == "fp4" and layer.compute_dtype == torch.float32
    # the packed weights are the file's, byte for byte, and dequantise to the float model's within
    # FP4's error
    hf = ChameleonForConditionalGeneration.from_pretrained(
        lumina_4bit, ignore_mismatched_sizes=True
    )
    assert torch.equal(layer.weight.data, hf.model.layers[0].mlp.down_proj.weight.data)
    float_weight = (
        load_model(write_lumina(str(lumina_4bit) + "-float"), width=64, height=32, precision="fp32")
        .model.model.layers[0]
        .mlp.down_proj.weight
    )
    dequantised = bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    assert (dequantised - float_weight).norm() / float_weight.norm() < 0.2
    sampling = SamplingSettings(cfg_scale=3.0, greedy=True, temperature=0.0)
    ar = decode(adapter, PROMPTS, method_settings("ar", 1, sampling, batch_size=2))
    for s in (
        method_settings("sjd-vp", 8, sampling, batch_size=2),
        method_settings("sjd", 4, sampling, batch_size=2, tree=TreeSettings(width=3, depth=2)),
    ):
        res = decode(adapter, PROMPTS, s)
        assert (
            torch.equal(res.tokens, ar.tokens)
            and res.stats.forward_passes < ar.stats.forward_passes
        )
        assert res.stats.precision == adapter.precision


def test_a_4bit_release_refuses_requantising_and_without_bitsandbytes_says_what_to_install(
    lumina_4bit, monkeypatch
):
    for precision in PRECISIONS:
        with pytest.raises(ValueError, match="stored quantised already"):
            load_model(lumina_4bit, precision=precision, width=64, height=32)
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes -> ImportError
    with pytest.raises(ImportError, match="pip install bitsandbytes.*float release"):
        load_model(lumina_4bit, width=64, height=32)


# --- the sampled law of a tiny quantised model ----------------------------------------------------
K, CELLS, N, ALPHA = 3, 4, 120_000, 1e-3
LAW_SAMPLING = SamplingSettings(cfg_scale=2.0)


def tiny_law_model(precision: str | None) -> LlamaGenAdapter:
    torch.manual_seed(5)
    gpt = LlamaGenGPT(
        GPTConfig(dim=64, n_layer=2, n_head=2, vocab_size=K, block_size=CELLS, num_classes=2)
    )
    for p in gpt.parameters():
        torch.nn.init.normal_(p, std=0.4)
    adapter = LlamaGenAdapter(gpt, LlamaGenVQ(dataclasses.replace(VQ_TINY, codebook_size=K)))
    if precision:
        quantize(adapter, precision, torch.device("cpu"), torch.float32)
    return adapter


@torch.inference_mode()
def enumerated_law(adapter: LlamaGenAdapter) -> torch.Tensor:
    """The exact probability of each of the K^CELLS sequences (class 0, CFG), by teacher forcing."""
    import itertools

    codes = torch.tensor(list(itertools.product(range(K), repeat=CELLS)))
    M = codes.shape[0]
    _, first = adapter.start([0] * M, None, cfg=True)
    rest = adapter.forward(codes[:, :-1].repeat(2, 1), torch.arange(CELLS - 1).expand(2 * M, -1))
    adapter.finish()
    logits = torch.cat([first[:, None], rest], 1)  # [2M, CELLS, K]
    probs = cfg_mix(logits, LAW_SAMPLING, 2).softmax(-1)
    return probs.gather(-1, codes[..., None]).squeeze(-1).prod(-1).double()


@pytest.mark.statistical
@pytest.mark.parametrize("precision", PRECISIONS)
def test_sjd_on_a_quantised_model_samples_the_quantised_models_law(precision):
    adapter = tiny_law_model(precision)
    exact, unquantised = enumerated_law(adapter), enumerated_law(tiny_law_model(None))
    for method, W in (("sjd", 4), ("sjd-vp", 4)):
        res = decode(adapter, 0, method_settings(method, W, LAW_SAMPLING, batch_size=N))
        counts = torch.bincount(
            code_index(res.codes.flatten(1), K), minlength=exact.numel()
        ).double()
        assert chi2_pvalue(counts, exact * N) > ALPHA, method
        # the test tells the two models apart
        assert chi2_pvalue(counts, unquantised * N) < ALPHA, method
