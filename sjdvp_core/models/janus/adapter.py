"""Janus-Pro 1B / 7B (Chen et al. 2025, github.com/deepseek-ai/Janus) through transformers.

JanusForConditionalGeneration, from the converted deepseek-community/Janus-Pro-{1B,7B} folders or
the original deepseek-ai ones (mapped at load time, original.py). Image generation takes the
model's own path: its generation embeddings, aligner and head over the 16384 VQ codes (not the LM
head), 24 x 24 codes at 384 px with no structure tokens, upstream's prompt and CFG twin. The
path, the prompt, the twin and the sampling: docs/families.md, "Janus-Pro"."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from ...engine.adapter import TokenLayout
from ...engine.settings import SamplingSettings
from ..hf_adapter import HFAdapter, TextTokenizer, load_pretrained, to_image
from ..placement import weights_device

REPOS = "deepseek-community/Janus-Pro-1B (or Janus-Pro-7B)"
PAD, BOI = "<｜▁pad▁｜>", "<begin_of_image>"
SAMPLING = SamplingSettings(cfg_scale=5.0)  # upstream generation: CFG 5, temperature 1, no top-k


def chat_prompt(prompt: str) -> str:
    return f"<|User|>: {prompt.strip()}\n\n<|Assistant|>:{BOI}"


class JanusAdapter(HFAdapter):
    family = "Janus-Pro"
    patch = 16  # the VQ's: 24 x 24 codes are the 384 px image

    def __init__(self, model, tokenizer: TextTokenizer, device="cpu"):
        vq = model.config.vq_config
        n = vq.num_patches  # 384 / 16 = 24
        super().__init__(
            model,
            model.model.language_model,
            model.config.text_config,
            TokenLayout.raster(torch.arange(vq.num_embeddings), n, n),
            tokenizer.id(PAD),
            device,
        )
        # decode in fp32, as LlamaGen's tokenizer does
        self.image_decoder = model.model.vqmodel.float()
        self.tokenizer, self.bos, self.boi = (
            tokenizer,
            model.config.text_config.bos_token_id,
            tokenizer.id(BOI),
        )
        self._codebook: Tensor | None = None

    @property
    def default_sampling(self) -> SamplingSettings:
        return SAMPLING

    def prompt_ids(
        self, conditions: Sequence, negatives: Sequence | None, cfg: bool
    ) -> list[list[int]]:
        cond = [self._encode(c) for c in conditions]
        if not cfg:
            return cond
        if negatives is not None:
            return cond + [self._encode(n) for n in negatives]
        return cond + [[ids[0]] + [self.pad_id] * (len(ids) - 2) + [ids[-1]] for ids in cond]

    def _encode(self, prompt) -> list[int]:
        if not isinstance(prompt, str):
            raise ValueError(f"Janus-Pro needs a text prompt, got {prompt!r}")
        return [self.bos] + self.tokenizer.encode(chat_prompt(prompt))

    def embed(self, tokens: Tensor) -> Tensor:
        return self.model.prepare_embeddings_for_image_generation(tokens)

    def head(self, hidden: Tensor) -> Tensor:
        return self.model.model.generation_head(hidden)

    @property
    def logits_width(self) -> int:
        return self.layout.image_tokens.numel()

    def facts(self):
        size = self.layout.grid.shape[0] * self.patch
        return [
            (
                "BOS, pad, <begin_of_image>",
                str(self.token_names([self.bos, self.pad_id, self.boi])),
                True,
            ),
            ("image size", f"{size} px (Janus-Pro generates 384 x 384)", size == 384),
        ]

    def codebook(self) -> Tensor:
        """The l2-normalised VQ codebook (what the decoder looks up), once per device."""
        weight = self.model.model.vqmodel.quantize.embedding.weight
        if self._codebook is None or self._codebook.device != weight.device:
            with torch.no_grad():
                self._codebook = F.normalize(weight.float(), dim=-1)
        return self._codebook

    @torch.no_grad()
    def decode_image(self, codes: Tensor, pixels=None) -> Tensor:
        # in [-1, 1]
        pixels = self.image_decoder.decode(codes.flatten(1).to(weights_device(self.image_decoder)))
        return to_image(pixels)


def load_converted(folder: str, device="cpu", dtype=torch.float32) -> JanusAdapter:
    """The transformers-format release (deepseek-community/Janus-Pro-*); the original one:
    original.py."""
    from transformers import JanusForConditionalGeneration

    model = load_pretrained(JanusForConditionalGeneration, folder, REPOS, dtype)
    return JanusAdapter(model, TextTokenizer(folder, REPOS), device=device)
