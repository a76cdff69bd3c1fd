"""The node layer in-process, with ComfyUI stubbed (tests/comfy/stubs.py): what execute() does with
its widgets, in a fraction of a second each. The live-server suites (test_comfyui*.py,
test_browser.py) check the same nodes inside a real ComfyUI."""

import importlib
import inspect
import math
import os
import types

import pytest
import torch

from tests.comfy import stubs


@pytest.fixture(scope="module")
def pack():
    mm = stubs.install()
    nodes = stubs.load_pack()
    mod = lambda name: importlib.import_module(f"{stubs.PACKAGE}.nodes.{name}")  # noqa: E731
    yield dict(
        mm=mm,
        nodes=nodes,
        decode=mod("decode_nodes"),
        drafting=mod("drafting_nodes"),
        runtime=mod("runtime"),
        settings=importlib.import_module(f"{stubs.PACKAGE}.sjdvp_core.engine.settings"),
    )
    stubs.uninstall()  # after this file's tests: nothing else sees a stubbed ComfyUI


@pytest.fixture(scope="module")
def demo(pack):
    return pack["runtime"].load("demo", "auto", "auto")


def widgets(node) -> dict:
    return {i.name: i for i in node.define_schema().inputs if hasattr(i, "default")}


def run(pack, demo, drafter=None, window=None, **kw):
    """Speculative Decode with every widget given: AR (a connected verifier overrides it), custom
    sampling."""
    args = dict(
        prompt="a red circle on grass",
        negative_prompt="",
        method="AR",
        seed=0,
        batch_size=1,
        width=0,
        height=0,
        sampling="custom",
        cfg=3.0,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        compile=False,
        passes="auto",
    )
    args.update(kw)
    return pack["decode"].SpeculativeDecode.execute(demo, window=window, drafter=drafter, **args)


def fixed_window(pack, size, tree_width=1, tree_depth=1, init="random"):
    """A Jacobi Window node's fixed window (window_auto and tree_auto off)."""
    return (
        pack["drafting"]
        .JacobiWindow.execute(size, False, False, tree_width, tree_depth, init)
        .values[0]
    )


def to_image(pack, tokens, steps=50, guidance=1.5):
    return pack["decode"].DecodeImage.execute(tokens, steps, guidance).values[0]


def test_widget_defaults_come_from_the_engine_settings(pack):
    s, d = pack["settings"], pack["drafting"]
    # a new node chooses its window (window_auto), up to 64 tokens per pass: the one default window
    assert widgets(d.JacobiWindow)["window"].default == s.DEFAULT_WINDOW.size == 64
    assert widgets(d.JacobiWindow)["window_auto"].default is True is s.DEFAULT_WINDOW.auto
    assert widgets(d.JacobiWindow)["tree_auto"].default is True is s.DEFAULT_WINDOW.auto_tree
    assert s.DecodeSettings().window == s.DEFAULT_WINDOW
    assert widgets(d.JacobiWindow)["tree_width"].default == s.TreeSettings().width == 1
    assert widgets(d.DrafterSJD)["coupled"].default is s.DrafterSettings().coupled is True
    lantern = widgets(d.DrafterLANTERN)
    assert (lantern["neighbours"].default, lantern["delta"].default) == (
        s.DrafterSettings().lantern_k,
        s.DrafterSettings().lantern_delta,
    )
    vp = widgets(d.VerificationPrediction)
    assert (
        vp["growth_steps"].default == s.VPSettings().growth_steps
        and vp["strength_mode"].default == "auto"
    )
    assert math.isclose(vp["max_score"].default, s.VPSettings().max_score, abs_tol=1e-4)
    assert widgets(pack["decode"].SpeculativeDecode)["sampling"].default == "model defaults"


def test_execute_takes_the_widgets_in_the_schemas_order(pack):
    """From 1.0.0 the widget order is a contract with saved workflows (docs/contributing.md): every
    node's execute takes its inputs in the schema's order, the required ones first, so
    widgets_values map by name as by position; every widget of 1.0.0 is required, and those added
    since are optional, at the end (a prompt without them keeps its meaning)."""
    for node in pack["nodes"].NODES:
        inputs = node.define_schema().inputs
        params = list(inspect.signature(node.execute).parameters)
        required = [i.name for i in inputs if not getattr(i, "optional", False)]
        optional = [i.name for i in inputs if getattr(i, "optional", False)]
        assert params == required + optional, node.__name__
        assert optional == {"SpeculativeDecode": ["images", "window", "drafter", "image_cfg"]}.get(
            node.__name__, []
        )
    d = pack["drafting"]
    vp = d.VerificationPrediction.execute(
        d.DrafterSJD.execute(True).values[0], "fixed", -0.5, 2, 0.5, 50, 1.3863
    )
    assert vp.values[0].vp.strength == -0.5 and vp.values[0].coupled is True


