"""Janus-Pro 1B / 7B (Chen et al. 2025, github.com/deepseek-ai/Janus) and Janus-4o-7B through
transformers.

JanusForConditionalGeneration, from the converted deepseek-community/Janus-Pro-{1B,7B} folders or
the original deepseek-ai ones (mapped at load time, original.py). Image generation takes the
model's own path: its generation embeddings, aligner and head over the 16384 VQ codes (not the LM
head), 24 x 24 codes at 384 px, upstream's prompt and CFG twin. Edits place each reference as
ShareGPT-4o-Image's Janus-4o does (Chen et al. 2025): docs/families.md, "Janus-Pro"."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor
from torch.nn import functional as F

from ...engine.adapter import Edit, TokenLayout
from ...engine.settings import SamplingSettings
from ..hf_adapter import HFAdapter, TextTokenizer, load_pretrained, to_image
from ..images import check_reference
from ..placement import moved_in, weights_device
from . import IMAGE_CFG

REPOS = "deepseek-community/Janus-Pro-1B (or Janus-Pro-7B)"
PAD, BOI, EOI, PLACEHOLDER = (
    "<｜▁pad▁｜>",
    "<begin_of_image>",
    "<end_of_image>",
    "<image_placeholder>",
)
# upstream generation: CFG 5, temperature 1, no top-k; Janus-4o's edits weigh the row without the
# reference's VQ tokens 5 too (ShareGPT-4o-Image's cfg_weight2)
SAMPLING = SamplingSettings(cfg_scale=5.0, image_cfg_scale=IMAGE_CFG)
GREY = 127 / 255  # what upstream pads a reference to a square with (its image mean, 0.5, in bytes)


def chat_prompt(prompt: str, references: str = "") -> str:
    return f"<|User|>: {references}{prompt.strip()}\n\n<|Assistant|>:{BOI}"


def reference_blocks(understood: int, tokens: int) -> str:
    """One reference in Janus-4o's prompt: a block the understanding tower fills, then one of pads
    that its VQ tokens fill in the full condition's rows only."""
    return f"{BOI}{PLACEHOLDER * understood}{EOI}{BOI}{PAD * tokens}{EOI}"


class ReferenceTowers(torch.nn.Module):
    """What turns a reference into its prompt embeddings: the understanding tower (SigLIP) and its
    aligner, the VQ's encoder and quant_conv. Kept on the CPU, apart from the adapter's module
    (text to image never runs them, so they take no room on the card), and moved to the decode's
    device for an edit's prefill only."""

    def __init__(self, inner):
        super().__init__()
        self.vision, self.aligner = inner.vision_model, inner.aligner
        self.encoder, self.quant_conv = inner.vqmodel.encoder, inner.vqmodel.quant_conv
        inner.vision_model = inner.aligner = inner.vqmodel.encoder = inner.vqmodel.quant_conv = None
        self.encoder.float(), self.quant_conv.float()  # with the VQ decoder, in fp32


