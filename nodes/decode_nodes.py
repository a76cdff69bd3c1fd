"""Speculative decoding, tokens -> image, and the speed-up report."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from comfy_api.latest import io, ui

from ..sjdvp_core.demo import DEMO_SAMPLING
from ..sjdvp_core.engine.adapter import KEEP_SIZE, Edit, PixelSettings, at_size
from ..sjdvp_core.engine.budget import decode_bytes
from ..sjdvp_core.engine.decode import DecodeResult, decode
from ..sjdvp_core.engine.report import report_data, report_text
from ..sjdvp_core.engine.settings import (
    DEFAULT_METHOD,
    DEFAULT_WINDOW,
    METHODS,
    PASS_MODES,
    DecodeSettings,
    SamplingSettings,
    decode_settings,
)
from ..sjdvp_core.figures import commit_figure
from ..sjdvp_core.models.glm_image.dit import GUIDANCE, STEPS
from ..sjdvp_core.models.janus import IMAGE_CFG
from . import runtime
from .drafting_nodes import DRAFTER, WINDOW
from .model_nodes import MODEL

TOKENS = io.Custom("SJDVP_TOKENS")
# where Speculative Decode's sampling settings come from
MODEL_DEFAULTS, CUSTOM = "model defaults", "custom"
SAMPLING_SOURCES = (MODEL_DEFAULTS, CUSTOM)
# seed and batch size defaults; sampling widgets show the built-in demo model's
RUN = DecodeSettings()
# "SJD-VP" on the node -> "sjd-vp" in the engine
METHOD_CHOICES = {name.upper(): name for name in METHODS}


@dataclass
class Tokens:
    """What flows through an SJDVP_TOKENS socket: the tokens, and what a pixel model draws them with
    (the condition of each image: its prompt, with its reference images where it edits; the
    seed)."""

    model: runtime.LoadedModel
    result: DecodeResult
    method: str
    prompts: tuple = ()
    seed: int = 0


class SpeculativeDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_SpeculativeDecode",
            display_name="Speculative Decode",
            category="sjdvp",
            # so ComfyUI replays its UI output (badge, last preview) when it is cached
            is_output_node=True,
            description="Generates image tokens several per forward pass with the chosen method (SJD-VP by "
            "default: exact, with Verification Prediction and the automatic window).",
            inputs=[
                MODEL.Input("model", tooltip="From Load AR Image Model."),
                io.Image.Input(
                    "images",
                    optional=True,
                    tooltip="Reference images to edit, for families that take them (GLM-Image).",
                ),
                io.String.Input(
                    "prompt",
                    multiline=True,
                    default="a red circle on grass",
                    tooltip="What to draw: text, or a class name or index for class-to-image "
                    "models.",
                ),
                io.String.Input(
                    "negative_prompt",
                    multiline=True,
                    default="",
                    tooltip="The guidance branch's prompt, for families that take one (Emu3, "
                    "Janus-Pro).",
                ),
                io.Combo.Input(
                    "method",
                    options=list(METHOD_CHOICES),
                    default=DEFAULT_METHOD.upper(),
                    tooltip="SJD-VP and SJD are exact, LANTERN and GSD faster and lossy, AR one "
                    "token per pass.",
                ),
                io.Int.Input(
                    "seed",
                    default=RUN.seed,
                    min=0,
                    max=0xFFFFFFFFFFFFFFFF,
                    control_after_generate=True,
                    tooltip="The same seed, settings and device give the same image.",
                ),
                io.Int.Input(
                    "batch_size",
                    default=RUN.batch_size,
                    min=1,
                    max=64,
                    tooltip="Images decoded together.",
                ),
                io.Int.Input(
                    "width",
                    default=KEEP_SIZE,
                    min=0,
                    max=4096,
                    step=16,
                    tooltip="Image width in pixels, for families with a size choice; 0 with height "
                    "0 is the model's default.",
                ),
                io.Int.Input(
                    "height",
                    default=KEEP_SIZE,
                    min=0,
                    max=4096,
                    step=16,
                    tooltip="Image height in pixels; see width.",
                ),
                io.Combo.Input(
                    "sampling",
                    options=list(SAMPLING_SOURCES),
                    default=MODEL_DEFAULTS,
                    tooltip="model defaults: the family's recommended sampling; custom: the four "
                    "widgets below.",
                ),
                io.Float.Input(
                    "cfg",
                    default=DEMO_SAMPLING.cfg_scale,
                    min=0.0,
                    max=30.0,
                    step=0.1,
                    tooltip="Classifier-free guidance scale; 1 turns guidance off.",
                ),
                io.Float.Input(
                    "temperature",
                    default=DEMO_SAMPLING.temperature,
                    min=0.01,
                    max=5.0,
                    step=0.01,
                    tooltip="Sampling temperature.",
                ),
                io.Int.Input(
                    "top_k",
                    default=DEMO_SAMPLING.top_k,
                    min=0,
                    max=200000,
                    tooltip="Keep the k most likely image tokens; 0 keeps all.",
                ),
                io.Float.Input(
                    "top_p",
                    default=DEMO_SAMPLING.top_p,
                    min=0.01,
                    max=1.0,
                    step=0.01,
                    tooltip="Nucleus sampling mass; 1 keeps all.",
                ),
                WINDOW.Input(
                    "window",
                    optional=True,
                    tooltip="A Jacobi Window node sets the window by hand; absent, the automatic "
                    "window.",
                ),
                DRAFTER.Input(
                    "drafter",
                    optional=True,
                    tooltip="A verifier node sets its knobs by hand; it overrides method.",
                ),
                io.Boolean.Input(
                    "compile",
                    default=RUN.compile,
                    tooltip="Fuse the engine's own step with torch.compile (for GPUs; the first "
                    "run compiles).",
                ),
                io.Combo.Input(
                    "passes",
                    options=list(PASS_MODES),
                    default=RUN.passes,
                    tooltip="How the model's pass runs: auto replays CUDA graphs on a GPU; never "
                    "changes a token.",
                ),
                # 1.1.0, optional: a prompt without it keeps its meaning
                io.Float.Input(
                    "image_cfg",
                    default=IMAGE_CFG,
                    min=0.0,
                    max=20.0,
                    step=0.5,
                    optional=True,
                    tooltip="Janus edits only: weight of the condition without the reference's "
                    "image tokens (Janus-4o's second guidance); custom sampling.",
                ),
            ],
            outputs=[TOKENS.Output(display_name="tokens")],
        )

    @classmethod
    def execute(
        cls,
        model,
        prompt,
        negative_prompt,
        method,
        seed,
        batch_size,
        width,
        height,
        sampling,
        cfg,
        temperature,
        top_k,
        top_p,
        compile,
        passes,
        images=None,
        window=None,
        drafter=None,
        image_cfg=IMAGE_CFG,
    ) -> io.NodeOutput:
        adapter = at_size(model.adapter, width, height)
        condition = prompt if images is None else edit(adapter, prompt, images)
        if sampling not in SAMPLING_SOURCES:
            raise ValueError(f"sampling={sampling!r}: choose one of {list(SAMPLING_SOURCES)}")
        chosen = (
            adapter.default_sampling
            if sampling == MODEL_DEFAULTS
            else SamplingSettings(
                cfg_scale=cfg,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                image_cfg_scale=image_cfg,
            )
        )
        drafter, window = method_or_nodes(method, drafter, window)
        settings = decode_settings(
            drafter, window, chosen, seed % 2**63, batch_size, compile, passes
        )
        # a stray newline is no negative prompt
        negatives = negative_prompt if negative_prompt.strip() else None
        need = decode_bytes(adapter, settings, condition, negatives)
        progress, measuring = runtime.Progress(adapter), runtime.Measuring()
        # one engine call: a first speculative run measures the device (its own bar), then cached
        try:
            # moving the weights in may run out of memory too: the same message
            runtime.prepare(model, need)
            result = decode(
                adapter,
                condition,
                settings,
                negatives=negatives,
                progress=measuring.then(progress),
                priced=drafter is not None,
                measuring=measuring,
            )
        except runtime.OOM as e:
            raise runtime.oom_message(e, settings.window.size, settings.window.tree.width) from e
        method = "AR" if drafter is None else drafter.name
        shown = report_ui(result, method)
        # the last preview, kept as a temp image: a cached run shows it again
        if progress.final is not None:
            shown |= ui.PreviewImage(progress.final[None], cls=cls).as_dict()
        return io.NodeOutput(
            Tokens(model, result, method, (condition,) * batch_size, settings.seed), ui=shown
        )


def edit(adapter, prompt: str, images: torch.Tensor) -> Edit:
    """The prompt with reference images (an IMAGE batch [N, H, W, 3]), for a family that takes
    them."""
    if not adapter.takes_images:
        raise ValueError(
            f"{adapter.family} does not take reference images: disconnect the images input (GLM-Image, "
            "Janus, Lumina-mGPT 2.0 and LlamaGen take them)"
        )
    if images.shape[-1] not in (3, 4):
        raise ValueError(
            f"the reference images have {images.shape[-1]} channels: connect an RGB IMAGE"
        )
    # an RGBA image's colours, its alpha dropped
    return Edit(prompt, tuple(images[..., :3].float().cpu()))


def method_or_nodes(method: str, drafter, window):
    """(drafter, window) to decode with: a connected verifier node overrides the method, a connected
    Jacobi Window the default automatic window."""
    if method not in METHOD_CHOICES:
        raise ValueError(f"method={method!r}: choose one of {list(METHOD_CHOICES)}")
    if drafter is None:
        drafter = METHODS[METHOD_CHOICES[method]]
    return drafter, window or DEFAULT_WINDOW


class DecodeImage(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DecodeImage",
            display_name="Tokens to Image",
            category="sjdvp",
            description="Turns image tokens into pixels with the model's decoder: its VQ decoder, or for GLM-Image "
            "its DiT (steps and guidance below; a progress bar per step, Cancel between steps), "
            "conditioned on the decode's prompt and seeded by its seed.",
            inputs=[
                TOKENS.Input("tokens", tooltip="From Speculative Decode."),
                io.Int.Input(
                    "steps",
                    default=STEPS,
                    min=1,
                    max=200,
                    tooltip="GLM-Image's DiT: denoising steps (VQ decoders ignore it).",
                ),
                io.Float.Input(
                    "guidance",
                    default=GUIDANCE,
                    min=0.0,
                    max=20.0,
                    step=0.1,
                    tooltip="GLM-Image's DiT: guidance scale (VQ decoders ignore it).",
                ),
            ],
            outputs=[io.Image.Output(display_name="image")],
        )

    @classmethod
    def execute(cls, tokens, steps, guidance) -> io.NodeOutput:
        runtime.prepare_decoder(tokens.model)
        pixels = PixelSettings(
            tokens.prompts, steps, guidance, tokens.seed, runtime.BarProgress(every=0)
        )
        with torch.inference_mode():
            images = runtime.pixels(tokens.model.adapter, tokens.result.codes, pixels)
        return io.NodeOutput(images.float().cpu().contiguous())


class Report(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_Report",
            display_name="Speed-up Report",
            category="sjdvp",
            # as core's Preview as Text: a cached run replays the text and the badge
            is_output_node=True,
            description="How much faster decoding was than plain AR (estimated: this run's passes priced by the "
            "device's measured pass cost), and a picture of when each image cell was committed: dark "
            "early, yellow late; same-coloured runs were accepted together. The node shows two lines; "
            "the text output holds the full report.",
            inputs=[TOKENS.Input("tokens", tooltip="From Speculative Decode.")],
            outputs=[
                io.String.Output(display_name="text"),
                io.Image.Output(display_name="commit_map"),
            ],
        )

    @classmethod
    def execute(cls, tokens) -> io.NodeOutput:
        shown = report_ui(tokens.result, tokens.method)
        full = report_text(tokens.result, tokens.method)
        return io.NodeOutput(full, commit_figure(tokens.result, tokens.method), ui=shown)


def report_ui(result: DecodeResult, method: str) -> dict:
    """What the browser gets: the report's two lines (shown on the node, like core's Preview as
    Text) and its figures as data (sjdvp_report, for the speed-up badge the web extension draws)."""
    brief = report_text(result, method, brief=True)
    return {**ui.PreviewText(brief).as_dict(), "sjdvp_report": [report_data(result, method)]}
