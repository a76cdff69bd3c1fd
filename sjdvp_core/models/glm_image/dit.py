"""GLM-Image's pixels: the release's DiT, VAE and ByT5 glyph encoder through diffusers' pipeline.

GlmImagePipeline is fed the token stage's image grid (`prior_token_ids`), so it skips its own
autoregressive stage; the prompt goes to the glyph encoder too. Steps and guidance default to the
pipeline's own, each step reports to `progress` (which may raise to stop between steps), and the
pipeline runs where its weights are (a memory manager moves `module`). How the grid is handed over:
docs/glm_image.md, "The hand-over to the DiT"."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from ...engine.adapter import PixelSettings
from ..checkpoint import CheckpointError
from ..optional import MissingPackage, require
from ..placement import weights_device
from . import GRID, REPO

STEPS, GUIDANCE = 50, 1.5  # GlmImagePipeline.__call__'s defaults
DIT_PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")
WEIGHTS = ("transformer", "vae", "text_encoder")


@dataclass(frozen=True)
class Source:
    """An edit's source images (PIL), their tokens (flat, image after image) and token grids (h,
    w)."""

    images: list
    codes: Tensor
    grids: tuple[tuple[int, int], ...]

    def pipeline_inputs(self) -> tuple[Tensor, Tensor]:
        """(prior_token_image_ids, source_image_grid_thw) as the pipeline takes them for one sample:
        each image's codes over 2 x 2 blocks, its grid doubled."""
        sizes = [h * w for h, w in self.grids]
        upsampled = [
            prior_token_ids(c.view(1, h, w))[0]
            for c, (h, w) in zip(self.codes.split(sizes), self.grids)
        ]
        return torch.cat(upsampled), torch.tensor([(1, 2 * h, 2 * w) for h, w in self.grids])


def prior_token_ids(codes: Tensor) -> Tensor:
    """Image-grid codes [B, h, w] -> the pipeline's prior_token_ids [B, 4 h w]: each code over a
    2 x 2 block."""
    return F.interpolate(codes[:, None].float(), scale_factor=2, mode="nearest").long().flatten(1)


class GlmImageDiT:
    """The pixel stage of a GLM-Image folder: diffusers' pipeline without the token stage and its
    processor (they are the adapter's), loaded on its own so that a memory manager can free the
    9B token stage first."""

    def __init__(self, folder: str, device="cpu", dtype: torch.dtype = torch.float32):
        diffusers = require("diffusers", "GLM-Image's pixel stage", "or decode another model")
        GlmImagePipeline = getattr(diffusers, "GlmImagePipeline", None)
        if GlmImagePipeline is None:
            raise MissingPackage(
                f"GLM-Image's pixel stage needs diffusers 0.37 or newer (GlmImagePipeline); this is "
                f"{diffusers.__version__}: run `pip install -U diffusers` in ComfyUI's Python"
            )
        missing = [p for p in DIT_PARTS if not os.path.isdir(os.path.join(folder, p))]
        if missing:
            raise CheckpointError(
                f"{folder}: missing the folders {', '.join(missing)}; download every file of {REPO}"
            )
        try:
            with (
                warnings.catch_warnings()
            ):  # torch_dtype: 0.37 reads only it, later releases call it deprecated
                warnings.simplefilter("ignore", FutureWarning)
                self.pipe = GlmImagePipeline.from_pretrained(
                    folder,
                    vision_language_encoder=None,
                    processor=None,
                    torch_dtype=dtype,
                    local_files_only=True,
                )
        except Exception as e:  # corrupt or truncated files, a config of another version
            raise CheckpointError(
                f"{folder}: GLM-Image's DiT, VAE or glyph encoder cannot be loaded "
                f"({type(e).__name__}: {e}); re-download the files of {REPO}"
            ) from e
        self.pipe.set_progress_bar_config(disable=True)
        self.module = torch.nn.ModuleDict({name: getattr(self.pipe, name) for name in WEIGHTS}).to(
            device
        )

    @torch.inference_mode()
    def __call__(
        self, codes: Tensor, pixels: PixelSettings, sources: list[Source] | None = None
    ) -> Tensor:
        """Image-grid codes [B, h, w] and their prompts (pixels.prompts: one text per image), and
        for edits each image's sources (the same number of images each, as the pipeline needs) ->
        images [B, 32 h, 32 w, 3] in [0, 1] on the CPU."""
        steps = STEPS if pixels.steps is None else pixels.steps
        guidance = GUIDANCE if pixels.guidance is None else pixels.guidance
        if steps < 1 or guidance < 0:
            raise ValueError(
                f"steps={steps}, guidance={guidance}: the DiT needs at least 1 step and guidance >= 0"
            )
        if len(pixels.prompts) != codes.shape[0]:
            raise ValueError(
                f"{len(pixels.prompts)} prompts for {codes.shape[0]} images: GLM-Image's DiT draws each "
                "image from its tokens and its prompt; give one prompt per image"
            )

        def step_end(pipe, i, t, tensors):
            if pixels.progress is not None:
                pixels.progress(i + 1, steps)
            return {}

        device = weights_device(self.pipe.transformer)
        edit = {}
        if sources:
            if len({len(s.images) for s in sources}) > 1:
                raise ValueError(
                    "GLM-Image's DiT edits a batch whose images have the same number of sources each"
                )
            ids, grids = zip(*(s.pipeline_inputs() for s in sources))
            edit = dict(
                image=[s.images for s in sources],
                prior_token_image_ids=[i.to(device) for i in ids],
                source_image_grid_thw=[g.to(device) for g in grids],
            )
        h, w = codes.shape[1:]
        out = self.pipe(
            prompt=list(pixels.prompts),
            height=h * GRID,
            width=w * GRID,
            prior_token_ids=prior_token_ids(codes).to(device),
            num_inference_steps=steps,
            guidance_scale=guidance,
            generator=torch.Generator(device).manual_seed(pixels.seed),
            output_type="pt",
            callback_on_step_end=step_end,
            **edit,
        )
        return out.images.permute(0, 2, 3, 1).float().cpu()
