"""Procedural scenes for the built-in demo model: one coloured shape on a textured background,
described by a short prompt ("a red circle on grass"). Seeded and offline; the structure (flat
regions, edges, textures, a free position and size) gives the token grid real long-range structure.
"""

from __future__ import annotations

import itertools
import math

import torch

COLOURS = {
    "red": (214, 40, 40),
    "orange": (240, 130, 20),
    "yellow": (240, 210, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "purple": (140, 50, 180),
}
SHAPES = ("circle", "square", "triangle", "diamond")
BACKGROUNDS = {  # base colour, second colour of the gradient, texture strength
    "night": ((15, 20, 50), (40, 40, 90), 6.0),
    "snow": ((235, 238, 245), (200, 210, 225), 5.0),
    "grass": ((60, 120, 40), (100, 160, 60), 14.0),
    "sand": ((220, 190, 140), (190, 150, 100), 10.0),
}
# class index <-> (shape, colour, background), in this fixed order
CLASSES = list(itertools.product(SHAPES, COLOURS, BACKGROUNDS))
# class index -> (shape, colour, background) indices
CLASS_PARTS = torch.tensor(
    [[SHAPES.index(s), list(COLOURS).index(c), list(BACKGROUNDS).index(b)] for s, c, b in CLASSES]
)
PROMPTS = [f"{'an' if c[0] in 'aeiou' else 'a'} {c} {s} on {b}" for s, c, b in CLASSES]
IMAGE_SIZE = 64


def prompt_to_class(prompt: str) -> int:
    """'a red circle on grass' (any order of the three words, case-insensitive) -> class index."""
    words = prompt.lower().replace(",", " ").split()
    found = [[w for w in words if w in names] for names in (SHAPES, COLOURS, BACKGROUNDS)]
    if any(len(f) != 1 for f in found):
        raise ValueError(
            f"prompt {prompt!r}: name one shape {list(SHAPES)}, one colour {list(COLOURS)} "
            f"and one background {list(BACKGROUNDS)}, e.g. {PROMPTS[0]!r}"
        )
    return CLASSES.index((found[0][0], found[1][0], found[2][0]))


def _shape_mask(shape: str, yy, xx, cy, cx, r, angle):
    dy, dx = yy - cy, xx - cx
    ca, sa = math.cos(angle), math.sin(angle)
    u, v = ca * dx + sa * dy, -sa * dx + ca * dy
    if shape == "circle":
        return dx**2 + dy**2 <= r**2
    if shape == "square":
        return (u.abs() <= r * 0.85) & (v.abs() <= r * 0.85)
    if shape == "diamond":
        return u.abs() + v.abs() <= r * 1.1
    # triangle: three half-planes at 120 degrees
    inside = torch.ones_like(u, dtype=torch.bool)
    for k in range(3):
        t = angle + k * 2 * math.pi / 3
        inside &= (math.cos(t) * dx + math.sin(t) * dy) <= r * 0.55
    return inside


def render(cls: int, g: torch.Generator) -> torch.Tensor:
    """One scene of class cls -> [3, 64, 64] float in [0, 1]."""
    shape, colour, bg = CLASSES[cls]
    n = IMAGE_SIZE
    yy, xx = torch.meshgrid(torch.arange(n).float(), torch.arange(n).float(), indexing="ij")
    base_rgb, second_rgb, texture = BACKGROUNDS[bg]
    base, second = (torch.tensor(c).float()[:, None, None] for c in (base_rgb, second_rgb))
    theta = float(torch.rand(1, generator=g)) * 2 * math.pi
    ramp = ((math.cos(theta) * (xx - n / 2) + math.sin(theta) * (yy - n / 2)) / n + 0.5).clamp(0, 1)
    img = base + (second - base) * ramp
    blobs = torch.nn.functional.interpolate(
        torch.randn(1, 1, 8, 8, generator=g), size=(n, n), mode="bilinear", align_corners=False
    )[0]
    img = img + texture * (blobs + 0.5 * torch.randn(1, n, n, generator=g))
    r = 9 + float(torch.rand(1, generator=g)) * 12
    cy, cx = (r + 2 + torch.rand(2, generator=g) * (n - 2 * r - 4)).tolist()
    mask = _shape_mask(shape, yy, xx, cy, cx, r, float(torch.rand(1, generator=g)) * math.pi)
    tint = torch.tensor(COLOURS[colour]).float()[:, None, None] + 12 * torch.randn(
        3, 1, 1, generator=g
    )
    light = 1.0 - 0.25 * ((yy - cy) / (2 * r) + 0.5).clamp(0, 1)  # shaded from above
    img = torch.where(mask, tint * light, img)
    return (img / 255).clamp(0, 1)


def dataset(count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """count scenes with balanced classes -> images [N, 3, 64, 64], classes [N]."""
    g = torch.Generator().manual_seed(seed)
    classes = torch.arange(count) % len(CLASSES)
    classes = classes[torch.randperm(count, generator=g)]
    return torch.stack([render(int(c), g) for c in classes]), classes
