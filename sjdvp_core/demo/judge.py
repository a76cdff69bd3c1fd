"""The demo's judge: a small CNN that names the shape, colour and background of a 64x64 scene. It
gives the prompt-match score (all three right) for images from any decoding method, with no
external model."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from . import scenes

HEADS = (len(scenes.SHAPES), len(scenes.COLOURS), len(scenes.BACKGROUNDS))


class Judge(nn.Module):
    def __init__(self, width: int = 32):
        super().__init__()
        chans = [3, width, 2 * width, 2 * width, 4 * width]
        self.features = nn.Sequential(
            *[
                m
                for a, b in zip(chans, chans[1:])
                for m in (nn.Conv2d(a, b, 3, stride=2, padding=1), nn.GELU())
            ]
        )
        self.head = nn.Linear(chans[-1], sum(HEADS))

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        """images [B, 3, 64, 64] in [-1, 1] -> logits per head."""
        return self.head(self.features(images).mean((2, 3))).split(HEADS, dim=-1)


def targets(classes: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(scenes.CLASS_PARTS[classes].unbind(-1))


def judge_loss(judge: Judge, images: Tensor, classes: Tensor) -> Tensor:
    return sum(F.cross_entropy(logits, t) for logits, t in zip(judge(images), targets(classes)))


@torch.no_grad()
def attribute_match(judge: Judge, images: Tensor, classes: Tensor) -> Tensor:
    """[3, B] bool: the judge finds the prompt's shape, colour, background (how often it is right on
    rendered scenes: docs/testing.md, "The demo model")."""
    preds = [logits.argmax(-1) for logits in judge(images)]
    return torch.stack([p == t for p, t in zip(preds, targets(classes))])


def prompt_match(judge: Judge, images: Tensor, classes: Tensor) -> Tensor:
    """[B] bool: shape, colour and background all as the prompt says."""
    return attribute_match(judge, images, classes).all(0)
