"""Completing a picture with LlamaGen (and the built-in demo, a small LlamaGen): an edit gives its
reference's upper half, tokenised by the VQ's encoder, as image tokens after the condition, and the
model draws the lower half; the picture returned is the whole one."""

import pytest
import torch

from sjdvp_core import decode
from sjdvp_core.demo import load_demo, scenes
from sjdvp_core.engine.adapter import Edit, PixelSettings
from sjdvp_core.engine.settings import SamplingSettings, method_settings

PROMPT = "a red circle on grass"
SCENE = scenes.render(scenes.prompt_to_class(PROMPT), torch.Generator().manual_seed(0))
EDIT = Edit(PROMPT, (SCENE.permute(1, 2, 0),))
GREEDY = SamplingSettings(cfg_scale=3.0, greedy=True, temperature=0.0)


@pytest.fixture(scope="module")
def demo():
    return load_demo()


@torch.no_grad()
def test_the_given_half_enters_as_tokens_one_at_a_time_would(demo):
    """The first drawn token's logits after the given rows in one window equal those after feeding
    them one by one (with the guidance row's, as start() runs them)."""
    given = demo.given_codes(EDIT)
    layout, first = demo.start([EDIT], None, True)
    demo.finish()
    gpt, cls = demo.gpt, demo.config.cls_token_num
    prefix, _ = demo._prefix([PROMPT], None, True)
    gpt.setup_caches(2)
    gpt.prefill(prefix)
    for i, token in enumerate(given.tolist()):
        logits = gpt.decode(torch.tensor([[token]] * 2), torch.tensor([[cls + i]] * 2))
    gpt.release_caches()
    assert layout.length == demo.config.grid**2 // 2 and given.numel() == layout.length
    assert torch.allclose(first, logits[:, -1], atol=1e-5)


def test_completion_keeps_the_reference_above_and_is_exact(demo):
    ar = decode(demo, [EDIT], method_settings("ar", 1, GREEDY))
    vp = decode(demo, [EDIT], method_settings("sjd-vp", 16, GREEDY))
    assert torch.equal(ar.tokens, vp.tokens) and vp.stats.forward_passes < ar.stats.forward_passes
    picture = demo.decode_image(ar.codes, PixelSettings((EDIT,)))
    grid = demo.reference_grid(EDIT)
    whole = demo.decode_image(torch.cat([grid[:8], ar.codes[0]])[None])
    assert picture.shape == (1, 64, 64, 3) and torch.allclose(picture, whole)
    assert demo.layout.length == 256  # the text-to-image layout is back after the decode


def test_a_batch_mixing_completions_and_prompts_is_refused(demo):
    with pytest.raises(ValueError, match="either as completions of images or from text alone"):
        decode(demo, [EDIT, PROMPT], method_settings("ar", 1, GREEDY, batch_size=2))


def test_the_demo_and_its_edits_import_no_transformers():
    """The quick start (and a ComfyUI start) stay light: the demo, LlamaGen and what reads a
    reference image import no transformers (only the families that live there do)."""
    import subprocess
    import sys

    code = (
        "import sys, sjdvp_core.demo, sjdvp_core.models.llamagen.adapter, sjdvp_core.models.images, "
        "sjdvp_core.models.janus; assert 'transformers' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
