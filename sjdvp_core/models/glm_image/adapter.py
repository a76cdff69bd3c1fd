"""GLM-Image's token stage (zai-org/GLM-Image, Z.ai 2026) for the engine; a DiT draws the pixels.

The 9B autoregressive model (transformers' GlmImageForConditionalGeneration) writes a small prior
grid, then the image's grid, laid out as transformers' GlmImageProcessor and diffusers'
GlmImagePipeline have them; `rope_positions` gives every drafted slot its 3-axis RoPE position from
that layout. An Edit puts its source images' tokens in the prompt (`prompt_rope`), and the release's
DiT (dit.py) turns the grid into pixels (`pixels_apart`). The prompt, the grids, the positions and
editing: docs/glm_image.md, "The token layout"."""

from __future__ import annotations

import inspect
import logging
import os
from dataclasses import dataclass, replace
from typing import Sequence

import torch
from torch import Tensor

from ...engine.adapter import Edit, PixelSettings, TokenLayout, edit_batch
from ...engine.settings import SamplingSettings
from ..checkpoint import CheckpointError
from ..hf_adapter import HFAdapter, SizeChoice, load_pretrained
from ..images import KeptForEdits, pil_image
from ..optional import MissingPackage
from ..placement import weights_device
from . import ENCODER, GRID, PIPELINE, REPO, is_glm_image
from .dit import GlmImageDiT, Source

log = logging.getLogger(__name__)

PROCESSOR = "processor"
# the VQ's decoder-side convolution: transformers builds it, nothing runs it (the DiT draws the
# pixels), so a release without it loads (transformers itself would only warn)
UNUSED_VQ = "model.vqmodel.post_quant_conv."
DEFAULT_SIZE = 1024


@dataclass(frozen=True)
class Encoded:
    """One condition through the processor: ids (an edit's source images as <|image|> placeholders),
    the source images' pixels and their token grids (h, w) in order (none for text alone)."""

    ids: list[int]
    pixel_values: Tensor | None = None
    grids: tuple[tuple[int, int], ...] = ()


