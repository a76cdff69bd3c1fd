"""GLM-Image's token stage on a tiny folder in the release's layout (tests/helpers/tiny_glm_image.py): the engine's
plain AR decode writes transformers' generate() tokens, token for token, with the 3-D positions computed from the
layout; greedy SJD and SJD-VP return AR's tokens on chains and trees; window steps with rollback equal a recompute;
a tree's forward equals its branches'; sizes, guidance and sampling as the release has them; the image grid through
diffusers' pipeline (DiT, VAE, glyph encoder) gives the images, step by step."""
from __future__ import annotations

import pytest
import torch

from sjdvp_core import SamplingSettings, decode, method_settings
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.glm_image.adapter import GENERATE_DEFAULTS, is_glm_image, load_glm_image
from sjdvp_core.models.glm_image.dit import GlmImageDiT, prior_token_ids
from tests.helpers.tiny_glm_image import CODES, SAMPLING, write_glm_image
from tests.helpers.tiny_hf import assert_greedy_sjd_equals_ar, assert_windows_match_recompute
from tests.helpers.tree_check import assert_tree_matches_chains

PROMPTS = ["a red fox in the snow", "a sky"]
GREEDY = SamplingSettings(greedy=True, temperature=0.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_glm_image(str(tmp_path_factory.mktemp("models") / "GLM-Image"))


@pytest.fixture(scope="module")
def adapter(folder):
    return load_glm_image(folder, width=64, height=96)      # a 3 x 2 image grid after a 19 x 13 prior grid


def test_layout_follows_the_processor(folder, adapter):
    assert is_glm_image(folder)
    layout = adapter.layout
    assert layout.prior_grids[0].shape == (19, 13) and layout.grid.shape == (3, 2)
    assert layout.length == 19 * 13 + 3 * 2 + 1 and int(layout.forced[-1]) == CODES + 1
    assert layout.jacobi_span == (0, 19 * 13 + 3 * 2)
    rope = adapter.rope                                     # prior cell (1, 2), image cell (2, 1), the end
    assert rope[:, 13 + 2].tolist() == [0, 1, 2]
    assert rope[:, 19 * 13 + 2 * 2 + 1].tolist() == [19, 19 + 2, 19 + 1] and rope[:, -1].tolist() == [22] * 3


@torch.inference_mode()
def test_ar_writes_upstream_generates_tokens(adapter):
    """Each prompt through transformers' own generate() (greedy, the head's ids past the codes suppressed as the
    engine restricts grid positions to codes), against one batched engine decode: the grids agree."""
    ours = decode(adapter, PROMPTS, method_settings("ar", 1, GREEDY, batch_size=2)).tokens
    n = adapter.layout.length
    for row, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        inputs = adapter.processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                                       processor_kwargs={"target_h": 96, "target_w": 64})
        out = adapter.model.generate(**inputs, max_new_tokens=n, do_sample=False,
                                     suppress_tokens=list(range(CODES, adapter.logits_width)))
        upstream = out[0, inputs["input_ids"].shape[1]:]
        assert torch.equal(upstream[:n - 1], ours[row, :n - 1]), row


def test_greedy_sjd_equals_ar_on_chains_and_trees(adapter):
    assert_greedy_sjd_equals_ar(adapter, PROMPTS, windows=(4, 16), cfg_scales=(1.0,))
    assert adapter.cache is None


def test_tree_forward_equals_its_chains(adapter):
    assert_tree_matches_chains(adapter, PROMPTS, False)


@torch.inference_mode()
def test_windows_with_rollback_equal_a_recompute(adapter):
    prompts = [adapter._encode(p) for p in PROMPTS]

    def reference(row: int, tokens: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor(prompts[row] + tokens.tolist())[None]
        P = len(prompts[row])
        text = torch.arange(P).expand(3, -1)
        positions = torch.cat([text, P + adapter.rope[:, :len(tokens)]], 1)[:, None]        # [3, 1, T]
        out = adapter.model(input_ids=ids, position_ids=positions)
        return out.logits[0, P - 1:].float()
    assert_windows_match_recompute(adapter, PROMPTS, False, reference)


def test_sizes_guidance_and_sampling(folder, adapter, tmp_path):
    with pytest.raises(ValueError, match="multiples of 32 px .* the nearest is 96x64"):
        adapter.with_size(100, 70)
    assert adapter.with_size(128, 64).layout.grid.shape == (2, 4)
    with pytest.raises(ValueError, match="no classifier-free guidance"):
        decode(adapter, PROMPTS[:1], method_settings("sjd", 4, SamplingSettings(cfg_scale=3.0)))
    s = adapter.default_sampling
    assert (s.temperature, s.top_p, s.top_k, s.cfg_scale) == (SAMPLING["temperature"], SAMPLING["top_p"],
                                                              GENERATE_DEFAULTS["top_k"], 1.0)
    silent = load_glm_image(write_glm_image(str(tmp_path / "silent"), sampling={}), width=64, height=64)
    assert silent.default_sampling == SamplingSettings(**GENERATE_DEFAULTS)


def test_sampled_sjd_vp_decodes_codes_only(adapter):
    res = decode(adapter, PROMPTS, method_settings("sjd-vp", 16, adapter.default_sampling, batch_size=2, seed=3))
    grids = res.tokens[:, :-1]
    assert bool((grids < CODES).all()) and bool((res.tokens[:, -1] == CODES + 1).all())
    assert res.codes.shape == (2, 3, 2)


def test_pixel_stage_draws_the_image_grid_with_the_dit(folder, adapter):
    """The token stage's image grid through diffusers' pipeline (its own token stage skipped): one image per
    prompt at the grid's size, a progress report per DiT step, and a progress hook that raises stops it."""
    res = decode(adapter, PROMPTS, method_settings("sjd-vp", 16, adapter.default_sampling, batch_size=2))
    dit = GlmImageDiT(folder)
    steps = []
    images = dit(PROMPTS, res.codes, steps=3, progress=lambda done, total: steps.append((done, total)))
    assert images.shape == (2, 96, 64, 3) and steps == [(1, 3), (2, 3), (3, 3)]
    assert 0 <= float(images.min()) and float(images.max()) <= 1
    again = dit(PROMPTS, res.codes, steps=3)
    assert torch.equal(images, again)                      # the seed decides the noise
    assert prior_token_ids(torch.tensor([[[1, 2]]])).tolist() == [[1, 1, 2, 2, 1, 1, 2, 2]]

    def cancel(done, total):
        raise InterruptedError
    with pytest.raises(InterruptedError):
        dit(PROMPTS, res.codes, steps=3, progress=cancel)


def test_pixel_stage_names_missing_parts(folder, tmp_path):
    import shutil
    partial = tmp_path / "GLM-Image"
    shutil.copytree(folder, partial, ignore=shutil.ignore_patterns("vae"))
    with pytest.raises(CheckpointError, match=r"missing the folders vae; download every file of zai-org/GLM-Image"):
        GlmImageDiT(str(partial))
