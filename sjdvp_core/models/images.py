"""Reference images as the families read them: ComfyUI's IMAGE to PIL and to signed pixels, the
smallest reference a family takes, and what an edit's references encode to, kept for its pixels.
Light on purpose: families that need no transformers (LlamaGen, the demo) import it."""

from __future__ import annotations

from typing import Any, Callable, Hashable

import numpy as np
import torch
from torch import Tensor


def pil_image(image: Tensor):
    """An IMAGE [H, W, 3] in [0, 1] (ComfyUI's) -> a PIL image, as a family's processor reads one."""
    from PIL import Image

    return Image.fromarray((image.detach().float().clamp(0, 1) * 255).round().byte().cpu().numpy())


def signed_pixels(picture) -> Tensor:
    """A PIL image -> [1, 3, H, W] float in [-1, 1], as a VQ encoder takes it."""
    pixels = torch.tensor(np.asarray(picture), dtype=torch.float32).permute(2, 0, 1)[None]
    return pixels / 255 * 2 - 1


def check_reference(image: Tensor, family: str, side: int) -> None:
    """A reference smaller than one image token (`side` px a side) holds none of the image: said."""
    h, w = image.shape[:2]
    if min(h, w) < side:
        raise ValueError(
            f"{family} cannot take the reference images ({w}x{h} px): a reference needs {side} px "
            "a side or more (one image token); use a larger image"
        )


class KeptForEdits:
    """What an edit's references encoded to, kept while the edit object lives: the prefill
    encodes them, the pixels (decode_image) want them again. The oldest goes past `size`."""

    def __init__(self, size: int = 16):
        self.size, self.kept = size, {}

    def get(self, edit, encode: Callable[[], Any], key: Hashable = ()) -> Any:
        at = (id(edit), key)
        hit = self.kept.get(at)
        if hit is not None and hit[0] is edit:
            return hit[1]
        value = encode()
        while len(self.kept) >= self.size:
            self.kept.pop(next(iter(self.kept)))
        self.kept[at] = (edit, value)
        return value

    def clear(self) -> None:
        self.kept.clear()