class GlmImageAdapter(SizeChoice, HFAdapter):
    family = "GLM-Image"
    pixels_apart = True
    takes_images = True
    sequential_positions = (
        False  # 3-D positions: an image grid's tokens take its rows' and columns' positions
    )
    # edits whose source tokens are kept for the DiT (it runs after the token stage may be gone)

    def __init__(
        self,
        model,
        processor,
        sampling: SamplingSettings,
        dit,
        width: int = DEFAULT_SIZE,
        height: int = DEFAULT_SIZE,
        device="cpu",
    ):
        config = model.config
        super().__init__(
            model,
            model.model.language_model,
            config.text_config,
            None,
            config.text_config.pad_token_id,
            device,
        )
        self.processor, self.sampling, self.dit, self.palette = processor, sampling, dit, None
        self.image_decoder = dit.module
        self.codes, self.image_token = config.vq_config.num_embeddings, config.image_token_id
        self.image_start, self.image_end = config.image_start_token_id, config.image_end_token_id
        # transformers 5.25 takes the processor's own arguments apart from the template's (5.0 among
        # them)
        self.split_kwargs = (
            "processor_kwargs" in inspect.signature(processor.apply_chat_template).parameters
        )
        self.sources = KeptForEdits()
        self.layout = self.size_to(width, height)

    @property
    def default_sampling(self) -> SamplingSettings:
        return self.sampling

    def size_to(self, width: int, height: int) -> TokenLayout:
        """The grids at width x height px (as the processor derives them) and their RoPE tables:
        text to image writes the prior grid then the image's (the layout returned), an edit only
        the image's (layouts[True])."""
        if width < GRID or height < GRID or width % GRID or height % GRID:
            near = (
                f"{max(GRID, round(width / GRID) * GRID)}x{max(GRID, round(height / GRID) * GRID)}"
            )
            raise ValueError(
                f"{width}x{height} px: GLM-Image generates multiples of {GRID} px (one token per "
                f"{GRID} x {GRID} px); the nearest is {near}"
            )
        grids = self.processor(text=[""], target_h=height, target_w=width)[
            "image_grid_thw"
        ].tolist()
        (_, H, W), (_, h, w) = grids  # the image grid, then the prior grid
        if not (h and w):
            raise ValueError(
                f"{width}x{height} px: too far from square for GLM-Image, its small first grid (about "
                f"16 x 16 codes) would be {h} x {w}; bring the sides closer together"
            )
        self.width, self.height = width, height
        self.layouts = {
            False: (self._layout((h, w), (H, W)), _rope_table([(h, w), (H, W)])),
            True: (self._layout((H, W)), _rope_table([(H, W)])),
        }
        self.layout, self.rope = self.layouts[False]
        return self.layout

    def _layout(self, *grids: tuple[int, int]) -> TokenLayout:
        """Grids written one after the other (the last is the image's), then the end token
        (forced)."""
        cells, offset = [], 0
        for h, w in grids:
            cells.append(offset + torch.arange(h * w).view(h, w))
            offset += h * w
        forced = torch.full((offset + 1,), -1, dtype=torch.long)
        forced[-1] = self.image_end
        return TokenLayout(
            torch.arange(self.codes),
            torch.tensor([self.image_end]),
            forced,
            cells[-1],
            tuple(cells[:-1]),
        )

    def start(self, conditions, negatives, cfg: bool, scratch: int = 0):
        """Text to image writes the prior grid then the image's; a batch of edits only the
        image's."""
        self.layout, rope = self.layouts[edit_batch(conditions, "GLM-Image")]
        self.rope = rope.to(self.device)  # once a decode, not every forward
        return super().start(conditions, negatives, cfg, scratch)

    def finish(self) -> None:
        super().finish()
        self.layout, self.rope = self.layouts[False]

    def prompt_ids(
        self, conditions: Sequence, negatives: Sequence | None, cfg: bool
    ) -> list[list[int]]:
        """Each condition's ids, an edit's source images as their tokens (computed by the model's
        vision encoder and VQ, as upstream's forward does, and kept for the DiT)."""
        _one_row(negatives, cfg)
        return [self._with_sources(c, self._encode(c)) for c in conditions]

    def prompt_length(self, conditions, negatives, cfg: bool) -> int | None:
        """Counted from the processor's ids alone (no vision encoder: a memory estimate runs before
        the model is on its device)."""
        _one_row(negatives, cfg)
        return None if conditions is None else max(len(self._encode(c).ids) for c in conditions)

    def _encode(self, condition) -> Encoded:
        edit = isinstance(condition, Edit)
        text = condition.text if edit else condition
        if not isinstance(text, str):
            raise ValueError(f"GLM-Image needs a text prompt, got {text!r}")
        images = (
            [{"type": "image", "image": pil_image(image)} for image in condition.images]
            if edit
            else []
        )
        messages = [{"role": "user", "content": [*images, {"type": "text", "text": text}]}]
        size = {"target_h": self.height, "target_w": self.width}
        try:
            out = self.processor.apply_chat_template(
                messages,
                tokenize=True,
                return_dict=True,
                return_tensors="pt",
                **({"processor_kwargs": size} if self.split_kwargs else size),
            )
        except ValueError as e:
            if not edit:
                raise
            shapes = ", ".join(f"{i.shape[1]}x{i.shape[0]}" for i in condition.images)
            raise ValueError(
                f"GLM-Image's processor cannot take the reference images ({shapes} px): "
                f"{' '.join(str(e).split())}; use larger images"
            ) from e
        ids = out["input_ids"][0].tolist()
        if ids[-1] != self.image_start:
            raise CheckpointError(
                f"the processor's prompt ends with id {ids[-1]}, not the image start "
                f"{self.image_start}; use the processor/ folder of {REPO}"
            )
        if not images:
            return Encoded(ids)
        grids = out["image_grid_thw"]
        # transformers 5.17's processor drops the sources' grids from one prompt
        if len(grids) <= len(images):
            grids = self.processor.image_processor(
                images=[i["image"] for i in images], return_tensors="pt"
            )["image_grid_thw"]
        return Encoded(
            ids, out["pixel_values"], tuple((h, w) for _, h, w in grids[: len(images)].tolist())
        )

    def _with_sources(self, condition, row: Encoded) -> list[int]:
        if not row.grids:
            return row.ids
        ids = torch.tensor(row.ids)
        codes, _ = self.source_tokens(condition, row)
        placeholders = ids == self.image_token
        if int(placeholders.sum()) != codes.numel():
            raise CheckpointError(
                f"the processor's prompt holds {int(placeholders.sum())} image placeholders for "
                f"{codes.numel()} source tokens; use the processor/ folder of {REPO}"
            )
        ids[placeholders] = codes
        return ids.tolist()

    @torch.inference_mode()
    def source_tokens(self, edit: Edit, row: Encoded | None = None) -> tuple[Tensor, tuple]:
        """An edit's source images as codes (flat, image after image, on the CPU) and their grids:
        the vision encoder's features quantised by the VQ, as GlmImageModel.forward does; kept
        for the edit's DiT run."""
        return self.sources.get(edit, lambda: self._source_tokens(edit, row))

    def _source_tokens(self, edit: Edit, row: Encoded | None) -> tuple[Tensor, tuple]:
        row = row or self._encode(edit)
        inner = self.model.model
        device = weights_device(inner.visual)
        grids = torch.tensor([(1, h, w) for h, w in row.grids], device=device)
        features = inner.get_image_features(row.pixel_values.to(device), grids).pooler_output
        # transformers 5.17: each image's features flat, tokenised with the grids
        if features[0].dim() == 2:
            codes = inner.get_image_tokens(torch.cat(features), grids)
        else:  # 5.18 on: each image's [C, h, w]
            codes = inner.get_image_tokens(features)
        return codes.flatten().cpu(), row.grids

    def prompt_positions(
        self, ids: Tensor, valid: Tensor, conditions: Sequence
    ) -> tuple[Tensor, Tensor]:
        """Text to image: the prompt's tokens counted. An edit: the source images' tokens placed in
        2-D after their start token, each image advancing the count by its longer side
        (GlmImageModel.get_rope_index); the grids are those prompt_ids encoded (source_tokens
        keeps them)."""
        if not isinstance(conditions[0], Edit):  # start() holds a batch to one kind
            return super().prompt_positions(ids, valid, conditions)
        R, P = ids.shape
        positions, after = torch.zeros(3, R, P, dtype=torch.long), []
        for r in range(R):
            cols = valid[r].nonzero()[:, 0].cpu()
            rope, next_position = prompt_rope(
                ids[r, cols].tolist(),
                self.source_tokens(conditions[r])[1],
                self.image_start,
                self.image_end,
            )
            positions[:, r, cols] = rope
            after.append(next_position)
        return positions.to(ids.device), torch.tensor(after, device=ids.device)

    def rope_positions(self, positions: Tensor) -> Tensor:
        """[3, R, W]: each generated position's (temporal, row, column) after the row's prompt."""
        return self.prompt_len[None, :, None] + self.rope[:, positions]

    def head(self, hidden: Tensor) -> Tensor:
        return self.model.lm_head(hidden)

    def pixel_blocks(self) -> list[torch.nn.Module]:
        """The DiT's transformer blocks (most of its 7B weights; its embeddings, the VAE and the
        glyph encoder keep their dtype)."""
        return list(self.dit.pipe.transformer.transformer_blocks)

    @property
    def logits_width(self) -> int:
        return self.text_config.vision_vocab_size

    def codebook(self) -> Tensor:
        """The token stage's VQ codebook (what its image tokenizer quantises to)."""
        return self.model.model.vqmodel.quantize.embedding.weight

    def decode_image(self, codes: Tensor, pixels: PixelSettings | None = None) -> Tensor:
        """The DiT's images of the image grid's codes [B, h, w], conditioned on pixels.prompts (an
        edit's: its text, and its source images with their tokens)."""
        if pixels is None or not pixels.prompts:
            raise ValueError(
                "GLM-Image's DiT draws the image from the tokens and the prompt: give the prompts "
                "(decode_image(codes, PixelSettings(prompts=...)))"
            )
        if not edit_batch(pixels.prompts, "GLM-Image"):
            return self.dit(codes, pixels)
        sources = []
        for e in pixels.prompts:
            tokens, grids = self.source_tokens(e)
            sources.append(
                Source([source_image(i, grid) for i, grid in zip(e.images, grids)], tokens, grids)
            )
        return self.dit(codes, replace(pixels, prompts=[e.text for e in pixels.prompts]), sources)

    def preview_image(self, codes: Tensor) -> Tensor:
        """Each code as a colour (the codebook's three main directions), GRID px a code: no DiT
        per preview."""
        if self.palette is None:
            self.palette = palette(self.codebook())
        rgb = self.palette[codes.cpu()]
        return rgb.repeat_interleave(GRID, 1).repeat_interleave(GRID, 2)

    def facts(self):
        (H, W), (h, w) = self.layout.grid.shape, self.layout.prior_grids[0].shape
        ids = [self.image_start, self.image_end]
        return [
            ("image start, image end", str(self.token_names(ids)), True),
            (
                "grids",
                f"{self.width} x {self.height} px: a prior grid of {h} x {w} codes, then the image's "
                f"{H} x {W}, then the end token ({self.layout.length} generated tokens)",
                True,
            ),
            (
                "codes",
                f"ids 0..{self.codes - 1}; the head scores ids 0..{self.logits_width - 1}",
                self.image_end < self.logits_width,
            ),
            (
                "sampling",
                f"temperature {self.sampling.temperature}, top-k {self.sampling.top_k}, "
                f"top-p {self.sampling.top_p} (generation_config.json)",
                True,
            ),
        ]

    def token_names(self, ids) -> list[tuple[int, str]]:
        return [(int(i), self.processor.tokenizer.convert_ids_to_tokens(int(i))) for i in ids]