def test_tree_widgets_reach_the_decode(pack, demo):
    d = pack["drafting"]
    assert fixed_window(pack, 16).tree.width == 1
    assert d.JacobiWindow.execute(64, True, False, 1, 1, "random").values[0].auto_tree is False
    assert d.JacobiWindow.execute(64, True, True, 1, 1, "random").values[0].auto_tree is True
    # the user's tree
    assert d.JacobiWindow.execute(64, True, True, 3, 1, "random").values[0].auto_tree is False
    window = fixed_window(pack, 8, 4, 2)
    assert (window.tree.width, window.tree.depth) == (4, 2)
    res = (
        run(pack, demo, window=window, drafter=d.DrafterSJD.execute(True).values[0])
        .values[0]
        .result
    )
    assert res.stats.tree_tried > 0 and res.stats.tokens_per_forward > 8


def test_no_drafter_is_plain_ar_whatever_the_window(pack, demo):
    window = pack["settings"].WindowSettings(32)
    res = run(pack, demo, window=window).values[0].result
    assert res.stats.forward_passes == res.stats.ar_passes == 256
    assert run(pack, demo).values[0].method == "AR"
    # a stray newline is no negative prompt
    assert run(pack, demo, negative_prompt=" \n").values[0].method == "AR"


def test_a_new_decode_node_runs_sjd_vp_with_the_automatic_window(pack, demo):
    """The three-node graph (model -> Speculative Decode -> image) is the fast one; the knob
    nodes override."""
    dec, d, s = pack["decode"], pack["drafting"], pack["settings"]
    method = next(i for i in dec.SpeculativeDecode.define_schema().inputs if i.name == "method")
    assert not getattr(method, "optional", False) and method.default == "SJD-VP"
    assert method.options == ["AR", "SJD", "SJD-VP", "LANTERN", "LANTERN-VP", "GSD", "GSD-VP"]
    drafter, window = dec.method_or_nodes("SJD-VP", None, None)
    assert drafter == s.METHODS["sjd-vp"] and drafter.vp is not None and drafter.coupled
    assert window == s.DEFAULT_WINDOW and window.auto and window.auto_tree
    out = run(pack, demo, method="SJD-VP").values[0]
    assert out.method == "SJD-VP coupled" and out.result.stats.step_compression > 1
    assert out.result.stats.pass_cost is not None  # priced: the report leads with time
    sjd, fixed = d.DrafterSJD.execute(True).values[0], fixed_window(pack, 8)
    assert dec.method_or_nodes("GSD", sjd, fixed) == (sjd, fixed)
    assert dec.method_or_nodes("SJD-VP", sjd, None) == (sjd, s.DEFAULT_WINDOW)
    assert dec.method_or_nodes("LANTERN", None, fixed) == (s.METHODS["lantern"], fixed)
    assert dec.method_or_nodes("AR", None, None)[0] is None
    # the verifier node overrides
    assert dec.method_or_nodes("AR", sjd, None) == (
        sjd,
        s.DEFAULT_WINDOW,
    )
    with pytest.raises(ValueError, match="method='fast': choose one of"):
        run(pack, demo, method="fast")