class JanusAdapter(HFAdapter):
    family = "Janus-Pro"
    patch = 16  # the VQ's: 24 x 24 codes are the 384 px image

    def __init__(self, model, tokenizer: TextTokenizer, device="cpu"):
        vq = model.config.vq_config
        n = vq.num_patches  # 384 / 16 = 24
        self.reference_encoder = ReferenceTowers(model.model).to("cpu")
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
        self.placeholder, self.eoi = tokenizer.id(PLACEHOLDER), tokenizer.id(EOI)
        self._codebook: Tensor | None = None

    @property
    def default_sampling(self) -> SamplingSettings:
        return SAMPLING

    takes_images = True

    def row_groups(self, conditions, cfg: bool) -> int:
        """With cfg, a batch with edits runs three groups, as Janus-4o's code does: the full
        condition, the condition without the reference's VQ tokens, the unconditional."""
        edits = conditions is not None and any(isinstance(c, Edit) for c in conditions)
        return (3 if edits else 2) if cfg else 1

    def prompt_ids(
        self, conditions: Sequence, negatives: Sequence | None, cfg: bool
    ) -> list[list[int]]:
        """The full condition's rows; with cfg the rows without the references' VQ tokens (the same
        ids: prompt_embeddings leaves their pads) where there are edits, then the unconditional:
        the negative prompt, or everything but BOS and the image start padded, as upstream."""
        cond = [self._encode(c) for c in conditions]
        if not cfg:
            return cond
        part = cond if self.row_groups(conditions, cfg) == 3 else []
        if negatives is not None:
            return cond + part + [self._encode(n) for n in negatives]
        return cond + part + [[ids[0]] + [self.pad_id] * (len(ids) - 2) + [ids[-1]] for ids in cond]

    def _encode(self, condition) -> list[int]:
        text, images = (
            (condition.text, condition.images) if isinstance(condition, Edit) else (condition, ())
        )
        if not isinstance(text, str):
            raise ValueError(f"Janus-Pro needs a text prompt, got {text!r}")
        for image in images:
            check_reference(image, "Janus", self.patch)  # said before anything runs
        understood = self.model.config.vision_config.num_image_tokens
        blocks = reference_blocks(understood, self.layout.grid.numel()) * len(images)
        ids = [self.bos] + self.tokenizer.encode(chat_prompt(text, blocks))
        if ids.count(self.placeholder) != len(images) * understood:
            raise ValueError(
                f"the prompt holds {ids.count(self.placeholder)} {PLACEHOLDER} tokens of its own: "
                f"remove them from the text"
            )
        return ids

    def prompt_embeddings(self, ids: Tensor, conditions: Sequence) -> Tensor:
        """The prompt's embeddings with each reference in place: the understanding tower's features
        over its placeholders (the full and part rows), its VQ tokens' generation embeddings over
        the pads after them (the full rows only), as ShareGPT-4o-Image's Janus-4o inference."""
        x = super().prompt_embeddings(ids, conditions)
        B, n = len(conditions), self.layout.grid.numel()
        m = self.model.config.vision_config.num_image_tokens
        groups = ids.shape[0] // B  # 1: no cfg; 3: full, part, uncond (row_groups)
        for b, condition in enumerate(conditions):
            if not isinstance(condition, Edit):
                continue
            features, tokens = self.reference_inputs(condition)
            starts = (ids[b] == self.placeholder).nonzero()[::m, 0].tolist()
            for row in (b, b + B) if groups == 3 else (b,):
                for k, at in enumerate(starts):
                    x[row, at : at + m] = features[k].to(x.dtype)
            for k, at in enumerate(starts):  # past the placeholders' end and the next start
                x[b, at + m + 2 : at + m + 2 + n] = tokens[k].to(x.dtype)
        return x

    @torch.no_grad()
    def reference_inputs(self, edit: Edit) -> tuple[Tensor, Tensor]:
        """An edit's references as [I, n, C] understanding features and [I, n, C] generation
        embeddings of their VQ tokens."""
        side = self.model.config.vision_config.image_size
        pixels = torch.stack([square(image, side) for image in edit.images]).to(self.device)
        with moved_in(self.reference_encoder, self.device) as towers:
            dtype = towers.aligner.fc1.weight.dtype
            hidden = towers.vision(pixel_values=pixels.to(dtype)).last_hidden_state
            features = towers.aligner(hidden)
            codes = self.encode_references(edit.images, towers)
        return features, self.embed(codes)

    def encode_references(self, images: Sequence[Tensor], towers: ReferenceTowers) -> Tensor:
        """References [H, W, 3] -> their VQ codes [I, n], as upstream encodes them: the l2-normalised
        latent's nearest l2-normalised codebook entry (transformers' quantizer skips the norm)."""
        levels = len(self.model.config.vq_config.channel_multiplier)
        side = self.layout.grid.shape[0] * 2 ** (levels - 1)
        pixels = torch.stack([square(image, side) for image in images]).to(self.device)
        latent = towers.quant_conv(towers.encoder(pixels))
        latent = F.normalize(latent.flatten(2).transpose(1, 2), dim=-1)
        return (latent @ self.codebook().to(latent.device).T).argmax(-1)

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
            (
                "edits",
                "the understanding tower and the VQ encoder are loaded (held in CPU memory): "
                "reference images can be read, Janus-4o's way",
                True,
            ),
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


def square(image: Tensor, side: int) -> Tensor:
    """A reference [H, W, 3] in [0, 1] -> [3, side, side] in [-1, 1] as upstream's processor makes
    it: the long side scaled to `side` (bicubic, antialiased), centred on a grey square."""
    h, w = image.shape[:2]
    scale = side / max(h, w)
    size = (max(round(h * scale), 1), max(round(w * scale), 1))
    pixels = image.detach().float().cpu().permute(2, 0, 1)[None]
    pixels = F.interpolate(pixels, size=size, mode="bicubic", antialias=True, align_corners=False)
    out = torch.full((3, side, side), GREY)
    top, left = (side - size[0]) // 2, (side - size[1]) // 2
    out[:, top : top + size[0], left : left + size[1]] = pixels[0].clamp(0, 1)
    return out * 2 - 1