def palette(codebook: Tensor) -> Tensor:
    """[K, 3] colours in [0, 1]: each code's projection on the codebook's three principal
    directions, each stretched over its 1st-99th percentile (codes close in the codebook get
    close colours)."""
    x = codebook.detach().float().cpu()
    x = x - x.mean(0)
    _, vectors = torch.linalg.eigh(x.T @ x)
    p = x @ vectors[:, -3:].flip(1)
    low, high = p.quantile(0.01, 0), p.quantile(0.99, 0)
    return ((p - low) / (high - low).clamp_min(1e-6)).clamp(0, 1)


def _grid_rope(t: int, rows: int, cols: int) -> Tensor:
    """[3, rows * cols]: a grid's cells at (t, t + row, t + column), row-major."""
    r, c = torch.arange(rows).repeat_interleave(cols), torch.arange(cols).repeat(rows)
    return torch.stack([torch.full_like(r, t), t + r, t + c])


def _rope_table(grids: Sequence[tuple[int, int]]) -> Tensor:
    """[3, sum(h * w) + 1]: the (temporal, row, column) RoPE offset of every generated position from
    the row's first, for grids written one after the other (each advancing the count by its
    longer side) and the end token (transformers' GlmImageModel.get_rope_index for the grids
    written after the prompt)."""
    parts, t = [], 0
    for h, w in grids:
        parts.append(_grid_rope(t, h, w))
        t += max(h, w)
    return torch.cat([*parts, torch.full((3, 1), t, dtype=torch.long)], 1)


