"""Loading a model."""
from __future__ import annotations

from comfy_api.latest import io

from . import runtime

MODEL = io.Custom("SJDVP_MODEL")


class LoadModel(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_LoadModel", display_name="Load AR Image Model (SJD-VP)", category="sjdvp",
            description="Loads an autoregressive image model from models/sjdvp (the family is detected from "
                        "its files), or the built-in demo model, which needs no download.",
            inputs=[
                io.Combo.Input("model", options=runtime.model_choices(), default="demo",
                               tooltip="'demo' is built in. Others: a folder or GPT file under models/sjdvp "
                                       "(see the README's Models section for what to download)."),
                io.Combo.Input("precision", options=["auto", "bf16", "fp16", "fp32"], default="auto",
                               tooltip="Weight precision. auto: bf16 on GPUs that support it, fp32 on CPU."),
                io.Combo.Input("device", options=["auto", "cpu"], default="auto",
                               tooltip="auto: ComfyUI's device (GPU when there is one); cpu forces the CPU."),
            ],
            outputs=[MODEL.Output(display_name="model")],
        )

    @classmethod
    def validate_inputs(cls, model, precision, device):
        return True  # model folders may appear after start-up; execute() says what is missing

    @classmethod
    def execute(cls, model, precision, device) -> io.NodeOutput:
        return io.NodeOutput(runtime.load(model, precision, device))
