"""GLM-Image (zai-org/GLM-Image, Z.ai 2026): a 9B autoregressive token stage, transformers'
GlmImageForConditionalGeneration (from GLM-4-9B), whose tokens a 7B DiT (diffusers' GlmImagePipeline) turns into
pixels. The engine decodes the token stage; the release's folder is the diffusers one (model_index.json), the
token stage in its vision_language_encoder/ folder and the chat template and tokenizer in processor/.

The layout, as transformers' GlmImageProcessor and GlmImageModel.get_rope_index and diffusers'
GlmImagePipeline.generate_prior_tokens have it: the prompt, through the processor's chat template, ends with
"<sop>{H/32} {W/32}<eop><sop>{h} {w}<eop><|dit_token_16384|>"; the model then writes a small prior grid of
h x w codes (about 16 x 16 at any size), then the image's H/32 x W/32 grid, then <|dit_token_16385|>. Nothing is
forced inside the grids; the end token is (the pipeline never reads it). A generated token's RoPE position has
three axes (temporal, row, column) that follow its grid: after P prompt tokens the prior grid's cell (r, c) is at
(P, P + r, P + c), the image grid's at (Q, Q + r, Q + c) with Q = P + max(h, w), the end token at
Q + max(H/32, W/32) on all three. `rope_positions` computes them for every drafted slot from this layout, never
from a table of the last forward (as transformers' generate() keeps one).
The pixels: the release's DiT (dit.py), a model of its own that a memory manager loads after the token stage
(`pixels_apart`); a live preview colours each code by the codebook's three main directions instead.
Sampling: the release's generation_config.json, with transformers' defaults where it is silent (upstream's
generate() reads it so), one row: the token stage has no classifier-free guidance. One deviation: a grid position
draws only the 16384 codes, where upstream samples all of the head's entries (a code past the codebook would
break the DiT).
"""
from __future__ import annotations

import inspect
import os
from typing import Sequence

import torch
from torch import Tensor

from ...engine.adapter import PixelSettings, TokenLayout
from ...engine.settings import SamplingSettings
from ..checkpoint import CheckpointError
from ..hf_adapter import HFAdapter, SizeChoice, load_pretrained
from . import ENCODER, GRID, PIPELINE, REPO, is_glm_image
from .dit import GlmImageDiT

PROCESSOR = "processor"
DEFAULT_SIZE = 1024


class GlmImageAdapter(SizeChoice, HFAdapter):
    family = "GLM-Image"
    pixels_apart = True

    def __init__(self, model, processor, sampling: SamplingSettings, dit, width: int = DEFAULT_SIZE,
                 height: int = DEFAULT_SIZE, device="cpu"):
        config = model.config
        super().__init__(model, model.model.language_model, config.text_config, None,
                         config.text_config.pad_token_id, device)
        self.processor, self.sampling, self.dit, self.palette = processor, sampling, dit, None
        self.image_decoder = dit.module
        self.codes = config.vq_config.num_embeddings
        self.image_start, self.image_end = config.image_start_token_id, config.image_end_token_id
        # transformers 5.25 takes the processor's own arguments apart from the template's (5.0 among them)
        self.split_kwargs = "processor_kwargs" in inspect.signature(processor.apply_chat_template).parameters
        self.layout = self.size_to(width, height)

    @property
    def default_sampling(self) -> SamplingSettings:
        return self.sampling

    def size_to(self, width: int, height: int) -> TokenLayout:
        """The two grids at width x height px (as the processor derives them) and their RoPE table."""
        if width < GRID or height < GRID or width % GRID or height % GRID:
            near = f"{max(GRID, round(width / GRID) * GRID)}x{max(GRID, round(height / GRID) * GRID)}"
            raise ValueError(f"{width}x{height} px: GLM-Image generates multiples of {GRID} px (one token per "
                             f"{GRID} x {GRID} px); the nearest is {near}")
        self.width, self.height = width, height
        grids = self.processor(text=[""], target_h=height, target_w=width)["image_grid_thw"].tolist()
        (_, H, W), (_, h, w) = grids                         # the image grid, then the prior grid
        prior = torch.arange(h * w).view(h, w)
        image = h * w + torch.arange(H * W).view(H, W)
        forced = torch.full((h * w + H * W + 1,), -1, dtype=torch.long)
        forced[-1] = self.image_end
        self.rope = _rope_table(h, w, H, W)
        return TokenLayout(torch.arange(self.codes), torch.tensor([self.image_end]), forced, image, (prior,))

    def prompt_ids(self, conditions: Sequence, negatives: Sequence | None, cfg: bool) -> list[list[int]]:
        if cfg:
            raise ValueError("GLM-Image's token stage has no classifier-free guidance (upstream samples one row): "
                             "set cfg to 1")
        return [self._encode(c) for c in conditions]

    def _encode(self, prompt) -> list[int]:
        if not isinstance(prompt, str):
            raise ValueError(f"GLM-Image needs a text prompt, got {prompt!r}")
        messages = [{"role": "user", "content": [{"type": "text", "text": prompt}]}]
        size = {"target_h": self.height, "target_w": self.width}
        out = self.processor.apply_chat_template(messages, tokenize=True, return_dict=True, return_tensors="pt",
                                                 **({"processor_kwargs": size} if self.split_kwargs else size))
        ids = out["input_ids"][0].tolist()
        if ids[-1] != self.image_start:
            raise CheckpointError(f"the processor's prompt ends with id {ids[-1]}, not the image start "
                                  f"{self.image_start}; use the processor/ folder of {REPO}")
        return ids

    def rope_positions(self, positions: Tensor) -> Tensor:
        """[3, R, W]: each generated position's (temporal, row, column) after the row's prompt tokens."""
        if self.rope.device != positions.device:   # once per device, not every forward
            self.rope = self.rope.to(positions.device)
        return self.prompt_len[None, :, None] + self.rope[:, positions]

    def head(self, hidden: Tensor) -> Tensor:
        return self.model.lm_head(hidden)

    @property
    def logits_width(self) -> int:
        return self.text_config.vision_vocab_size

    def codebook(self) -> Tensor:
        """The token stage's VQ codebook (what its image tokenizer quantises to)."""
        return self.model.model.vqmodel.quantize.embedding.weight

    def decode_image(self, codes: Tensor, pixels: PixelSettings | None = None) -> Tensor:
        """The DiT's images of the image grid's codes [B, h, w], conditioned on pixels.prompts."""
        if pixels is None or not pixels.prompts:
            raise ValueError("GLM-Image's DiT draws the image from the tokens and the prompt: give the prompts "
                             "(decode_image(codes, PixelSettings(prompts=...)))")
        return self.dit(codes, pixels)

    def preview_image(self, codes: Tensor) -> Tensor:
        """Each code as a colour (the codebook's three main directions), GRID px a code: no DiT per preview."""
        if self.palette is None:
            self.palette = palette(self.codebook())
        rgb = self.palette[codes.cpu()]
        return rgb.repeat_interleave(GRID, 1).repeat_interleave(GRID, 2)

    def facts(self):
        (H, W), (h, w) = self.layout.grid.shape, self.layout.prior_grids[0].shape
        ids = [self.image_start, self.image_end]
        return [("image start, image end", str(self.token_names(ids)), True),
                ("grids", f"{self.width} x {self.height} px: a prior grid of {h} x {w} codes, then the image's "
                          f"{H} x {W}, then the end token ({self.layout.length} generated tokens)", True),
                ("codes", f"ids 0..{self.codes - 1}; the head scores ids 0..{self.logits_width - 1}",
                 self.image_end < self.logits_width),
                ("sampling", f"temperature {self.sampling.temperature}, top-k {self.sampling.top_k}, "
                             f"top-p {self.sampling.top_p} (generation_config.json)", True)]

    def token_names(self, ids) -> list[tuple[int, str]]:
        return [(int(i), self.processor.tokenizer.convert_ids_to_tokens(int(i))) for i in ids]