def prompt_rope(
    tokens: list[int], grids: Sequence[tuple[int, int]], start: int, end: int
) -> tuple[Tensor, int]:
    """A prompt's RoPE positions [3, n] and the next position: text counts one a token; the k-th
    source image (its h x w tokens between a start and an end token) sits in 2-D after its start
    token and advances the count by max(h, w) (GlmImageModel.get_rope_index). A source image
    whose block is laid out otherwise is refused (it would otherwise be read as text, positioned
    wrong without a word)."""
    parts, p, i, k = [], 0, 0, 0
    while i < len(tokens):
        if tokens[i] == start and k < len(grids):
            h, w = grids[k]
            if not (i + 1 + h * w < len(tokens) and tokens[i + 1 + h * w] == end):
                raise ValueError(
                    f"GLM-Image: source image {k + 1} of the prompt is not laid out as its start token, "
                    f"{h} x {w} image tokens and its end token (from token {i}); the processor's prompt "
                    f"does not match its images: use the processor/ folder of {REPO}, and keep image "
                    "tokens out of the prompt's text"
                )
            parts += [torch.full((3, 1), p), _grid_rope(p + 1, h, w)]
            p, i, k = p + 1 + max(h, w), i + 1 + h * w, k + 1
            continue
        parts.append(torch.full((3, 1), p))
        p, i = p + 1, i + 1
    if k < len(grids):
        raise ValueError(
            f"GLM-Image: the prompt holds {k} source image blocks for {len(grids)} source images; the "
            f"processor's prompt does not match its images: use the processor/ folder of {REPO}"
        )
    return torch.cat(parts, 1), p


