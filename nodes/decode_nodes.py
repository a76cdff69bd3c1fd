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
    WindowSettings,
    decode_settings,
)
from ..sjdvp_core.figures import commit_figure
from ..sjdvp_core.models.glm_image.dit import GUIDANCE, STEPS
from . import runtime
from .drafting_nodes import DRAFTER, WINDOW
from .legacy import LEGACY
from .model_nodes import MODEL

TOKENS = io.Custom("SJDVP_TOKENS")
# where Speculative Decode's sampling settings come from (a prompt saved before the choice existed: legacy.py)
MODEL_DEFAULTS, CUSTOM = "model defaults", "custom"
SAMPLING_SOURCES = (MODEL_DEFAULTS, CUSTOM)
RUN = DecodeSettings()   # seed and batch size defaults; sampling widgets show the built-in demo model's
METHOD_CHOICES = {name.upper(): name for name in METHODS}    # "SJD-VP" on the node -> "sjd-vp" in the engine
# A drafter connected without a Jacobi Window, in a prompt saved before the method widget (whose absence reads
# AR): the window such a prompt has always meant.
FIRST_RELEASE_WINDOW = WindowSettings(16, init="random")


@dataclass
class Tokens:
    """What flows through an SJDVP_TOKENS socket: the tokens, and what a pixel model draws them with (the condition
of each image: its prompt, with its reference images where it edits; the seed)."""
    model: runtime.LoadedModel
    result: DecodeResult
    method: str
    prompts: tuple = ()
    seed: int = 0


class SpeculativeDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_SpeculativeDecode", display_name="Speculative Decode", category="sjdvp",
            is_output_node=True,   # so ComfyUI replays its UI output (badge, last preview) when it is cached
            description="Generates image tokens several per forward pass with the chosen method (SJD-VP by "
                        "default: exact, with Verification Prediction and the automatic window). AR samples "
                        "token by token, for comparison. A connected Jacobi Window or verifier node overrides "
                        "the method's own, for those who want the knobs.",
            inputs=[
                MODEL.Input("model", tooltip="From Load AR Image Model."),
                io.String.Input("prompt", multiline=True, default="a red circle on grass",
                                tooltip="What to draw: a text prompt, or for class-to-image models a class "
                                        "name or index (e.g. 'golden retriever' or 207)."),
                io.String.Input("negative_prompt", multiline=True, default="",
                                tooltip="The guidance branch's prompt where the family has one (Emu3: "
                                        "upstream's negative prompt when empty; Janus-Pro: replaces the "
                                        "padded prompt); leave empty otherwise."),
                io.Float.Input("cfg", default=DEMO_SAMPLING.cfg_scale, min=0.0, max=30.0, step=0.1,
                               tooltip="Classifier-free guidance scale; 1 turns guidance off."),
                io.Float.Input("temperature", default=DEMO_SAMPLING.temperature, min=0.01, max=5.0, step=0.01,
                               tooltip="Sampling temperature."),
                io.Int.Input("top_k", default=DEMO_SAMPLING.top_k, min=0, max=200000,
                             tooltip="Keep the k most likely image tokens; 0 keeps all."),
                io.Float.Input("top_p", default=DEMO_SAMPLING.top_p, min=0.01, max=1.0, step=0.01,
                               tooltip="Nucleus sampling mass; 1 keeps all."),
                io.Int.Input("seed", default=RUN.seed, min=0, max=0xFFFFFFFFFFFFFFFF, control_after_generate=True,
                             tooltip="Same seed, settings and device give the same image (the automatic window: "
                                     "until it measures the device again and picks another window; a Jacobi Window "
                                     "node's fixed window always). Seeds from 2^63 up are used modulo 2^63 (the seed "
                                     "2^63 + n gives the image of n)."),
                io.Int.Input("batch_size", default=RUN.batch_size, min=1, max=64,
                             tooltip="Images decoded together; each accepts its own number of tokens."),
                WINDOW.Input("window", optional=True,
                             tooltip="A Jacobi Window node, to set the window by hand; if absent, the automatic "
                                     "window (tokens per pass chosen for this device)."),
                DRAFTER.Input("drafter", optional=True,
                              tooltip="A verifier node (SJD, LANTERN, GSD, with Verification Prediction or not), "
                                      "to set its knobs by hand; it overrides method."),
                io.Int.Input("width", default=KEEP_SIZE, min=0, max=4096, step=16, optional=True,
                             tooltip="Image width in pixels for families with a size choice (Lumina-mGPT: a "
                                     "size it trained on; Emu3: any aspect). 0 with height 0: the model's default."),
                io.Int.Input("height", default=KEEP_SIZE, min=0, max=4096, step=16, optional=True,
                             tooltip="Image height in pixels; see width."),
                io.Combo.Input("sampling", options=list(SAMPLING_SOURCES), default=MODEL_DEFAULTS, optional=True,
                               tooltip="model defaults: the loaded family's recommended cfg, temperature, top-k "
                                       "and top-p (e.g. Lumina-mGPT cfg 4, top-k 2000; the pack's docs/library.md "
                                       "lists them), and the four widgets above are ignored. custom: those widgets."),
                io.Boolean.Input("compile", default=RUN.compile, optional=True,
                                 tooltip="Run the engine's own step (verification, drafting) through "
                                         "torch.compile: the first run of each setting compiles (seconds), "
                                         "later ones launch a few fused kernels per iteration instead of "
                                         "hundreds. For GPUs; off where it does not compile. Same law."),
                io.Combo.Input("method", options=list(METHOD_CHOICES), default=DEFAULT_METHOD.upper(), optional=True,
                               tooltip="How tokens are decoded. SJD-VP (default) and SJD are exact: the images "
                                       "follow the model's own distribution. LANTERN and GSD accept more drafts "
                                       "and drift from it. -VP adds Verification Prediction. AR: one token per "
                                       "pass, the baseline. A connected verifier node overrides this."),

                io.Image.Input("images", optional=True,
                               tooltip="Reference images, for families that edit (GLM-Image): the prompt says what "
                                       "to make of them (edit, restyle, combine). Every image of this batch is a "
                                       "reference of every output image. Other families refuse them."),
                io.Combo.Input("passes", options=list(PASS_MODES), default=RUN.passes, optional=True,
                               tooltip="How the model's forward pass runs. auto: replayed as a CUDA graph on a GPU "
                                       "(each shape recorded on first use and checked against the plain pass), "
                                       "plain elsewhere; captured: also tries NF4 weights; eager: never recorded. "
                                       "Never changes a token; the report says which ran and why."),
            ],
            outputs=[TOKENS.Output(display_name="tokens")],
        )

    @classmethod
    def execute(cls, model, prompt, negative_prompt, cfg, temperature, top_k, top_p, seed, batch_size,
                window=None, drafter=None, width=LEGACY["SJDVP_SpeculativeDecode"]["width"],
                height=LEGACY["SJDVP_SpeculativeDecode"]["height"],
                sampling=LEGACY["SJDVP_SpeculativeDecode"]["sampling"],
                compile=LEGACY["SJDVP_SpeculativeDecode"]["compile"],
                method=LEGACY["SJDVP_SpeculativeDecode"]["method"], images=None, passes=RUN.passes) -> io.NodeOutput:
        adapter = at_size(model.adapter, width, height)
        condition = prompt if images is None else edit(adapter, prompt, images)
        if sampling not in SAMPLING_SOURCES:
            raise ValueError(f"sampling={sampling!r}: choose one of {list(SAMPLING_SOURCES)}")
        chosen = adapter.default_sampling if sampling == MODEL_DEFAULTS else \
            SamplingSettings(cfg_scale=cfg, temperature=temperature, top_k=top_k, top_p=top_p)
        drafter, window = method_or_nodes(method, drafter, window)
        settings = decode_settings(drafter, window, chosen, seed % 2**63, batch_size, compile, passes)
        negatives = negative_prompt if negative_prompt.strip() else None   # a stray newline is no negative prompt
        need = decode_bytes(adapter, settings, condition, negatives)
        progress, measuring = runtime.Progress(adapter), runtime.Measuring()
        try:   # one engine call: a first speculative run measures the device (its own bar), then cached
            runtime.prepare(model, need)     # moving the weights in may run out of memory too: the same message
            result = decode(adapter, condition, settings, negatives=negatives, progress=progress,
                            priced=drafter is not None, measuring=measuring)
            measuring.finish()
        except runtime.OOM as e:
            raise runtime.oom_message(e, settings.window.size, settings.window.tree.width) from e
        method = "AR" if drafter is None else drafter.name
        shown = report_ui(result, method)
        if progress.final is not None:     # the last preview, kept as a temp image: a cached run shows it again
            shown |= ui.PreviewImage(progress.final[None], cls=cls).as_dict()
        return io.NodeOutput(Tokens(model, result, method, (condition,) * batch_size, settings.seed), ui=shown)


