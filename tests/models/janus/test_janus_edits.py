"""Janus-4o's edits (text and reference image to image) against a plain re-implementation of
ShareGPT-4o-Image's inference (demo/app_janus4o.py): three rows of one prompt each (the full
condition, the one without the reference's VQ tokens, the padded unconditional), no cache, the
two-weight mix, greedy; and the reference's preprocessing and VQ codes as upstream makes them."""

import pytest
import torch
from torch.nn import functional as F

from sjdvp_core import decode
from sjdvp_core.engine.adapter import Edit
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.janus.adapter import BOI, EOI, PAD, PLACEHOLDER, square
from sjdvp_core.models.loading import load_model
from tests.helpers.tiny_janus import REFERENCE, whole, write_converted


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    d = tmp_path_factory.mktemp("models") / "Janus-4o-7B"
    d.mkdir()
    return load_model(write_converted(d))


@torch.no_grad()
def upstream_codes(model, image: torch.Tensor) -> torch.Tensor:
    """The reference's VQ codes as Janus's VectorQuantizer finds them: l2-normalised latent and
    codebook, the nearest entry by squared distance."""
    vq = model.model.vqmodel
    levels = len(vq.config.channel_multiplier)
    side = model.config.vision_config.image_size // model.config.vision_config.patch_size
    pixels = square(image, side * 2 ** (levels - 1))[None]
    z = vq.quant_conv(vq.encoder(pixels.float()))
    z = F.normalize(z.permute(0, 2, 3, 1).reshape(-1, z.shape[1]), dim=-1)
    book = F.normalize(vq.quantize.embedding.weight.float(), dim=-1)
    distances = (z**2).sum(1, keepdim=True) + (book**2).sum(1) - 2 * z @ book.T
    return distances.argmin(1)


@torch.no_grad()
def upstream_edit(adapter, text: str, image: torch.Tensor, w1: float, w2: float) -> list[int]:
    with whole(adapter) as model:
        return _upstream_edit(adapter, model, text, image, w1, w2)


def _upstream_edit(adapter, model, text, image, w1, w2) -> list[int]:
    tok = adapter.tokenizer
    n = model.config.vision_config.num_image_tokens
    blocks = f"{BOI}{PLACEHOLDER * n}{EOI}{BOI}{PAD * n}{EOI}"
    prompt = f"<|User|>: {blocks}{text}\n\n<|Assistant|>:{BOI}"
    ids = torch.tensor([adapter.bos] + tok.encode(prompt))
    rows = ids.repeat(3, 1)
    rows[2, 1:-1] = tok.id(PAD)
    x = model.model.language_model.get_input_embeddings()(rows)
    vision = model.config.vision_config
    pixels = square(image, vision.image_size)[None]
    features = model.model.get_image_features(pixels).pooler_output[0]
    understood = (ids == tok.id(PLACEHOLDER)).nonzero()[:, 0]
    x[0, understood] = features
    x[1, understood] = features
    gen_block = understood[-1] + 3 + torch.arange(n)  # past <end_of_image><begin_of_image>
    assert bool((ids[gen_block] == tok.id(PAD)).all())
    x[0, gen_block] = model.prepare_embeddings_for_image_generation(
        upstream_codes(model, image)[None]
    )[0]
    out = []
    for _ in range(adapter.layout.length):
        hidden = model.model.language_model(inputs_embeds=x).last_hidden_state[:, -1]
        logits = model.model.generation_head(hidden).float()
        cond = (logits[0] + w2 * logits[1]) / (1 + w2)
        token = int((logits[2] + w1 * (cond - logits[2])).argmax())
        out.append(token)
        step = model.prepare_embeddings_for_image_generation(torch.tensor([token] * 3)[:, None])
        x = torch.cat([x, step], 1)
    return out


