"""Loading a model."""

from __future__ import annotations

from comfy_api.latest import io

from . import runtime

MODEL = io.Custom("SJDVP_MODEL")


class LoadModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_LoadModel",
            display_name="Load AR Image Model (SJD-VP)",
            category="sjdvp",
            description="Loads an autoregressive image model from models/sjdvp (the family is detected from "
            "its files), or the built-in demo model, which needs no download. Entries marked "
            "'(download, size)' are fetched from the Hugging Face Hub into models/sjdvp when the "
            "workflow first runs (progress in bytes, interruptible, resumed on the next run).",
            inputs=[
                io.Combo.Input(
                    "model",
                    options=runtime.model_choices(),
                    default="demo",
                    tooltip="'demo' is built in; then models/sjdvp's folders, then releases "
                    "that download on the first run.",
                ),
                io.Combo.Input(
                    "precision",
                    options=["auto", "bf16", "fp16", "fp32", "int8", "nf4"],
                    default="auto",
                    tooltip="Weight precision; auto takes the best that fits the card and the report "
                    "says which.",
                ),
                io.Combo.Input(
                    "device",
                    options=["auto", "cpu", *runtime.PLACED],
                    default="auto",
                    tooltip="auto: ComfyUI's device; split over GPUs or offload to CPU for a model "
                    "too large for one card.",
                ),
            ],
            outputs=[MODEL.Output(display_name="model")],
        )

    @classmethod
    def validate_inputs(cls, model):
        # model folders may appear after start-up and catalogue entries download: execute() says
        # what is missing. Only `model` is named: ComfyUI skips its own check of the options for
        # every input named here
        return True

    @classmethod
    def execute(cls, model, precision, device) -> io.NodeOutput:
        return io.NodeOutput(runtime.load(model, precision, device))