def _one_row(negatives: Sequence | None, cfg: bool) -> None:
    """GLM-Image's token stage samples one row, as upstream does: no guidance branch, so no
    negative prompt."""
    if cfg:
        raise ValueError(
            "GLM-Image's token stage has no classifier-free guidance (upstream samples one row): "
            "set cfg to 1"
        )
    if negatives is not None:
        raise ValueError(
            "GLM-Image's token stage has no guidance branch, so no negative prompt: leave it empty"
        )


def source_image(image: Tensor, grid: tuple[int, int]):
    """A source image as the DiT takes it: resized to its token grid's size, GRID px a token, so
    that its latent patches (16 px) are the tokens' 2 x 2 blocks. Upstream passes the image as
    given, whose latent grid misses the tokens' where the processor rescaled it or its sides are
    not multiples of 32 px (the pipeline then fails). Lanczos, as diffusers' image processor
    resizes for the VAE; an image at the grid's size is kept as it is."""
    from PIL import Image

    h, w = grid
    return pil_image(image).resize((GRID * w, GRID * h), Image.Resampling.LANCZOS)


# what generate() takes where unset
GENERATE_DEFAULTS = {
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
}
# generate()'s other ways of changing the law it samples: a release that sets one is sampled
# otherwise here (said)
UNAPPLIED = (
    "repetition_penalty",
    "min_p",
    "typical_p",
    "epsilon_cutoff",
    "eta_cutoff",
    "no_repeat_ngram_size",
    "suppress_tokens",
    "begin_suppress_tokens",
    "bad_words_ids",
    "sequence_bias",
    "top_h",
)
# what a workflow's sampling widgets show; a loaded model samples as its generation_config.json says
SAMPLING = SamplingSettings(**GENERATE_DEFAULTS)


def generation_sampling(folder: str) -> SamplingSettings:
    """The token stage's sampling: its generation_config.json as transformers' generate() reads it
    (a field the file leaves unset takes GenerationConfig's default)."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    except OSError:  # no generation_config.json
        config = GenerationConfig()
    value = {
        k: getattr(config, k) if getattr(config, k, None) is not None else v
        for k, v in GENERATE_DEFAULTS.items()
    }
    unapplied = {k: v for k, v in config.to_diff_dict().items() if k in UNAPPLIED}
    if unapplied:
        log.warning(
            "sjdvp: %s/generation_config.json sets %s, which sjdvp does not apply: GLM-Image's tokens are "
            "sampled with its temperature, top-k and top-p alone",
            folder,
            ", ".join(f"{k}={v}" for k, v in unapplied.items()),
        )
    return SamplingSettings(**value)


def load_processor(folder: str):
    from transformers import GlmImageProcessor

    try:
        return GlmImageProcessor.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # missing or unreadable files
        raise CheckpointError(
            f"{folder}: cannot be read as GLM-Image's processor ({type(e).__name__}: {e}); "
            f"download the processor/ folder of {REPO}"
        ) from e


def load_glm_image(
    folder: str,
    device="cpu",
    dtype=torch.float32,
    width: int | None = None,
    height: int | None = None,
) -> GlmImageAdapter:
    """A GLM-Image folder (the release's diffusers layout): the token stage, with the pixel stage
    beside it; width, height in pixels (default 1024 x 1024)."""
    try:
        from transformers import GlmImageForConditionalGeneration
    except ImportError as e:
        raise MissingPackage(
            "GLM-Image needs transformers 5.0 or newer: pip install -U transformers"
        ) from e
    if not is_glm_image(folder):
        raise CheckpointError(
            f"{folder}: no model_index.json naming {PIPELINE}; download every file of {REPO}"
        )
    encoder = os.path.join(folder, ENCODER)
    processor = load_processor(os.path.join(folder, PROCESSOR))
    model = load_pretrained(
        GlmImageForConditionalGeneration,
        encoder,
        REPO,
        dtype,
        files=("config.json",),
        optional=(UNUSED_VQ,),
    )
    return GlmImageAdapter(
        model,
        processor,
        generation_sampling(encoder),
        GlmImageDiT(folder, device, dtype),
        width or DEFAULT_SIZE,
        height or DEFAULT_SIZE,
        device,
    )
