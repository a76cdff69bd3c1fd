"""Memory cooperation in a real ComfyUI server: two of our models and a ComfyUI-managed VAE (random
SD 1.x weights, real architecture) in one prompt and across prompts, under ComfyUI's model manager."""

from __future__ import annotations

import os
import subprocess

import torch

from tests.comfy.server import COMFY_PYTHON, NEEDS_COMFYUI, comfyui_root
from tests.helpers.paths import TESTS
from tests.helpers.tiny_llamagen import random_gpt, random_vq

pytestmark = NEEDS_COMFYUI


def decode_chain(prompt: dict, first_id: int, model: str, cond: str) -> str:
    """Load -> SJD decode (coupled, auto VP) -> IMAGE, as an API prompt names every input; returns
    the DecodeImage node id."""
    ids = [str(first_id + i) for i in range(5)]
    prompt[ids[0]] = {
        "class_type": "SJDVP_LoadModel",
        "inputs": {"model": model, "precision": "auto", "device": "auto"},
    }
    prompt[ids[1]] = {"class_type": "SJDVP_DrafterSJD", "inputs": {"coupled": True}}
    prompt[ids[2]] = {
        "class_type": "SJDVP_VerificationPrediction",
        "inputs": {
            "drafter": [ids[1], 0],
            "strength_mode": "auto",
            "strength": 1.0,
            "growth_steps": 2,
            "beta": 0.5,
            "top_k": 50,
            "max_score": 1.3863,
        },
    }
    prompt[ids[3]] = {
        "class_type": "SJDVP_SpeculativeDecode",
        "inputs": {
            "model": [ids[0], 0],
            "drafter": [ids[2], 0],
            "prompt": cond,
            "negative_prompt": "",
            "method": "SJD-VP",
            "seed": 3,
            "batch_size": 1,
            "width": 0,
            "height": 0,
            "sampling": "custom",
            "cfg": 2.0,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
            "compile": False,
            "passes": "auto",
        },
    }
    prompt[ids[4]] = {
        "class_type": "SJDVP_DecodeImage",
        "inputs": {"tokens": [ids[3], 0], "steps": 50, "guidance": 1.5},
    }
    return ids[4]


def test_two_models_and_a_vae_share_the_session(server):
    folder = os.path.join(server.models, "tiny-c2i")
    os.makedirs(folder, exist_ok=True)
    torch.save({"model": random_gpt().state_dict()}, os.path.join(folder, "c2i_B_256.pt"))
    torch.save({"model": random_vq().state_dict()}, os.path.join(folder, "vq_ds16_c2i.pt"))
    vae_dir = os.path.join(server.workdir, "models", "vae")
    os.makedirs(vae_dir, exist_ok=True)
    subprocess.run(
        [
            COMFY_PYTHON,
            str(TESTS / "comfy" / "random_vae.py"),
            os.path.join(vae_dir, "random_sd1_vae.safetensors"),
        ],
        cwd=comfyui_root(),
        check=True,
    )

    prompt: dict = {}
    demo_image = decode_chain(prompt, 1, "demo", "a red circle on grass")
    tiny_image = decode_chain(prompt, 10, "tiny-c2i", "3")
    prompt["20"] = {"class_type": "VAELoader", "inputs": {"vae_name": "random_sd1_vae.safetensors"}}
    prompt["21"] = {
        "class_type": "VAEEncode",
        "inputs": {"pixels": [demo_image, 0], "vae": ["20", 0]},
    }
    prompt["22"] = {"class_type": "VAEDecode", "inputs": {"samples": ["21", 0], "vae": ["20", 0]}}
    prompt["23"] = {
        "class_type": "SaveImage",
        "inputs": {"images": ["22", 0], "filename_prefix": "mem/vae"},
    }
    prompt["24"] = {
        "class_type": "SaveImage",
        "inputs": {"images": [tiny_image, 0], "filename_prefix": "mem/tiny"},
    }
    history, _ = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]
    assert history["outputs"]["23"]["images"] and history["outputs"]["24"]["images"]

    # a later prompt: our model reloaded after the VAE, then the VAE again, with a new seed
    prompt["13"]["inputs"]["seed"] = 4
    prompt["21"]["inputs"]["pixels"] = [tiny_image, 0]
    history, _ = server.run(prompt)
    assert history["status"]["status_str"] == "success", history["status"]


def test_model_defaults_replace_the_sampling_widgets(server):
    """sampling="model defaults" ignores cfg / temperature / top-k / top-p and uses the family's own
    (the demo's: cfg 3); "custom" uses the widgets."""

    def report(cfg: float, sampling: str) -> dict:
        prompt: dict = {}
        image = decode_chain(prompt, 1, "demo", "a green diamond on sand")
        prompt["4"]["inputs"].update(cfg=cfg, sampling=sampling)
        prompt["6"] = {"class_type": "PreviewImage", "inputs": {"images": [image, 0]}}
        history, _ = server.run(prompt)
        assert history["status"]["status_str"] == "success", history["status"]
        figures = history["outputs"]["4"]["sjdvp_report"][0]
        # not times
        return {k: v for k, v in figures.items() if "seconds" not in k and "speedup" not in k}

    model_defaults = report(1.5, "model defaults")
    assert model_defaults == report(3.0, "custom")
    assert report(1.5, "custom") != model_defaults
