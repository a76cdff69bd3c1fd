"""Janus-Pro: a tiny random model folder laid out as deepseek-community/Janus-Pro-*B is
(config.json, byte-level BPE tokenizer.json, safetensors), loaded through the user-facing loader;
the official prompt and padded CFG twin; AR == transformers' own generate; rollback == recompute;
decoded images. The contract every family keeps is test_family_contract.py's."""

import pytest
import torch
from torch.nn import functional as F

from sjdvp_core import decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.hf_adapter import left_pad
from sjdvp_core.models.janus.adapter import BOI, PAD, JanusAdapter, chat_prompt
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.tiny_hf import PROMPTS, assert_windows_match_recompute
from tests.helpers.tiny_janus import whole, write_converted


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "Janus-Pro-1B"
    d.mkdir()
    return write_converted(d)


@pytest.fixture(scope="module")
def adapter(folder):
    return load_model(folder)


def test_folder_is_detected_listed_and_loaded(folder, adapter):
    assert detect_family(folder) == "janus"
    assert list_models([str(folder) + "/.."]) == ["demo", "Janus-Pro-1B"]
    assert isinstance(adapter, JanusAdapter) and adapter.family == "Janus-Pro"
    # 32 px / patch 8; Pro: 24 x 24
    assert adapter.layout.length == 16 and adapter.layout.grid.shape == (
        4,
        4,
    )
    assert (adapter.layout.forced < 0).all() and adapter.layout.special_tokens.numel() == 0
    assert adapter.default_sampling == SamplingSettings(cfg_scale=5.0, top_k=0, image_cfg_scale=5.0)
    with pytest.raises(ValueError, match="a Janus-Pro folder takes no options"):
        load_model(folder, image_area=64)


def test_prompt_and_its_padded_unconditional_twin(adapter):
    tok = adapter.tokenizer
    cond, uncond = adapter.prompt_ids(["a red fox"], None, cfg=True)
    assert cond == [adapter.bos] + tok.encode(
        "<|User|>: a red fox\n\n<|Assistant|>:<begin_of_image>"
    )
    assert cond[-1] == tok.id(BOI) and len(uncond) == len(cond)
    assert uncond == [cond[0]] + [tok.id(PAD)] * (len(cond) - 2) + [cond[-1]]
    _, negative = adapter.prompt_ids(["a red fox"], ["blurry"], cfg=True)
    assert negative == [adapter.bos] + tok.encode(chat_prompt("blurry"))


def test_ar_equals_transformers_generate(adapter):
    """Same prompt, same CFG twin, same guidance: transformers' image generation, greedy."""
    rows = adapter.prompt_ids(PROMPTS, None, cfg=False)
    ids, valid = left_pad(rows, adapter.pad_id)
    with whole(adapter) as model:  # transformers' generate reads the understanding tower's config
        expected = model.generate(
            input_ids=ids,
            attention_mask=valid.long(),
            generation_mode="image",
            do_sample=False,
            guidance_scale=5.0,
        )
    sampling = SamplingSettings(cfg_scale=5.0, greedy=True, temperature=0.0)
    ours = decode(adapter, PROMPTS, method_settings("sjd", 4, sampling, batch_size=2))
    assert torch.equal(ours.tokens, expected)


def test_windows_with_rollback_match_recompute(adapter):
    model, rows = adapter.model, adapter.prompt_ids(PROMPTS, None, cfg=True)

    def reference(r, generated):
        x = torch.cat(
            [
                model.get_input_embeddings()(torch.tensor(rows[r])),
                model.prepare_embeddings_for_image_generation(generated),
            ]
        )
        hidden = model.model.language_model(inputs_embeds=x[None]).last_hidden_state[0]
        return model.model.generation_head(hidden[len(rows[r]) - 1 :]).float()

    assert_windows_match_recompute(adapter, PROMPTS, True, reference)


def test_decode_image_and_codebook(adapter):
    codes = torch.randint(0, 16, (2, 4, 4), generator=torch.Generator().manual_seed(0))
    image = adapter.decode_image(codes)
    assert image.shape == (2, 8, 8, 3) and image.min() >= 0 and image.max() <= 1
    expected = (adapter.model.decode_image_tokens(codes.flatten(1)).float() + 1) / 2
    assert torch.allclose(image, expected.clamp(0, 1), atol=1e-5)
    book = adapter.codebook()
    assert book.shape == (16, 8) and book is adapter.codebook()
    assert torch.allclose(
        book, F.normalize(adapter.model.model.vqmodel.quantize.embedding.weight, dim=-1)
    )


def test_other_or_broken_configs_are_not_taken_for_a_family(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ValueError, match="no model family recognised.*janus: a Janus-Pro folder"):
        detect_family(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"config\.json: cannot be read"):
        detect_family(str(tmp_path))
