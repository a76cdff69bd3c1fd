"""Writes a randomly initialised Stable Diffusion 1.x VAE (real architecture and key names, as
ComfyUI's own Encoder/Decoder define them) to the path given, so a test can run a ComfyUI-managed
model beside ours without downloading one. Run with the ComfyUI environment's python from
ComfyUI's root."""

import sys

import torch
from safetensors.torch import save_file

OUT = sys.argv[1]
sys.argv = sys.argv[:1] + ["--cpu"]  # ComfyUI reads its flags at import; no GPU here
sys.path.insert(0, ".")
import comfy.options  # noqa: E402

comfy.options.enable_args_parsing()
from comfy.ldm.modules.diffusionmodules.model import Decoder, Encoder  # noqa: E402

DDCONFIG = dict(
    double_z=True,
    z_channels=4,
    resolution=256,
    in_channels=3,
    out_ch=3,
    ch=128,
    ch_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_resolutions=[],
    dropout=0.0,
)

torch.manual_seed(0)
parts = {
    "encoder": Encoder(**DDCONFIG),
    "decoder": Decoder(**DDCONFIG),
    "quant_conv": torch.nn.Conv2d(8, 8, 1),
    "post_quant_conv": torch.nn.Conv2d(4, 4, 1),
}
state = {
    f"{name}.{k}": v.half().contiguous()
    for name, m in parts.items()
    for k, v in m.state_dict().items()
}
save_file(state, OUT)
