"""GLM-Image on a tiny folder in the release's layout (tests/helpers/tiny_glm_image.py), beyond the
family contract (tests/models/test_family_contract.py: detection, greedy SJD == AR on chains and trees,
tree forwards, broken files, the check command): the engine's plain AR decode writes
transformers' generate() tokens, token for token, with the 3-D positions computed from the
layout; window steps with rollback equal a recompute; sizes, guidance and sampling as the release
has them; the DiT draws the image diffusers' pipeline draws from the same tokens, step by step;
the preview needs no DiT; the pixel model stays apart from the token stage (listing,
quantisation, memory)."""

from __future__ import annotations

import pytest
import torch

from sjdvp_core import SamplingSettings, decode, method_settings
from sjdvp_core.engine.adapter import Edit, PixelSettings
from sjdvp_core.models.glm_image import is_glm_image
from sjdvp_core.models.glm_image.adapter import GENERATE_DEFAULTS, load_glm_image
from sjdvp_core.models.glm_image.dit import prior_token_ids
from tests.helpers.tiny_glm_image import CODES, SAMPLING, SOURCE, WIDE, edits, write_glm_image
from tests.helpers.tiny_hf import assert_windows_match_recompute

PROMPTS = ["a red fox in the snow", "a sky"]
GREEDY = SamplingSettings(greedy=True, temperature=0.0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_glm_image(str(tmp_path_factory.mktemp("models") / "GLM-Image"))


@pytest.fixture(scope="module")
def adapter(folder):
    # a 3 x 2 image grid after a 19 x 13 prior grid
    return load_glm_image(folder, width=64, height=96)


def test_layout_follows_the_processor(folder, adapter):
    assert is_glm_image(folder)
    layout = adapter.layout
    assert layout.prior_grids[0].shape == (19, 13) and layout.grid.shape == (3, 2)
    assert layout.length == 19 * 13 + 3 * 2 + 1 and int(layout.forced[-1]) == CODES + 1
    assert layout.jacobi_span == (0, 19 * 13 + 3 * 2)
    rope = adapter.rope  # prior cell (1, 2), image cell (2, 1), the end
    assert rope[:, 13 + 2].tolist() == [0, 1, 2]
    assert (
        rope[:, 19 * 13 + 2 * 2 + 1].tolist() == [19, 19 + 2, 19 + 1]
        and rope[:, -1].tolist() == [22] * 3
    )


@torch.inference_mode()
def test_ar_writes_upstream_generates_tokens(adapter):
    """Each prompt through transformers' own generate() (greedy, the head's ids past the codes
    suppressed as the engine restricts grid positions to codes), against one batched engine
    decode: the grids agree."""
    ours = decode(adapter, PROMPTS, method_settings("ar", 1, GREEDY, batch_size=2)).tokens
    n = adapter.layout.length
    for row, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        inputs = adapter.processor.apply_chat_template(
            messages,
            tokenize=True,
            return_dict=True,
            return_tensors="pt",
            processor_kwargs={"target_h": 96, "target_w": 64},
        )
        out = adapter.model.generate(
            **inputs,
            max_new_tokens=n,
            do_sample=False,
            suppress_tokens=list(range(CODES, adapter.logits_width)),
        )
        upstream = out[0, inputs["input_ids"].shape[1] :]
        assert torch.equal(upstream[: n - 1], ours[row, : n - 1]), row


@torch.inference_mode()
def test_windows_with_rollback_equal_a_recompute(adapter):
    prompts = [adapter._encode(p).ids for p in PROMPTS]

    def reference(row: int, tokens: torch.Tensor) -> torch.Tensor:
        ids = torch.tensor(prompts[row] + tokens.tolist())[None]
        P = len(prompts[row])
        text = torch.arange(P).expand(3, -1)
        positions = torch.cat([text, P + adapter.rope[:, : len(tokens)]], 1)[:, None]  # [3, 1, T]
        out = adapter.model(input_ids=ids, position_ids=positions)
        return out.logits[0, P - 1 :].float()

    assert_windows_match_recompute(adapter, PROMPTS, False, reference)


def test_sizes_guidance_and_sampling(folder, adapter, tmp_path, caplog):
    with pytest.raises(ValueError, match="multiples of 32 px .* the nearest is 96x64"):
        adapter.with_size(100, 70)
    assert adapter.with_size(128, 64).layout.grid.shape == (2, 4)
    # past about 256:1 the small first grid has no row or column
    for wide, tall in (
        (8224, 32),
        (32, 8224),
    ):
        with pytest.raises(ValueError, match="too far from square for GLM-Image"):
            adapter.with_size(wide, tall)
    with pytest.raises(ValueError, match="no classifier-free guidance"):
        decode(adapter, PROMPTS[:1], method_settings("sjd", 4, SamplingSettings(cfg_scale=3.0)))
    with pytest.raises(ValueError, match="no negative prompt"):
        decode(
            adapter,
            PROMPTS[:1],
            method_settings("sjd", 4, adapter.default_sampling),
            negatives="blurry",
        )
    s = adapter.default_sampling
    assert (s.temperature, s.top_p, s.top_k, s.cfg_scale) == (
        SAMPLING["temperature"],
        SAMPLING["top_p"],
        GENERATE_DEFAULTS["top_k"],
        1.0,
    )
    silent = load_glm_image(
        write_glm_image(str(tmp_path / "silent"), sampling={}), width=64, height=64
    )
    assert silent.default_sampling == SamplingSettings(**GENERATE_DEFAULTS)
    with caplog.at_level("WARNING"):
        load_glm_image(
            write_glm_image(
                str(tmp_path / "penalised"), sampling=SAMPLING | {"repetition_penalty": 1.2}
            )
        )
    assert "repetition_penalty=1.2, which sjdvp does not apply" in caplog.text


def test_sampled_sjd_vp_decodes_codes_only(adapter):
    res = decode(
        adapter,
        PROMPTS,
        method_settings("sjd-vp", 16, adapter.default_sampling, batch_size=2, seed=3),
    )
    grids = res.tokens[:, :-1]
    assert bool((grids < CODES).all()) and bool((res.tokens[:, -1] == CODES + 1).all())
    assert res.codes.shape == (2, 3, 2)


def test_pixel_stage_draws_the_image_grid_with_the_dit(folder, adapter):
    """The token stage's image grid through the DiT: the image diffusers' own pipeline draws from
    the same tokens (prior_token_ids, its token stage skipped) and seed, one per prompt at the
    grid's size, a progress report per DiT step, and a progress hook that raises stops it."""
    from diffusers import GlmImagePipeline

    res = decode(
        adapter, PROMPTS, method_settings("sjd-vp", 16, adapter.default_sampling, batch_size=2)
    )
    steps = []
    pixels = PixelSettings(
        PROMPTS, steps=3, seed=5, progress=lambda done, total: steps.append((done, total))
    )
    images = adapter.decode_image(res.codes, pixels)
    assert images.shape == (2, 96, 64, 3) and steps == [(1, 3), (2, 3), (3, 3)]
    assert 0 <= float(images.min()) and float(images.max()) <= 1
    pipe = GlmImagePipeline.from_pretrained(folder)
    theirs = pipe(
        prompt=PROMPTS,
        height=96,
        width=64,
        prior_token_ids=prior_token_ids(res.codes),
        num_inference_steps=3,
        generator=torch.Generator().manual_seed(5),
        output_type="pt",
    ).images
    assert torch.allclose(images, theirs.permute(0, 2, 3, 1), atol=1e-6)
    assert prior_token_ids(torch.tensor([[[1, 2]]])).tolist() == [[1, 1, 2, 2, 1, 1, 2, 2]]

    def cancel(done, total):
        raise InterruptedError

    with pytest.raises(InterruptedError):
        adapter.decode_image(res.codes, PixelSettings(PROMPTS, steps=3, progress=cancel))
    with pytest.raises(ValueError, match="give the prompts"):
        adapter.decode_image(res.codes)
    with pytest.raises(ValueError, match="one prompt per image"):
        adapter.decode_image(res.codes, PixelSettings(PROMPTS[:1], steps=1))


def test_preview_colours_codes_without_the_dit(adapter):
    """A live preview costs no DiT step: each code a colour from the codebook (equal codes, equal
    colours)."""
    codes = torch.tensor([[[0, 1], [1, 0], [2, 3]]])
    preview = adapter.preview_image(codes)
    assert (
        preview.shape == (1, 96, 64, 3) and 0 <= float(preview.min()) and float(preview.max()) <= 1
    )
    assert torch.equal(preview[0, 0, 0], preview[0, 32, 32]) and not torch.equal(
        preview[0, 0, 0], preview[0, 0, 32]
    )


def test_detected_listed_and_loaded_with_its_pixel_stage_apart(folder, tmp_path):
    """The release's folder is a model (its parts' folders are not); the token stage's folder alone
    says which to choose; load_model gives the adapter with the pixel model apart; int8 and NF4
    quantise the DiT's blocks with the token stage (its embeddings, VAE and glyph encoder keep
    their dtype), and the DiT still draws the image the float one draws from the same tokens,
    within the weights' rounding; the memory estimate leaves out the pixel model, which a memory
    manager loads after the decode."""
    import os
    import shutil

    from sjdvp_core.models.loading import load_model
    from sjdvp_core.models.memory import weight_need
    from sjdvp_core.models.quantize import is_quantised, quantisable, weight_bytes
    from sjdvp_core.models.registry import detect_family, list_models

    root = tmp_path / "models"
    shutil.copytree(folder, root / "GLM-Image")
    assert detect_family(str(root / "GLM-Image")) == "glm_image"
    assert list_models([str(root)]) == ["demo", "GLM-Image"]
    with pytest.raises(ValueError, match="token stage alone; choose the folder above it"):
        detect_family(os.path.join(folder, "vision_language_encoder"))
    full = load_model(str(root / "GLM-Image"), precision="fp32", width=64, height=96)
    res = decode(full, PROMPTS[:1], method_settings("sjd-vp", 8, full.default_sampling))
    pixels = PixelSettings(PROMPTS[:1], steps=2, seed=3)
    drawn = full.decode_image(res.codes, pixels)
    # of fp32, at tiny sizes (scales, NF4's state record)
    for precision, most in (
        ("int8", 0.4),
        ("nf4", 0.6),
    ):
        quantised = load_model(str(root / "GLM-Image"), precision=precision, width=64, height=96)
        assert quantised.pixels_apart and quantised.precision == precision
        dit = {id(p) for p in quantised.image_decoder.parameters()}
        assert dit and not dit & {id(p) for p in quantised.module.parameters()}
        assert is_quantised(torch.nn.ModuleList(quantised.pixel_blocks()))
        assert not quantisable(quantised.pixel_blocks())  # every DiT block linear was swapped
        kept = [
            quantised.dit.pipe.vae,
            quantised.dit.pipe.text_encoder,
            quantised.dit.pipe.transformer.proj_out,
        ]
        assert all(p.dtype == torch.float32 for m in kept for p in m.parameters())
        dit_bytes = weight_bytes(torch.nn.ModuleList(quantised.pixel_blocks()))
        assert dit_bytes <= most * weight_bytes(torch.nn.ModuleList(full.pixel_blocks())), precision
        image = quantised.decode_image(res.codes, pixels)
        assert image.shape == (1, 96, 64, 3) and (image - drawn).abs().mean() < 0.01, precision
    tokens_only = sum(
        t.numel() * t.element_size() for t in load_model(folder).module.state_dict().values()
    )
    assert weight_need(load_model(folder), "fp32", "fp32") == tokens_only


def test_a_release_without_the_vq_decoder_convolution_loads(folder, tmp_path):
    """The VQ's post_quant_conv is built by transformers and run by nothing here (the DiT draws the
    pixels): a release that leaves it out loads and decodes the same tokens; any other missing
    tensor is still refused by name."""
    import shutil

    from safetensors.torch import load_file, save_file

    from sjdvp_core.models.checkpoint import CheckpointError
    from sjdvp_core.models.loading import load_model

    def without(name: str, prefix: str) -> str:
        copy = tmp_path / name
        shutil.copytree(folder, copy)
        path = copy / "vision_language_encoder" / "model.safetensors"
        tensors = load_file(str(path))
        save_file(
            {k: v for k, v in tensors.items() if not k.startswith(prefix)},
            str(path),
            metadata={"format": "pt"},
        )
        return str(copy)

    settings = method_settings("sjd", 8, GREEDY)
    lean = load_model(
        without("no_post_quant_conv", "model.vqmodel.post_quant_conv."), width=64, height=96
    )
    full = load_model(folder, width=64, height=96)
    assert torch.equal(
        decode(lean, PROMPTS[:1], settings).codes, decode(full, PROMPTS[:1], settings).codes
    )
    with pytest.raises(
        CheckpointError, match=r"the weights lack 2 tensors .*model\.vqmodel\.quant_conv\.bias"
    ):
        load_model(without("no_quant_conv", "model.vqmodel.quant_conv."))


def test_auto_chooses_the_dits_precision_for_the_dit_alone(folder):
    """The DiT runs alone on the card once the token stage has left it: auto keeps it in the compute
    dtype where its weights fit, also when the token stage must be quantised (it was quantised
    with the token stage), and quantises it only where it must; the precision line says both."""
    from sjdvp_core.models.loading import fit_precision, load_model
    from sjdvp_core.models.memory import need, pixel_weight_need
    from sjdvp_core.models.quantize import Int8Linear

    def quantised(blocks):
        return any(isinstance(m, Int8Linear) for b in blocks for m in b.modules())

    cpu = torch.device("cpu")
    model = load_model(folder, precision="fp32")
    memory = need(
        model, "int8", "fp32"
    ).total  # the token stage fits as int8 only; the DiT as it is
    assert need(model, "fp32", "fp32").total > memory >= pixel_weight_need(model, "fp32", "fp32")
    assert fit_precision(model, "fp32", memory, cpu) == "int8"
    assert quantised(model.blocks()) and not quantised(model.pixel_blocks())
    assert (
        model.precision.startswith("int8 (auto: ")
        and "; the DiT fp32 (auto: fp32: needs" in model.precision
    )
    small = load_model(folder, precision="fp32")
    fit_precision(small, "fp32", pixel_weight_need(small, "int8", "fp32"), cpu)
    assert (
        quantised(small.pixel_blocks()) and "; the DiT int8 (auto: int8: needs" in small.precision
    )


# --- editing: source images in the prompt, only the image grid written ----------------------------
def _upstream_inputs(adapter, edit: Edit):
    """Upstream's inputs for one edit. transformers 5.17's processor leaves the sources' grids out
    of one prompt's (its model then fails): they are put back as 5.18's processor gives them, so
    that its model is the reference."""
    from sjdvp_core.models.images import pil_image as _pil

    content = [{"type": "image", "image": _pil(i)} for i in edit.images] + [
        {"type": "text", "text": edit.text}
    ]
    inputs = adapter.processor.apply_chat_template(
        [{"role": "user", "content": content}],
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        processor_kwargs={"target_h": 96, "target_w": 64},
    )
    n = len(edit.images)
    if len(inputs["image_grid_thw"]) <= n:
        sources = adapter.processor.image_processor(
            images=[_pil(i) for i in edit.images], return_tensors="pt"
        )
        inputs["image_grid_thw"] = torch.cat([sources["image_grid_thw"], inputs["image_grid_thw"]])
        inputs["images_per_sample"] = inputs["images_per_sample"] + n
    return inputs


@torch.inference_mode()
def test_edit_ar_writes_upstream_generates_tokens(adapter):
    """Source images in the prompt (their tokens from the model's vision encoder and VQ, placed in
    2-D): the engine's greedy AR decode of a batch writes what transformers' generate() writes
    for each edit, the image grid only."""
    ours = decode(adapter, edits(), method_settings("ar", 1, GREEDY, batch_size=2))
    L = 3 * 2 + 1
    assert ours.tokens.shape == (2, L) and ours.codes.shape == (2, 3, 2)
    for row, edit in enumerate(edits()):
        inputs = _upstream_inputs(adapter, edit)
        out = adapter.model.generate(
            **inputs,
            max_new_tokens=L,
            do_sample=False,
            suppress_tokens=list(range(CODES, adapter.logits_width)),
        )
        assert torch.equal(
            out[0, inputs["input_ids"].shape[1] :][: L - 1], ours.tokens[row, : L - 1]
        ), row
    # text to image's layout again after the edit
    assert adapter.layout.length == 19 * 13 + 3 * 2 + 1


@torch.inference_mode()
def test_edit_positions_follow_get_rope_index(adapter):
    """Two source images of different sizes: the prompt's 3-D positions and the generated grid's
    are upstream's."""
    from sjdvp_core.models.glm_image.adapter import prompt_rope

    edit = Edit("put the two together", (SOURCE, WIDE))
    inputs = _upstream_inputs(adapter, edit)
    theirs, _ = adapter.model.model.get_rope_index(
        inputs["input_ids"],
        inputs["image_grid_thw"],
        inputs["images_per_sample"],
        inputs["attention_mask"],
    )
    row = adapter._encode(edit)
    assert len(row.grids) == 2 and row.grids[0] != row.grids[1]  # as the processor sized them
    ours, after = prompt_rope(row.ids, row.grids, adapter.image_start, adapter.image_end)
    assert torch.equal(ours, theirs[:, 0])
    # upstream's table for its generate()
    generated = adapter.model.model._cached_decode_position_ids[0]
    assert torch.equal(after + adapter.layouts[True][1], generated)


def test_edit_runs_on_transformers_5_17():
    """The loader takes transformers 5.x from 5.0: on 5.17, get_image_features gives each image's
    features flat and get_image_tokens takes them with the grids (5.18 reshaped both), and its
    processor leaves the sources' grids out of one prompt's (every edit failed there:
    "torch.cat(): expected a non-empty list"). This file's edit tests, in a process with 5.17
    first on its path."""
    import transformers

    from tests.helpers.older_transformers import run_pytest

    if transformers.__version__.startswith("5.17."):
        pytest.skip("this process runs transformers 5.17 already")
    run = run_pytest("5.17.0", __file__, "edit and not transformers_5_17")
    assert run.returncode == 0 and " passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    assert "failed" not in run.stdout.splitlines()[-1], run.stdout[-4000:]


def test_edit_source_block_laid_out_otherwise_is_refused(adapter):
    """A source image's block must be its start token, h x w image tokens and its end token (as the
    processor lays it out); anything else was read as text, the image's 2-D positions lost
    without a word."""
    from sjdvp_core.models.glm_image.adapter import prompt_rope

    start, end, code = adapter.image_start, adapter.image_end, 7
    good = [1, start, *[code] * 4, end, 2, start]
    assert prompt_rope(good, [(2, 2)], start, end)[1] == 1 + 1 + 2 + 2 + 1
    for broken, why in (
        ([1, start, *[code] * 3, end, 2, start], "not laid out as its start token, 2 x 2"),
        ([1, start, *[code] * 4, 2, end, start], "not laid out as its start token, 2 x 2"),
        ([1, 2, 3], "holds 0 source image blocks for 1 source images"),
    ):
        with pytest.raises(ValueError, match=why) as err:
            prompt_rope(broken, [(2, 2)], start, end)
        assert "zai-org/GLM-Image" in str(err.value)


def test_edit_dit_draws_from_the_sources(folder, adapter):
    """The DiT gets each edit's source images (sized to their token grids) and their tokens (2 x 2
    blocks, grids doubled), as the pipeline takes them; a batch mixing edits and text alone is
    refused."""
    from diffusers import GlmImagePipeline

    from sjdvp_core.models.glm_image.adapter import source_image

    batch = edits()
    res = decode(
        adapter, batch, method_settings("sjd-vp", 4, adapter.default_sampling, batch_size=2, seed=1)
    )
    ours = adapter.decode_image(res.codes, PixelSettings(batch, steps=2, seed=5))
    codes, [(h, w)] = adapter.source_tokens(batch[0])
    assert codes.shape == (h * w,) and bool((codes < CODES).all())
    ids, thw = prior_token_ids(codes.view(1, h, w))[0], torch.tensor([[1, 2 * h, 2 * w]])
    sized = source_image(SOURCE, (h, w))
    assert sized.size == (32 * w, 32 * h)
    pipe = GlmImagePipeline.from_pretrained(folder)
    theirs = pipe(
        prompt=[e.text for e in batch],
        image=[[sized], [sized]],
        height=96,
        width=64,
        prior_token_ids=prior_token_ids(res.codes),
        prior_token_image_ids=[ids, ids],
        source_image_grid_thw=[thw, thw],
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(5),
        output_type="pt",
    ).images
    assert torch.allclose(ours, theirs.permute(0, 2, 3, 1), atol=1e-6)
    plain = adapter.decode_image(res.codes, PixelSettings([e.text for e in batch], steps=2, seed=5))
    assert not torch.allclose(ours, plain)  # the sources condition the DiT
    with pytest.raises(ValueError, match="either as edits of images or from text alone"):
        decode(
            adapter,
            [batch[0], "a sky"],
            method_settings("sjd", 4, adapter.default_sampling, batch_size=2),
        )
    with pytest.raises(ValueError, match="at least one image"):
        Edit("make it snow", ())
    # a batch tensor is images too
    assert len(Edit("make it snow", torch.stack([SOURCE, SOURCE])).images) == 2
    with pytest.raises(
        ValueError, match=r"an Edit's images are RGB \[H, W, 3\] tensors .*got \(64, 64, 1\)"
    ):
        Edit("make it snow", (SOURCE[..., :1],))


def test_the_catalogue_entry_downloads_the_release_folder(folder, tmp_path, monkeypatch):
    """'GLM-Image (download, ...)' through the real huggingface_hub client from a tiny Hub serving
    the release's folder as zai-org/GLM-Image (tests/helpers/fake_hub.py): each of the entry's
    patterns takes files there, the folder lands as released (its README and .gitattributes left
    out), and it is listed, found and detected as GLM-Image."""
    import os

    from sjdvp_core.hub import catalogue
    from sjdvp_core.hub.download import download, on_disk
    from sjdvp_core.models.registry import detect_family, list_models
    from tests.helpers.fake_hub import FakeHub

    def files(root: str) -> dict[str, bytes]:
        """Every file under root by its path in the repository."""
        out = {}
        for base, _, names in os.walk(root):
            for name in names:
                with open(os.path.join(base, name), "rb") as f:
                    out[os.path.relpath(os.path.join(base, name), root).replace(os.sep, "/")] = (
                        f.read()
                    )
        return out

    release = files(folder)
    entry = catalogue.BY_NAME["GLM-Image"]
    with FakeHub(lifetime=120) as hub:
        hub.add(
            entry.sources[0].repo,
            release | {"README.md": b"---\nlicense: mit\n---\n", ".gitattributes": b""},
        )
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        path = download(entry, str(tmp_path))
    assert set(files(path)) == set(release) and path == str(tmp_path / "GLM-Image")
    assert on_disk(entry, [str(tmp_path)]) == path and list_models([str(tmp_path)]) == [
        "demo",
        "GLM-Image",
    ]
    assert detect_family(path) == "glm_image"