def edit(adapter, prompt: str, images: torch.Tensor) -> Edit:
    """The prompt with reference images (an IMAGE batch [N, H, W, 3]), for a family that takes them."""
    if not adapter.takes_images:
        raise ValueError(f"{adapter.family} does not take reference images: disconnect the images input (GLM-Image "
                         "edits images)")
    if images.shape[-1] not in (3, 4):
        raise ValueError(f"the reference images have {images.shape[-1]} channels: connect an RGB IMAGE")
    return Edit(prompt, tuple(images[..., :3].float().cpu()))     # an RGBA image's colours, its alpha dropped


def method_or_nodes(method: str, drafter, window):
    """(drafter, window) to decode with: a connected verifier node overrides the method, a connected Jacobi
    Window the default automatic window. A verifier without a window under method AR is a prompt saved before
    the method widget: it keeps the window it always had (FIRST_RELEASE_WINDOW)."""
    if method not in METHOD_CHOICES:
        raise ValueError(f"method={method!r}: choose one of {list(METHOD_CHOICES)}")
    if drafter is None:
        return METHODS[METHOD_CHOICES[method]], window or DEFAULT_WINDOW
    return drafter, window or (FIRST_RELEASE_WINDOW if method == "AR" else DEFAULT_WINDOW)


class DecodeImage(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DecodeImage", display_name="Tokens to Image", category="sjdvp",
            description="Turns image tokens into pixels with the model's decoder: its VQ decoder, or for GLM-Image "
                        "its DiT (steps and guidance below; a progress bar per step, Cancel between steps), "
                        "conditioned on the decode's prompt and seeded by its seed.",
            inputs=[TOKENS.Input("tokens", tooltip="From Speculative Decode."),
                    io.Int.Input("steps", default=STEPS, min=1, max=200, optional=True,
                                 tooltip="GLM-Image only: the DiT's denoising steps (upstream's default 50). VQ "
                                         "decoders ignore it."),
                    io.Float.Input("guidance", default=GUIDANCE, min=0.0, max=20.0, step=0.1, optional=True,
                                   tooltip="GLM-Image only: the DiT's guidance scale (upstream's default 1.5). VQ "
                                           "decoders ignore it.")],
            outputs=[io.Image.Output(display_name="image")],
        )

    @classmethod
    def execute(cls, tokens, steps=LEGACY["SJDVP_DecodeImage"]["steps"],
                guidance=LEGACY["SJDVP_DecodeImage"]["guidance"]) -> io.NodeOutput:
        runtime.prepare_decoder(tokens.model)
        pixels = PixelSettings(tokens.prompts, steps, guidance, tokens.seed, runtime.BarProgress(every=0))
        with torch.inference_mode():
            images = runtime.pixels(tokens.model.adapter, tokens.result.codes, pixels)
        return io.NodeOutput(images.float().cpu().contiguous())


class Report(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_Report", display_name="Speed-up Report", category="sjdvp",
            is_output_node=True,   # as core's Preview as Text: a cached run replays the text and the badge
            description="How much faster decoding was than plain AR (estimated: this run's passes priced by the "
                        "device's measured pass cost), and a picture of when each image cell was committed: dark "
                        "early, yellow late; same-coloured runs were accepted together. The picture carries its "
                        "colour scale and how many times fewer passes than AR; the text shows on the node.",
            inputs=[TOKENS.Input("tokens", tooltip="From Speculative Decode.")],
            outputs=[io.String.Output(display_name="text"), io.Image.Output(display_name="commit_map")],
        )

    @classmethod
    def execute(cls, tokens) -> io.NodeOutput:
        shown = report_ui(tokens.result, tokens.method)
        return io.NodeOutput(shown["text"][0], commit_figure(tokens.result, tokens.method), ui=shown)


def report_ui(result: DecodeResult, method: str) -> dict:
    """What the browser gets: the report text (shown on the Report node, like core's Preview as Text) and
    its figures as data (sjdvp_report, for the speed-up badge the web extension draws)."""
    return {**ui.PreviewText(report_text(result, method)).as_dict(), "sjdvp_report": [report_data(result, method)]}
