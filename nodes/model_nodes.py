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
                        "its files), or the built-in demo model, which needs no download. Entries marked "
                        "'(download, size)' are fetched from the Hugging Face Hub into models/sjdvp when the "
                        "workflow first runs (progress in bytes, interruptible, resumed on the next run).",
            inputs=[
                io.Combo.Input("model", options=runtime.model_choices(), default="demo",
                               tooltip="'demo' is built in. Then the folders and GPT files under models/sjdvp, "
                                       "then releases not downloaded yet, with their size: choosing one downloads "
                                       "it into models/sjdvp on the first run (a workflow naming it keeps working "
                                       "after). See the pack's docs/models.md."),
                io.Combo.Input("precision", options=["auto", "bf16", "fp16", "fp32", "int8", "nf4"], default="auto",
                               tooltip="Weight precision. auto: on a GPU, bf16 (fp32 where the GPU has no bf16) if "
                                       "the model and a default decode fit the card, else int8, else nf4 (the "
                                       "report says what it took and why); fp32 on the CPU. int8: weight-only "
                                       "int8 (about half of bf16's memory). nf4: 4-bit NormalFloat (about a "
                                       "quarter; needs bitsandbytes); GLM-Image's DiT is quantised with it (under "
                                       "auto, it is chosen for alone). "
                                       "Embeddings, output head and VQ decoder keep their precision; exact SJD "
                                       "stays exact for the quantised model."),
                io.Combo.Input("device", options=["auto", "cpu", *runtime.PLACED], default="auto",
                               tooltip="auto: ComfyUI's device (GPU when there is one); cpu forces the CPU. "
                                       "split over GPUs: the model's blocks balanced over every GPU. offload to "
                                       "CPU: what does not fit the GPU stays in CPU memory and streams in once "
                                       "per pass (slow, and where speculative decoding gains most). Both need "
                                       "accelerate; a placed model stays where it was put (ComfyUI frees memory "
                                       "for it but does not move it)."),
            ],
            outputs=[MODEL.Output(display_name="model")],
        )

    @classmethod
    def validate_inputs(cls, model):
        # model folders may appear after start-up and catalogue entries download: execute() says what is missing.
        # Only `model` is named: ComfyUI skips its own check of the options for every input named here
        return True

    @classmethod
    def execute(cls, model, precision, device) -> io.NodeOutput:
        return io.NodeOutput(runtime.load(model, precision, device))
