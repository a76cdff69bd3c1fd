"""Emu3: a tiny random model folder laid out as BAAI/Emu3-Gen-hf is (config.json with the vocabulary
map, byte-level BPE tokenizer.json whose visual tokens are not in code order, sharded safetensors
with an index), loaded through the user-facing loader; the size prompt; EOL/EOF/EOI/EOS forced
where upstream's constraint puts them; greedy SJD == AR == transformers' generate with the
negative prompt; rollback == recompute; decoded images == transformers' decode; sizes. What every
family keeps (greedy SJD == AR on chains and trees, tree forward == chains, missing files named,
the check command) is test_family_contract.py's."""

import pytest
import torch

from sjdvp_core import decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.emu3.adapter import (
    BOI,
    BOS,
    EOF,
    EOI,
    EOL,
    EOS,
    NEGATIVE_PROMPT,
    QUALITY_SUFFIX,
    WRAPPER,
    Emu3Adapter,
    token_grid,
)
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import detect_family
from tests.helpers.tiny_emu3 import CODES, SIZE, write_converted
from tests.helpers.tiny_hf import assert_windows_match_recompute

PROMPTS = ["a red fox in the snow", "a blue sky"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "Emu3-Gen-hf"
    d.mkdir()
    return write_converted(d)


@pytest.fixture(scope="module")
def adapter(folder):
    return load_model(folder, **SIZE)


def test_folder_is_detected_and_loaded(folder, adapter):
    assert detect_family(folder) == "emu3"
    assert isinstance(adapter, Emu3Adapter) and adapter.family == "Emu3"
    assert (adapter.height, adapter.width) == (4, 8)
    assert adapter.default_sampling == SamplingSettings(cfg_scale=3.0, top_k=2048)


def test_sizes_follow_the_processor_and_unsupported_ones_say_why(folder):
    assert token_grid("1:1", 720 * 720, 8, 9216) == (90, 90)  # the release's default
    assert token_grid("16:9", 720 * 720, 8, 9216) == (68, 120)
    with pytest.raises(ValueError, match="'W:H'"):
        token_grid("wide", 720 * 720, 8, 9216)
    with pytest.raises(ValueError, match="more than Emu3's 9216 positions"):
        token_grid("1:1", 1024 * 1024, 8, 9216)
    with pytest.raises(ValueError, match="720x720"):
        load_model(folder)  # 720x720 at f2 overflows the tiny model
    with pytest.raises(ValueError, match="image_area=-5: give a positive number of pixels"):
        token_grid("1:1", -5, 8, 9216)
    from sjdvp_core.engine.adapter import at_size

    small = load_model(folder, image_area=128, ratio="2:1")
    with pytest.raises(ValueError, match=r"-16x8 px: give a positive width and height"):
        at_size(small, -16, 8)  # (was: "ratio='-16:8'", an option not given)
    with pytest.raises(ValueError, match=r"1000000x1 px is under one 2x2 token on a side"):
        at_size(small, 10**6, 1)


def test_prompt_and_negative_prompt(adapter):
    tok = adapter.tokenizer
    cond, uncond = adapter.prompt_ids(["a red fox"], None, cfg=True)
    assert cond == tok.encode(f"{BOS}a red fox{QUALITY_SUFFIX}{BOI}4*8{WRAPPER}")
    assert uncond == tok.encode(f"{BOS}{NEGATIVE_PROMPT}{BOI}4*8{WRAPPER}")
    assert cond[0] == tok.id(BOS) and cond[-1] == tok.id(WRAPPER)
    _, negative = adapter.prompt_ids(["a red fox"], ["blurry"], cfg=True)
    assert negative == tok.encode(f"{BOS}blurry{BOI}4*8{WRAPPER}")


def upstream_allowed(tok, visual, height, width, length):
    """Upstream's prefix constraint, by the offset from <|image token|>: [length] allowed ids per
    step."""
    allowed = []
    for j in range(length):
        offset = j + 1
        if offset % (width + 1) == 0:
            allowed.append([tok.id(EOL)])
        elif offset == (width + 1) * height + 1:
            allowed.append([tok.id(EOF)])
        elif offset == (width + 1) * height + 2:
            allowed.append([tok.id(EOI)])
        elif offset == (width + 1) * height + 3:
            allowed.append([tok.id(EOS)])
        else:
            allowed.append(visual)
    return allowed


def test_forced_tokens_sit_where_upstream_puts_them(adapter):
    layout, tok = adapter.layout, adapter.tokenizer
    visual = sorted(adapter.model.model.vocabulary_mapping.image_tokens)
    allowed = upstream_allowed(tok, visual, 4, 8, layout.length)
    assert layout.length == 4 * 9 + 3
    for j, ids in enumerate(allowed):
        assert (ids == visual) == (int(layout.forced[j]) < 0)
        assert ids == visual or ids == [int(layout.forced[j])], j
    names = [tok.tok.id_to_token(int(t)) for t in layout.image_tokens]
    # local id == codebook index
    assert names == [f"<|visual token {c:06d}|>" for c in range(CODES)]


def test_ar_equals_transformers_generate_with_negative_prompt(adapter):
    """Upstream's recipe: unbatched CFG against the negative prompt, tokens constrained by
    offset."""
    cond, uncond = adapter.prompt_ids(PROMPTS[:1], None, cfg=True)
    visual = sorted(adapter.model.model.vocabulary_mapping.image_tokens)
    allowed = upstream_allowed(adapter.tokenizer, visual, 4, 8, adapter.layout.length)
    out = adapter.model.generate(
        input_ids=torch.tensor([cond]),
        negative_prompt_ids=torch.tensor([uncond]),
        guidance_scale=3.0,
        do_sample=False,
        max_new_tokens=adapter.layout.length,
        prefix_allowed_tokens_fn=lambda b, ids: allowed[
            min(len(ids) - len(cond), len(allowed) - 1)
        ],
    )
    sampling = SamplingSettings(cfg_scale=3.0, greedy=True, temperature=0.0)
    ours = decode(adapter, PROMPTS[:1], method_settings("sjd", 8, sampling))
    assert torch.equal(ours.tokens[0], out[0, len(cond) :])
    assert ours.tokens[0, -1] == adapter.tokenizer.id(EOS)


def test_windows_with_rollback_match_recompute(adapter):
    model, rows = adapter.model, adapter.prompt_ids(PROMPTS, None, cfg=True)

    def reference(r, generated):
        ids = torch.cat([torch.tensor(rows[r]), generated])
        return model(input_ids=ids[None]).logits[0, len(rows[r]) - 1 :].float()

    assert_windows_match_recompute(adapter, PROMPTS, True, reference)


def test_decode_image_matches_transformers(adapter):
    sampling = SamplingSettings(cfg_scale=3.0, top_k=8)
    res = decode(adapter, PROMPTS, method_settings("sjd", 8, sampling, batch_size=2, seed=1))
    image = adapter.decode_image(res.codes)
    assert image.shape == (2, 8, 16, 3) and image.min() >= 0 and image.max() <= 1
    # [B, 3, H, W]
    expected = adapter.model.model.decode_image_tokens(res.tokens, height=4, width=8)
    assert torch.allclose(
        image, (expected.float() * 0.6 + 0.4).clamp(0, 1).permute(0, 2, 3, 1), atol=1e-5
    )
    book = adapter.codebook()
    assert book.shape == (CODES, 4) and torch.equal(
        book, adapter.model.model.vqmodel.quantize.embedding.weight
    )


def test_with_size_changes_the_grid_and_the_size_string(adapter):
    square = adapter.with_size(12, 12)  # 144 px at f2 -> 6 x 6 tokens
    assert square.layout.grid.shape == (6, 6) and adapter.layout.grid.shape == (4, 8)
    assert "6*6" in square.image_prefix and square.module is adapter.module
    with pytest.raises(ValueError, match="0x12 px: give a positive width and height"):
        adapter.with_size(0, 12)
