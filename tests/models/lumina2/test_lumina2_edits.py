"""Lumina-mGPT 2.0 Omni's edits: a dual panel whose upper half is the reference (a depth map, a canny
edge map, a subject), as lumina_mgpt/generate_examples/generate.py and inference_solver.py of
github.com/Alpha-VLLM/Lumina-mGPT-2.0 build it: the dual-panel request, the panel's image start
with the full panel's height, the reference's MoVQGAN rows; the guidance branch from the image start
on (the reference kept); the lower panel decoded under the reference. Checked against a plain loop
(two unpadded rows, full recompute, greedy)."""

import numpy as np
import pytest
import torch
from PIL import Image

from sjdvp_core import decode
from sjdvp_core.engine.adapter import Edit, PixelSettings
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.hf_adapter import to_image
from sjdvp_core.models.images import pil_image
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.lumina2.adapter import DUAL, IMAGE_BASE, center_crop
from tests.helpers.tiny_lumina2 import OMNI_POSITIONS, REFERENCE, write_lumina2

EDIT = Edit("depth map | a red fox", (REFERENCE,))


@pytest.fixture(scope="module")
def adapter(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("models") / "Lumina-mGPT-2.0-Omni")
    return load_model(write_lumina2(folder, positions=OMNI_POSITIONS), width=32, height=32)


def test_prompt_is_omnis_dual_panel_and_guidance_keeps_the_reference(adapter):
    tok = adapter.tokenizer
    text = DUAL.format(w=32, h=64, shown="depth map", prompt="a red fox")
    rows = adapter.prompt_ids([EDIT], None, cfg=True)
    codes = adapter.reference_codes(EDIT)
    reference = []
    for row in codes.tolist():
        reference += [IMAGE_BASE + c for c in row] + [tok.id("<reserved08799>")]
    panel = [tok.id("<racm3:break>"), tok.id("<reserved08802>"), tok.id("<reserved08801>")]
    assert rows[0] == [adapter.bos] + tok.encode(text + "<reserved08706>") + panel + reference
    assert rows[1] == panel + reference  # upstream: the sequence from the image start on
    assert codes.shape == (4, 4) and adapter.prompt_length([EDIT], None, True) == len(rows[0])


def test_reference_is_centre_cropped_as_upstream():
    """40 x 48 px to 32 x 32: scaled by 0.8 to cover (bicubic), the centre cut."""
    image = pil_image(REFERENCE)
    scaled = image.resize((round(48 * 0.8), 32), resample=Image.BICUBIC)
    left = (scaled.width - 32) // 2
    expected = scaled.crop((left, 0, left + 32, 32))
    assert (np.asarray(center_crop(image, 32, 32)) == np.asarray(expected)).all()


@torch.no_grad()
def plain_edit(adapter, scale: float) -> list[int]:
    """Greedy, two rows each at its own length, every step recomputed from the start."""
    cond, uncond = (torch.tensor(r)[None] for r in adapter.prompt_ids([EDIT], None, True))
    model, forced = adapter.model, adapter.layout.forced
    image = adapter.image_tokens
    out = []
    for p in range(adapter.layout.length):
        if forced[p] >= 0:
            token = int(forced[p])
        else:
            a, b = (model(input_ids=r).logits[0, -1, image].float() for r in (cond, uncond))
            token = int(image[(b + scale * (a - b)).argmax()])
        out.append(token)
        cond, uncond = (torch.cat([r, torch.tensor([[token]])], 1) for r in (cond, uncond))
    return out


@pytest.mark.parametrize("method, window", [("ar", 1), ("sjd-vp", 8)])
def test_edit_decodes_as_the_plain_loop(adapter, method, window):
    sampling = SamplingSettings(cfg_scale=4.0, greedy=True, temperature=0.0)
    ours = decode(adapter, [EDIT], method_settings(method, window, sampling)).tokens
    assert ours[0].tolist() == plain_edit(adapter, 4.0)


def test_lower_panel_is_decoded_under_the_reference(adapter):
    sampling = SamplingSettings(cfg_scale=4.0, top_k=8)
    codes = decode(adapter, [EDIT], method_settings("sjd", 4, sampling)).codes
    image = adapter.decode_image(codes, PixelSettings((EDIT,)))
    panel = torch.cat([adapter.reference_codes(EDIT), codes[0]])[None]
    whole = to_image(adapter.image_decoder.decode_code(panel))
    assert image.shape == (1, 32, 32, 3) and torch.allclose(image, whole[:, 32:])


@pytest.mark.parametrize(
    "condition, message",
    [
        (Edit("a red fox", (REFERENCE,)), "what the reference shows, then '|'"),
        (Edit("depth map | a fox", (REFERENCE, REFERENCE)), "take one reference image"),
    ],
)
def test_an_edit_it_cannot_read_is_named(adapter, condition, message):
    with pytest.raises(ValueError, match=message):
        decode(adapter, [condition], method_settings("ar", 1, adapter.default_sampling))


def test_a_checkpoint_without_the_encoder_refuses_edits_by_name(adapter):
    encoder, adapter.reference_encoder = adapter.reference_encoder, None
    adapter.sources.clear()
    try:
        with pytest.raises(ValueError, match="holds no encoder"):
            decode(adapter, [EDIT], method_settings("ar", 1, adapter.default_sampling))
    finally:
        adapter.reference_encoder = encoder
