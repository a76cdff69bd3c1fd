"""Reference images as the families' processors read them: ComfyUI's IMAGE to PIL. Light on
purpose: families that need no transformers (LlamaGen, the demo) import it."""

from __future__ import annotations

from torch import Tensor


def pil_image(image: Tensor):
    """An IMAGE [H, W, 3] in [0, 1] (ComfyUI's) -> a PIL image, as a family's processor reads one."""
    from PIL import Image

    return Image.fromarray((image.detach().float().clamp(0, 1) * 255).round().byte().cpu().numpy())