def palette(codebook: Tensor) -> Tensor:
    """[K, 3] colours in [0, 1]: each code's projection on the codebook's three principal directions, each
    stretched over its 1st-99th percentile (codes close in the codebook get close colours)."""
    x = codebook.detach().float().cpu()
    x = x - x.mean(0)
    _, vectors = torch.linalg.eigh(x.T @ x)
    p = x @ vectors[:, -3:].flip(1)
    low, high = p.quantile(0.01, 0), p.quantile(0.99, 0)
    return ((p - low) / (high - low).clamp_min(1e-6)).clamp(0, 1)


def _rope_table(h: int, w: int, H: int, W: int) -> Tensor:
    """[3, h*w + H*W + 1]: the (temporal, row, column) RoPE offset of every generated position from the prompt's
    length (transformers' GlmImageModel.get_rope_index for the grids written after the prompt)."""
    def grid(t: int, rows: int, cols: int) -> Tensor:
        r, c = torch.arange(rows).repeat_interleave(cols), torch.arange(cols).repeat(rows)
        return torch.stack([torch.full_like(r, t), t + r, t + c])
    q = max(h, w)
    end = torch.full((3, 1), q + max(H, W), dtype=torch.long)
    return torch.cat([grid(0, h, w), grid(q, H, W), end], 1)


GENERATE_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0}   # what generate() takes where unset
# what a workflow's sampling widgets show; a loaded model samples as its generation_config.json says
SAMPLING = SamplingSettings(**GENERATE_DEFAULTS)


def generation_sampling(folder: str) -> SamplingSettings:
    """The token stage's sampling: its generation_config.json as transformers' generate() reads it (a field the
    file leaves unset takes GenerationConfig's default)."""
    from transformers import GenerationConfig
    try:
        config = GenerationConfig.from_pretrained(folder, local_files_only=True)
    except OSError:     # no generation_config.json
        config = GenerationConfig()
    value = {k: getattr(config, k) if getattr(config, k, None) is not None else v for k, v in GENERATE_DEFAULTS.items()}
    return SamplingSettings(**value)


def load_processor(folder: str):
    from transformers import GlmImageProcessor
    try:
        return GlmImageProcessor.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # missing or unreadable files
        raise CheckpointError(f"{folder}: cannot be read as GLM-Image's processor ({type(e).__name__}: {e}); "
                              f"download the processor/ folder of {REPO}") from e


def load_glm_image(folder: str, device="cpu", dtype=torch.float32, width: int | None = None,
                   height: int | None = None) -> GlmImageAdapter:
    """A GLM-Image folder (the release's diffusers layout): the token stage, with the pixel stage beside it;
    width, height in pixels (default 1024 x 1024)."""
    try:
        from transformers import GlmImageForConditionalGeneration
    except ImportError as e:
        raise ImportError("GLM-Image needs transformers 5.0 or newer: pip install -U transformers") from e
    if not is_glm_image(folder):
        raise CheckpointError(f"{folder}: no model_index.json naming {PIPELINE}; download every file of {REPO}")
    encoder = os.path.join(folder, ENCODER)
    processor = load_processor(os.path.join(folder, PROCESSOR))
    model = load_pretrained(GlmImageForConditionalGeneration, encoder, REPO, dtype, files=("config.json",))
    return GlmImageAdapter(model, processor, generation_sampling(encoder), GlmImageDiT(folder, device, dtype),
                           width or DEFAULT_SIZE, height or DEFAULT_SIZE, device)
