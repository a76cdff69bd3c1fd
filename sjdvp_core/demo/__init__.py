"""The built-in demo model: a small LlamaGen (c2i GPT + VQ tokenizer) trained by
sjdvp_core.demo.train on procedural scenes, shipped as safetensors. No download needed."""

from __future__ import annotations

import os

import torch

from ..engine.settings import SamplingSettings
from ..models.llamagen.adapter import LlamaGenAdapter, load_gpt, load_vq
from . import scenes

# The demo's sampling defaults (chosen by measurement, see docs/testing.md, "The demo model").
DEMO_SAMPLING = SamplingSettings(cfg_scale=3.0, temperature=1.0, top_k=0, top_p=1.0)

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")


def load_demo(device="cpu", dtype=torch.float32) -> LlamaGenAdapter:
    gpt = load_gpt(os.path.join(WEIGHTS, "demo_gpt.safetensors"))
    vq = load_vq(os.path.join(WEIGHTS, "demo_vq.safetensors"), encoder=True)
    return LlamaGenAdapter(
        gpt,
        vq,
        class_names=scenes.PROMPTS,
        class_parser=scenes.prompt_to_class,
        sampling=DEMO_SAMPLING,
        device=device,
        dtype=dtype,
    )


def load_judge():
    from safetensors.torch import load_file

    from .judge import Judge

    judge = Judge()
    judge.load_state_dict(load_file(os.path.join(WEIGHTS, "demo_judge.safetensors")))
    return judge.eval()