@pytest.mark.parametrize("w1, w2", [(5.0, 5.0), (3.0, 0.0), (1.0, 0.0)])
def test_edit_decodes_as_upstream_inference(adapter, w1, w2):
    """Greedy AR and SJD-VP of an edit give upstream's tokens: the reference's two blocks, the
    rows each fills and the mix are Janus-4o's. cfg 1 runs the full condition alone, which upstream's
    mix gives where its second weight is 0 (with one, it would still mix in the second row)."""
    sampling = SamplingSettings(cfg_scale=w1, image_cfg_scale=w2, greedy=True, temperature=0.0)
    edit = Edit("make it snow", (REFERENCE,))
    expected = upstream_edit(adapter, "make it snow", REFERENCE, w1, w2)
    for method, window in (("ar", 1), ("sjd-vp", 6)):
        codes = decode(adapter, [edit], method_settings(method, window, sampling)).codes
        assert codes.flatten().tolist() == expected, method


def test_an_edit_runs_three_row_groups_and_a_text_prompt_two(adapter):
    edit = Edit("make it snow", (REFERENCE,))
    assert adapter.row_groups([edit, "a cat"], cfg=True) == 3
    assert adapter.row_groups(["a cat"], cfg=True) == 2
    assert adapter.row_groups([edit], cfg=False) == 1
    rows = adapter.prompt_ids([edit, "a cat"], None, cfg=True)
    assert len(rows) == 6 and rows[0] == rows[2] and rows[1] == rows[3]
    # the unconditional keeps BOS and the image start only, as upstream pads it
    assert set(rows[4][1:-1]) == {adapter.pad_id} and rows[4][-1] == adapter.boi


def test_an_edit_differs_from_its_text_alone_and_takes_two_references(adapter):
    sampling = SamplingSettings(cfg_scale=5.0, image_cfg_scale=5.0, greedy=True, temperature=0.0)
    settings = method_settings("sjd", 4, sampling)
    text = decode(adapter, ["make it snow"], settings).codes
    edit = decode(adapter, [Edit("make it snow", (REFERENCE,))], settings).codes
    flipped = REFERENCE.flip(0)
    both = decode(adapter, [Edit("make it snow", (REFERENCE, flipped))], settings).codes
    assert not torch.equal(text, edit) and not torch.equal(edit, both)


def test_reference_is_padded_to_a_grey_square_as_upstream():
    """A 40 x 30 reference: its long side scaled to the square's, centred between grey bands (127,
    upstream's background), in [-1, 1]."""
    out = square(REFERENCE, 32)
    assert out.shape == (3, 32, 32) and float(out.min()) >= -1 and float(out.max()) <= 1
    grey = 127 / 255 * 2 - 1
    assert torch.allclose(out[:, :, :4], torch.full((3, 32, 4), grey))  # 24 px wide, centred
    assert torch.allclose(out[:, :, -4:], torch.full((3, 32, 4), grey))
    assert not torch.allclose(out[:, :, 4:28], torch.full((3, 32, 24), grey))


def test_placeholders_in_the_text_are_refused(adapter):
    with pytest.raises(ValueError, match="remove them from the text"):
        decode(
            adapter,
            [Edit(f"make it {PLACEHOLDER}", (REFERENCE,))],
            method_settings("ar", 1, SamplingSettings()),
        )


def test_reference_towers_stay_apart_and_are_counted_for_an_edit(adapter):
    """The understanding tower and the VQ encoder are no part of the module a memory manager moves
    (text to image never runs them): they stay on the CPU, and an edit's memory estimate counts
    them for its prefill."""
    from sjdvp_core.engine.budget import decode_bytes

    held = {id(p) for p in adapter.module.parameters()}
    assert not any(id(p) in held for p in adapter.reference_encoder.parameters())
    settings = method_settings("sjd", 4, adapter.default_sampling)
    edit = Edit("make it snow", (REFERENCE,))
    decode(adapter, [edit], settings)
    assert all(p.device.type == "cpu" for p in adapter.reference_encoder.parameters())
    towers = adapter.reference_bytes([edit])
    assert towers > 0 and adapter.reference_bytes(["make it snow"]) == 0
    assert (
        decode_bytes(adapter, settings, [edit]) - decode_bytes(adapter, settings, ["make it snow"])
        >= towers
    )