def test_a_run_is_one_engine_call_that_calibrates_once(pack, demo, monkeypatch):
    """The node calls decode() once (the memory estimate apart), and decode calibrates once,
    returning what it measured: the pass cost and, for the automatic window, the profile it chose
    by."""
    engine = importlib.import_module(f"{stubs.PACKAGE}.sjdvp_core.engine.decode")
    calls = {"decode": 0, "calibration": 0}

    def counted(name, fn):
        def call(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(pack["decode"], "decode", counted("decode", pack["decode"].decode))
    monkeypatch.setattr(engine, "calibration", counted("calibration", engine.calibration))
    stats = run(pack, demo, method="SJD-VP").values[0].result.stats
    assert calls == {"decode": 1, "calibration": 1}
    assert stats.pass_cost is not None and stats.profile is not None and stats.auto_plans
    assert (
        stats.window
        == max(p.window for p in stats.profile.plans)
        <= pack["settings"].DEFAULT_WINDOW.size
    )
    run(pack, demo, method="AR")
    assert calls == {"decode": 2, "calibration": 1}  # AR is priced by nothing


def test_decode_and_report_replay_their_ui_when_cached(pack, demo):
    """Output nodes, so ComfyUI re-sends their UI output for a cached run (it replays only output
    nodes'): the report, its figures for the badge and, for Speculative Decode, the last preview
    as a temp image, which is the finished image."""
    decode_nodes = pack["decode"]
    assert decode_nodes.SpeculativeDecode.define_schema().is_output_node
    assert decode_nodes.Report.define_schema().is_output_node
    out = run(pack, demo, drafter=pack["drafting"].DrafterSJD.execute(True).values[0])
    assert (
        "forward passes" in out.ui["text"][0] and out.ui["sjdvp_report"][0]["step_compression"] > 1
    )
    [shown] = out.ui["images"]
    image = to_image(pack, out.values[0])
    assert shown["type"] == "temp" and torch.allclose(shown["tensor"], image[:1], atol=1e-5)
    report = decode_nodes.Report.execute(out.values[0])
    assert report.ui["text"] == out.ui["text"] and "images" not in report.ui
    # the node shows two lines (time, passes); its text output holds the full report
    assert len(out.ui["text"][0].splitlines()) == 2 and report.values[0].startswith(
        out.ui["text"][0] + "\n"
    )
    assert "tokens per pass: mean" in report.values[0]


def test_seed_is_folded_into_the_generators_range(pack, demo):
    sjd = pack["drafting"].DrafterSJD.execute(True).values[0]
    big = run(pack, demo, drafter=sjd, seed=2**64 - 1).values[0].result
    folded = run(pack, demo, drafter=sjd, seed=(2**64 - 1) % 2**63).values[0].result
    assert torch.equal(big.tokens, folded.tokens)


def test_model_defaults_take_the_familys_sampling(pack, demo):
    sjd = pack["drafting"].DrafterSJD.execute(True).values[0]
    ours = (
        run(pack, demo, drafter=sjd, cfg=9.0, top_k=3, sampling="model defaults").values[0].result
    )
    demo_sampling = run(pack, demo, drafter=sjd, sampling="custom").values[0].result
    assert torch.equal(ours.tokens, demo_sampling.tokens)
    with pytest.raises(ValueError, match="sampling='best'"):
        run(pack, demo, drafter=sjd, sampling="best")


def test_sizes_say_what_to_do(pack, demo):
    with pytest.raises(ValueError, match="give both in pixels"):
        run(pack, demo, width=512)
    with pytest.raises(ValueError, match="generates at one size.*set width and height to 0"):
        run(pack, demo, width=512, height=512)


def test_out_of_memory_says_what_to_change(pack, demo, monkeypatch):
    decode_nodes = pack["decode"]

    def oom(*a, **k):
        raise pack["mm"].OOM_EXCEPTION("CUDA out of memory")

    monkeypatch.setattr(decode_nodes, "decode", oom)
    window = pack["settings"].WindowSettings(64)
    sjd = pack["drafting"].DrafterSJD.execute(True).values[0]
    # ComfyUI's own error type: its handler unloads every model for the next run
    with pytest.raises(
        pack["mm"].OOM_EXCEPTION, match=r"out of memory while decoding.*Jacobi window \(now 64\)"
    ):
        run(pack, demo, drafter=sjd, window=window)
    # moving the weights in: the same message
    monkeypatch.setattr(pack["mm"], "load_models_gpu", oom)
    with pytest.raises(
        pack["mm"].OOM_EXCEPTION, match=r"out of memory while decoding.*Jacobi window \(now 64\)"
    ):
        run(pack, demo, drafter=sjd, window=window)


def test_pixels_out_of_memory_decode_one_image_at_a_time(pack, demo, monkeypatch):
    """As ComfyUI's VAE decode: a batch the card cannot turn into pixels at once is decoded image by
    image, and the images are the same; one image that does not fit says what to change."""
    oom, decode_image = pack["mm"].OOM_EXCEPTION, demo.adapter.decode_image
    tokens, single = run(pack, demo, batch_size=2).values[0], run(pack, demo).values[0]
    whole = to_image(pack, tokens)

    def small_card(codes, pixels=None):
        if len(codes) > 1:
            raise oom("CUDA out of memory")
        return decode_image(codes, pixels)

    monkeypatch.setattr(demo.adapter, "decode_image", small_card)
    torch.testing.assert_close(to_image(pack, tokens), whole)  # to float rounding
    monkeypatch.setattr(
        demo.adapter, "decode_image", lambda codes, pixels=None: small_card(codes.repeat(2, 1, 1))
    )
    with pytest.raises(
        oom, match="out of memory while turning tokens into pixels .* fewer images at once"
    ):
        to_image(pack, single)


def test_decoding_pixels_loads_only_the_image_decoder(pack, demo):
    gen, dec = demo.patcher.model, demo.decoder_patcher.model
    assert dec["model"] is demo.adapter.vq  # wrapped: ComfyUI sets .device on what it moves
    weights = sum(t.numel() * t.element_size() for t in demo.adapter.module.state_dict().values())
    assert demo.get_ram_usage() == weights  # what ComfyUI's RAM-pressure cache weighs the output by
    generator_params = {id(p) for p in gen.parameters()}
    assert generator_params == {id(p) for p in demo.adapter.gpt.parameters()}
    assert not generator_params & {id(p) for p in dec.parameters()}
    mm = pack["mm"]
    mm.loads.clear()
    tokens = run(pack, demo, drafter=pack["drafting"].DrafterSJD.execute(True).values[0]).values[0]
    # decoding tokens (and previews): both
    assert mm.loads[-1][0] == [
        demo.patcher,
        demo.decoder_patcher,
    ]
    # with room for the decode: the KV cache of both CFG rows (a tree's scratch entries) and the
    # loop's state
    from sjdvp_core.engine.budget import decode_bytes, state_bytes
    from sjdvp_core.engine.tree import scratch_nodes

    d = pack["drafting"]
    window = fixed_window(pack, 8, 4, 1)
    run(pack, demo, drafter=d.DrafterSJD.execute(True).values[0], window=window, batch_size=2)
    s = pack["settings"].decode_settings(
        d.DrafterSJD.execute(True).values[0], window, demo.adapter.default_sampling, 0, 2
    )
    need = mm.loads[-1][1]["memory_required"]
    scratch = scratch_nodes(8, window.tree)
    assert scratch > 0 and need == decode_bytes(demo.adapter, s)
    assert need == demo.adapter.cache_bytes(4, scratch) + state_bytes(
        s, demo.adapter.layout
    ) + demo.adapter.forward_bytes(4, 8 + scratch, scratch)
    image = to_image(pack, tokens)
    assert mm.loads[-1][0] == [demo.decoder_patcher] and image.shape == (1, 64, 64, 3)


@pytest.fixture(scope="module")
def glm(pack):
    """A tiny GLM-Image release in the stubbed models folder, loaded by the loader node's code."""
    from tests.helpers.tiny_glm_image import write_glm_image

    runtime = pack["runtime"]
    write_glm_image(
        os.path.join(runtime.folder_paths.get_folder_paths(runtime.FOLDER)[0], "GLM-Image")
    )
    return runtime.load("GLM-Image", "auto", "auto")


def test_glm_image_decodes_tokens_then_draws_pixels_with_its_dit(pack, glm, monkeypatch):
    """A model whose pixels come from a DiT: decoding tokens loads only the token stage (previews
    colour the codes), Tokens to Image loads only the DiT, alone on the card (the token stage
    leaves first) and draws from the decode's prompt and seed with its steps, one bar update per
    step; ComfyUI's interrupt stops it between steps."""
    runtime, mm = pack["runtime"], pack["mm"]
    mm.loads.clear()
    out = run(
        pack,
        glm,
        cfg=1.0,
        width=64,
        height=96,
        sampling="model defaults",
        method="SJD-VP",
        batch_size=2,
    )
    tokens = out.values[0]
    # the last preview, without the DiT
    assert mm.loads[-1][0] == [glm.patcher] and "images" in out.ui
    assert tokens.prompts == ("a red circle on grass",) * 2
    bars = []
    monkeypatch.setattr(
        runtime.comfy.utils,
        "ProgressBar",
        lambda total: bars.append(stubs.ProgressBar(total)) or bars[-1],
    )
    image = pack["decode"].DecodeImage.execute(tokens, steps=2, guidance=1.5).values[0]
    assert mm.loads[-1][0] == [glm.decoder_patcher] and image.shape == (2, 96, 64, 3)
    on_gpu = runtime.LoadedModel(
        "GLM-Image",
        glm.adapter,
        glm.patcher,
        stubs.ModelPatcher(glm.decoder_patcher.model, torch.device("cuda", 0), None),
    )
    mm.current_loaded_models = [
        types.SimpleNamespace(model=p) for p in (glm.patcher, on_gpu.decoder_patcher)
    ]
    runtime.prepare_decoder(on_gpu)  # on a GPU the DiT runs alone: the others leave first
    assert mm.frees[-1] == (1e30, torch.device("cuda", 0)) and [m.model for m in mm.kept] == [
        on_gpu.decoder_patcher
    ]
    mm.current_loaded_models = []
    assert [u[0] for u in bars[-1].updates] == [1, 2]
    again = pack["decode"].DecodeImage.execute(tokens, steps=2, guidance=1.5).values[0]
    assert torch.equal(image, again)  # the decode's seed seeds the DiT

    def interrupted():
        raise InterruptedError

    monkeypatch.setattr(mm, "throw_exception_if_processing_interrupted", interrupted)
    with pytest.raises(InterruptedError):
        pack["decode"].DecodeImage.execute(tokens, steps=2, guidance=1.5)


def test_pixel_sources_name_the_models_whose_pixels_a_dit_draws(pack, glm):
    """What the web extension greys Tokens to Image's steps and guidance by (its /sjdvp/pixels
    route): GLM-Image's DiT draws its pixels, every other family's VQ decoder; a release by its
    listed choice and by its name (a saved workflow's choice may carry another size), a model on
    disk by its listed name."""
    runtime = pack["runtime"]
    sources = runtime.pixel_sources()
    assert sources["demo"] == "vq" and sources["GLM-Image"] == "dit"  # the fixture's folder on disk
    glm_release = next(e for e in runtime.catalogue.ENTRIES if e.family == "glm_image")
    janus_release = next(e for e in runtime.catalogue.ENTRIES if e.family == "janus")
    assert sources[glm_release.choice] == sources[glm_release.name] == "dit"
    assert sources[janus_release.choice] == sources[janus_release.name] == "vq"
    assert set(runtime.model_choices()) <= set(sources)
    assert (
        glm.adapter.pixels_apart
        and not pack["runtime"].load("demo", "auto", "auto").adapter.pixels_apart
    )


def test_previews_off_decode_no_partial_image(pack, demo, monkeypatch):
    """ComfyUI's live previews off (--preview-method none; on newer servers the frontend's "Live
    preview method" for the prompt): no partial image is decoded, none is sent, no last preview
    is shown; on, they are."""
    runtime = pack["runtime"]
    sent = {}
    for method in (stubs.PreviewMethod.AUTO, stubs.PreviewMethod.NONE):
        monkeypatch.setattr(runtime.comfy.cli_args.args, "preview_method", method)
        decoded, bars = [], []

        def preview(self, partial, keep=False, decoded=decoded):
            decoded.append(keep)

        def bar(total, bars=bars):
            bars.append(stubs.ProgressBar(total))
            return bars[-1]

        monkeypatch.setattr(runtime.Progress, "_preview", preview)
        monkeypatch.setattr(runtime.comfy.utils, "ProgressBar", bar)
        out = run(pack, demo, drafter=pack["drafting"].DrafterSJD.execute(True).values[0], seed=5)
        sent[method] = (len(decoded), sum(u[2] for u in bars[0].updates), "images" in out.ui)
    assert min(sent[stubs.PreviewMethod.AUTO][:2]) >= 1  # at least the finished image
    assert sent[stubs.PreviewMethod.NONE] == (0, 0, False)


def test_reference_images_edit_with_glm_image_and_are_refused_elsewhere(
    pack, demo, glm, monkeypatch
):
    """An IMAGE on Speculative Decode: GLM-Image writes only the image grid after the sources, and
    Tokens to Image hands them to the DiT; the demo completes one picture's lower half; a family
    that takes no images says to disconnect them."""
    images = torch.rand(2, 64, 64, 3, generator=torch.Generator().manual_seed(0))
    out = run(
        pack,
        glm,
        cfg=1.0,
        width=64,
        height=96,
        sampling="model defaults",
        method="SJD-VP",
        images=images,
    )
    tokens = out.values[0]
    assert tokens.result.tokens.shape[1] == 3 * 2 + 1 and len(tokens.prompts[0].images) == 2
    image = pack["decode"].DecodeImage.execute(tokens, steps=1, guidance=1.5).values[0]
    assert image.shape == (1, 96, 64, 3)
    completed = run(pack, demo, images=images[:1]).values[0]
    assert completed.result.tokens.shape[1] == demo.adapter.layout.length // 2
    picture = pack["decode"].DecodeImage.execute(completed, steps=1, guidance=1.5).values[0]
    assert picture.shape == (1, 64, 64, 3)
    with pytest.raises(ValueError, match="completes one reference image; got 2"):
        run(pack, demo, images=images)
    monkeypatch.setattr(demo.adapter, "takes_images", False)
    with pytest.raises(
        ValueError, match="does not take reference images: disconnect the images input"
    ):
        run(pack, demo, images=images)
    # an IMAGE with alpha
    edit, rgba = (
        pack["decode"].edit,
        torch.cat([images, torch.ones(2, 64, 64, 1)], -1),
    )
    assert all(
        torch.equal(a, b) for a, b in zip(edit(glm.adapter, "make it snow", rgba).images, images)
    )
    with pytest.raises(ValueError, match="2 channels: connect an RGB IMAGE"):
        edit(glm.adapter, "make it snow", images[..., :2])


# --- downloads from the loader (tests/helpers/fake_hub.py on 127.0.0.1; HF_ENDPOINT points at it) -
@pytest.fixture
def fake_hub(monkeypatch):
    from tests.helpers.fake_hub import FakeHub
    from tests.helpers.tiny_llamagen import C2I, random_gpt, random_vq, saved

    with FakeHub(lifetime=120) as hub:
        hub.add(
            C2I,
            {
                "c2i_B_256.pt": saved({"model": random_gpt().state_dict()}),
                "vq_ds16_c2i.pt": saved({"model": random_vq().state_dict()}),
            },
        )
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


class RecordingBar:
    bars: list = []

    def __init__(self, total):
        self.total, self.updates = total, []
        RecordingBar.bars.append(self)

    def update_absolute(self, value, total=None, preview=None):
        self.updates.append((value, total))


def test_download_choices_list_catalogue_entries_with_sizes(pack):
    choices = pack["runtime"].model_choices()
    assert choices[0] == "demo"
    assert (
        "Janus-Pro-1B (download, ~4.2 GB)" in choices
        and "Lumina-mGPT-7B-768 (download, ~14.3 GB)" in choices
    )
    model = widgets(pack["nodes"].LoadModel)["model"]
    assert model.options[0] == "demo" and "Janus-Pro-7B (download, ~14.8 GB)" in model.options


def test_download_on_first_run_counts_bytes_and_the_saved_value_keeps_working(
    pack, fake_hub, monkeypatch
):
    import sys

    runtime = pack["runtime"]
    monkeypatch.setattr(sys.modules["comfy.utils"], "ProgressBar", RecordingBar)
    RecordingBar.bars.clear()
    choice = "LlamaGen-c2i-B-256 (download, ~732 MB)"
    assert choice in runtime.model_choices()
    loaded = pack["nodes"].LoadModel.execute(choice, "auto", "cpu").values[0]
    assert loaded.adapter.layout.grid.shape == (16, 16)
    (bar,) = RecordingBar.bars
    size = sum(len(v) for v in fake_hub.repos["FoundationVision/LlamaGen"].values())
    assert bar.total == size and bar.updates[-1] == (size, size)
    choices = runtime.model_choices()
    assert os.path.join("llamagen-c2i", "c2i_B_256.pt") in choices and choice not in choices
    gets = len([r for r in fake_hub.requests if r[0] == "GET"])
    # the saved value: found, not fetched
    assert runtime.model_path(choice).endswith("c2i_B_256.pt")
    assert len([r for r in fake_hub.requests if r[0] == "GET"]) == gets
    import shutil

    # leave the module's models folder bare
    shutil.rmtree(os.path.dirname(runtime.model_path(choice)))


def test_download_stops_on_interrupt_and_resumes(pack, fake_hub, monkeypatch):
    runtime, mm = pack["runtime"], pack["mm"]

    class Interrupted(Exception):
        pass

    calls = []

    def interrupt():
        calls.append(1)
        if len(calls) > 1:
            raise Interrupted

    monkeypatch.setattr(mm, "throw_exception_if_processing_interrupted", interrupt)
    choice = "LlamaGen-c2i-B-256 (download, ~732 MB)"
    with pytest.raises(Interrupted):
        runtime.model_path(choice)
    listed = os.path.join("llamagen-c2i", "c2i_B_256.pt")
    assert listed not in runtime.model_choices() and choice in runtime.model_choices()
    monkeypatch.setattr(mm, "throw_exception_if_processing_interrupted", lambda: None)
    path = runtime.model_path(choice)
    assert path.endswith("c2i_B_256.pt") and listed in runtime.model_choices()
    import shutil

    shutil.rmtree(os.path.dirname(path))


def test_several_model_roots(pack, fake_hub, monkeypatch, tmp_path):
    """ComfyUI's extra_model_paths.yaml adds roots before models/sjdvp: a download goes into the
    first one this user can write, and an unfinished download in one root does not hide the
    complete model in another."""
    runtime = pack["runtime"]
    readonly, own = tmp_path / "readonly", runtime.folder_paths.get_folder_paths(runtime.FOLDER)[0]
    readonly.mkdir()
    monkeypatch.setattr(runtime.folder_paths, "get_folder_paths", lambda name: [str(readonly), own])
    monkeypatch.setattr(runtime, "_writable", lambda root: root != str(readonly))
    path = runtime.model_path("LlamaGen-c2i-B-256 (download, ~732 MB)")
    assert path == os.path.join(own, "llamagen-c2i", "c2i_B_256.pt") and not os.listdir(readonly)
    stale = readonly / "llamagen-c2i"  # an older download there, never finished
    stale.mkdir()
    (stale / "c2i_B_256.pt").write_bytes(b"half")
    (stale / ".sjdvp-download.c2i_B_256.pt.json").write_text("{}")
    assert runtime.model_path(os.path.join("llamagen-c2i", "c2i_B_256.pt")) == path
    import shutil

    shutil.rmtree(os.path.dirname(path))


def test_download_missing_folder_names_the_catalogue_entry(pack):
    with pytest.raises(FileNotFoundError, match=r"choose 'Janus-Pro-7B \(download, ~14.8 GB\)'"):
        pack["runtime"].model_path("Janus-Pro-7B")


def test_quantised_precisions_and_auto_on_a_card_too_small_for_bf16(pack, monkeypatch, tmp_path):
    from tests.helpers.tiny_families import llamagen_c2i

    is_quantised = importlib.import_module(
        f"{stubs.PACKAGE}.sjdvp_core.models.quantize"
    ).is_quantised
    runtime, mm = pack["runtime"], pack["mm"]
    loader = importlib.import_module(f"{stubs.PACKAGE}.nodes.model_nodes").LoadModel
    # appended
    assert widgets(loader)["precision"].options == [
        "auto",
        "bf16",
        "fp16",
        "fp32",
        "int8",
        "nf4",
    ]
    int8 = runtime.load("demo", "int8", "auto")
    assert int8.adapter.precision == "int8" and is_quantised(int8.adapter.module)
    assert run(pack, int8).values[0].result.tokens.shape[1] == int8.adapter.layout.length
    folder, _, _ = llamagen_c2i(tmp_path)
    monkeypatch.setattr(runtime, "model_path", lambda name: folder)
    # a GPU ComfyUI would use
    monkeypatch.setattr(mm, "get_torch_device", lambda: torch.device("cuda"))
    roomy = runtime.load("tiny", "auto", "auto")
    assert roomy.adapter.precision.startswith("fp32 (auto:") and not is_quantised(
        roomy.adapter.module
    )
    monkeypatch.setattr(mm, "total_memory", (1 << 30) + 9_000_000)  # ~9 MB past ComfyUI's reserve
    small = runtime.load("tiny", "auto", "auto")
    assert (
        small.adapter.precision.startswith(("int8 (auto:", "nf4 (auto:"))
        and "GB free" in small.adapter.precision
    )
    assert is_quantised(small.adapter.module)


def test_load_model_validates_only_its_model_itself(pack):
    """ComfyUI skips its check of an option for every input named in validate_inputs (versions that
    check V3 options): naming only `model` leaves precision and device to it."""
    import inspect

    loader = importlib.import_module(f"{stubs.PACKAGE}.nodes.model_nodes").LoadModel
    assert list(inspect.signature(loader.validate_inputs).parameters) == ["model"]


def test_placed_models_are_kept_out_of_comfyuis_memory_manager(pack, tmp_path, monkeypatch):
    """The device options that place a model (appended) need CUDA; a placed model decodes without
    being moved: ComfyUI is asked to free the decode's memory on its device, never to load it."""
    runtime, mm = pack["runtime"], pack["mm"]
    loader = importlib.import_module(f"{stubs.PACKAGE}.nodes.model_nodes").LoadModel
    assert widgets(loader)["device"].options == ["auto", "cpu", "split over GPUs", "offload to CPU"]
    mm.frees.clear()
    with pytest.raises(ValueError, match="CUDA devices"):
        runtime.load("demo", "auto", "offload to CPU")
    assert not mm.frees  # no GPU: nothing of ComfyUI's is evicted for nothing
    with monkeypatch.context() as m:
        m.setattr(mm, "get_torch_device", lambda: torch.device("cuda", 0))
        with pytest.raises(FileNotFoundError):  # a missing model neither
            runtime.load("no-such-model", "auto", "offload to CPU")
        assert not mm.frees
        with pytest.raises(ValueError, match="sees 0 cuda device"):
            runtime.load("demo", "auto", "offload to CPU")
    # what ComfyUI holds is freed before the device map
    assert mm.frees == [(1e30, torch.device("cuda", 0))]
    with pytest.raises(ValueError, match="device='cuda:1': choose one of"):
        runtime.load("demo", "auto", "cuda:1")
    placement = importlib.import_module(f"{stubs.PACKAGE}.sjdvp_core.models.placement")
    demo = runtime.load("demo", "auto", "cpu")
    placement.place(
        demo.adapter,
        placement.offload_map(demo.adapter, [1], "disk"),
        torch.device("cpu"),
        str(tmp_path),
    )
    placed = runtime.LoadedModel(
        "demo", demo.adapter, demo.patcher, demo.decoder_patcher, placed=True
    )
    # the block on disk is not in CPU memory
    assert 0 < placed.get_ram_usage() < demo.get_ram_usage()
    mm.loads.clear()
    out = run(pack, placed)
    assert out.values[0].result.tokens.shape[1] == placed.adapter.layout.length
    assert not mm.loads and mm.frees and mm.frees[-1][1] == torch.device("cpu")


def test_the_first_run_shows_its_measurement_and_an_interrupt_stops_it(
    pack, demo, monkeypatch, tmp_path
):
    """Before its first token, a speculative method's first run on a model measures the device (the
    report's estimate, the automatic window): the node's bar shows that measurement, ComfyUI's
    interrupt stops it with nothing cached, and the next run measures from the start and decodes."""
    import sys

    runtime, mm, d = pack["runtime"], pack["mm"], pack["drafting"]
    monkeypatch.setenv("SJDVP_CACHE", str(tmp_path))
    monkeypatch.setattr(sys.modules["comfy.utils"], "ProgressBar", RecordingBar)
    said = []
    monkeypatch.setattr(runtime, "say", said.append)

    class Interrupted(Exception):
        pass

    calls = []

    def interrupt():
        calls.append(1)
        if len(calls) == 20:
            raise Interrupted

    monkeypatch.setattr(mm, "throw_exception_if_processing_interrupted", interrupt)
    window = fixed_window(pack, 16)  # fixed: the pass cost alone
    drafter = d.DrafterSJD.execute(True).values[0]
    RecordingBar.bars.clear()
    with pytest.raises(Interrupted):
        run(pack, demo, drafter, window)
    assert not list(tmp_path.rglob("*.json")) and len(RecordingBar.bars) == 1
    assert [v for v, _ in RecordingBar.bars[0].updates] == list(range(1, 20))
    assert said == [
        "sjdvp: measuring the pass cost on this model and device (a first run; kept for later runs)"
    ]
    monkeypatch.setattr(mm, "throw_exception_if_processing_interrupted", lambda: None)
    RecordingBar.bars.clear()
    tokens = run(pack, demo, drafter, window).values[0]
    measured, decoded = RecordingBar.bars  # the measurement's bar, the decode's
    assert (
        measured.updates[-1][0] == measured.updates[-1][1]
        and decoded.total == demo.adapter.layout.length
    )
    assert (
        said[-1].startswith("sjdvp: measured this device in")
        and len(list(tmp_path.rglob("*.json"))) == 1
    )
    assert tokens.result.stats.pass_cost is not None
