"""Emu3-Gen (Wang et al. 2024, github.com/baaivision/Emu3) through transformers' Emu3 classes.

From the converted BAAI/Emu3-Gen-hf folder or the original BAAI/Emu3-Gen release (mapped at load
time, original.py). The prompt asks for an h x w grid of visual tokens; row ends and the image's end
are forced, every other position is restricted to the 32768 visual tokens, and CFG's unconditional
branch is the negative prompt. Text, the size string included, is split digit by digit as the model
was trained, whichever tokenizer file is loaded. The prompt, the forced tokens, upstream's sampling
and the tokenizer fix: docs/families.md, "Emu3"."""

from __future__ import annotations

import os
from typing import Sequence

import torch
from torch import Tensor

from ...engine.adapter import TokenLayout
from ...engine.settings import SamplingSettings
from ..checkpoint import CheckpointError, read_json
from ..hf_adapter import HFAdapter, SizeChoice, TextTokenizer, load_pretrained, to_image
from ..placement import weights_device

REPO = "BAAI/Emu3-Gen-hf"
BOS, BOI, WRAPPER = "<|extra_203|>", "<|image start|>", "<|image token|>"
EOL, EOF, EOI, EOS, PAD = (
    "<|extra_200|>",
    "<|extra_201|>",
    "<|image end|>",
    "<|extra_204|>",
    "<|endoftext|>",
)
QUALITY_SUFFIX = " masterpiece, film grained, best quality."
NEGATIVE_PROMPT = (
    "lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
    "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
    "username, blurry."
)
IMAGE_AREA = 720 * 720
# upstream's generation example (with the negative prompt)
SAMPLING = SamplingSettings(cfg_scale=3.0, top_k=2048)
# upstream's PAT_STR: one digit per piece, letters with one leading non-letter, punctuation runs
PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def token_grid(
    ratio: str, image_area: int, factor: int, max_positions: int, asked: str = ""
) -> tuple[int, int]:
    """(h, w) in tokens for an aspect ratio "W:H" and an area in pixels, as Emu3's processor rounds
    them; a ValueError says why a size is not supported (naming `asked`, what the user gave,
    where not these two)."""
    asked = asked or f"image_area={image_area} at ratio {ratio}"
    parts = ratio.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(
            f"ratio={ratio!r}: give the aspect ratio as 'W:H' with positive integers, e.g. '1:1', '16:9'"
        )
    if not isinstance(image_area, (int, float)) or not image_area > 0:
        raise ValueError(
            f"image_area={image_area!r}: give a positive number of pixels; Emu3 was trained at "
            f"{IMAGE_AREA} (720x720)"
        )
    rw, rh = (int(p) for p in parts)
    scale = (image_area / (rw * rh)) ** 0.5
    h, w = round(rh * scale / factor), round(rw * scale / factor)
    if h < 1 or w < 1:
        raise ValueError(
            f"{asked} is under one {factor}x{factor} token on a side; Emu3 was trained at {IMAGE_AREA} "
            "pixels (720x720)"
        )
    if h * (w + 1) + 3 >= max_positions:
        raise ValueError(
            f"{asked} needs {h}x{w} tokens, more than Emu3's {max_positions} positions; use at most "
            f"{IMAGE_AREA} pixels (720x720), the trained area"
        )
    return h, w


class Emu3Adapter(SizeChoice, HFAdapter):
    family = "Emu3"

    def facts(self):
        named = self.token_names(self.tokenizer.encode(self.image_prefix))
        size = [name for _, name in named[1:-1]]  # between <|image start|> and <|image token|>
        return ([("vision tokenizer", self.vision_folder, True)] if self.vision_folder else []) + [
            (f"image prefix {self.image_prefix!r}", str(named), True),
            (
                "size string",
                f"tokenized as {size} (Emu3 was trained on one token per character)",
                all(len(piece) == 1 for piece in size),
            ),
        ]

    def __init__(
        self,
        model,
        tokenizer: TextTokenizer,
        *,
        ratio: str = "1:1",
        image_area: int = IMAGE_AREA,
        quality_suffix: str = QUALITY_SUFFIX,
        pixel_mean=(0.5,) * 3,
        pixel_std=(0.5,) * 3,
        device="cpu",
        vision_folder: str | None = None,
    ):
        """vision_folder: where the original release's vision tokenizer was found (the check
        command says)."""
        self.vision_folder = vision_folder
        text, vq = model.config.text_config, model.config.vq_config
        as_trained(tokenizer.tok)
        self.ids = {
            name: tokenizer.id(name) for name in (BOS, BOI, WRAPPER, EOL, EOF, EOI, EOS, PAD)
        }
        self.visual = visual_tokens(
            model.model.vocabulary_mapping.img2bpe, vq.codebook_size, tokenizer
        )
        self.factor, self.max_positions = (
            2 ** (len(vq.channel_multiplier) - 1),
            text.max_position_embeddings,
        )
        super().__init__(
            model,
            model.model.text_model,
            text,
            self._grid(ratio, image_area),
            self.ids[PAD],
            device,
        )
        self.image_decoder = model.model.vqmodel.float()  # decode in fp32
        self.tokenizer, self.quality_suffix = tokenizer, quality_suffix
        self.pixel_mean, self.pixel_std = pixel_mean, pixel_std

    def _grid(self, ratio: str, image_area: int, asked: str = "") -> TokenLayout:
        """Set the token grid (and the prompt's size string) for an aspect ratio and pixel area."""
        self.height, self.width = token_grid(
            ratio, image_area, self.factor, self.max_positions, asked
        )
        self.image_prefix = f"{BOI}{self.height}*{self.width}{WRAPPER}"
        return TokenLayout.raster(
            self.visual,
            self.height,
            self.width,
            row_end=self.ids[EOL],
            suffix=[self.ids[EOF], self.ids[EOI], self.ids[EOS]],
        )

    def size_to(self, width: int, height: int) -> TokenLayout:
        """About width x height pixels: Emu3 takes any aspect ratio, rounded to its 8 px tokens."""
        if width <= 0 or height <= 0:
            raise ValueError(
                f"{width}x{height} px: give a positive width and height (0 for both: the default size)"
            )
        return self._grid(f"{width}:{height}", width * height, f"{width}x{height} px")

    @property
    def default_sampling(self) -> SamplingSettings:
        return SAMPLING

    def prompt_ids(
        self, conditions: Sequence, negatives: Sequence | None, cfg: bool
    ) -> list[list[int]]:
        rows = [self._encode(c + self.quality_suffix) for c in self._texts(conditions)]
        if cfg:
            rows += [
                self._encode(n)
                for n in self._texts(negatives or [NEGATIVE_PROMPT] * len(conditions))
            ]
        return rows

    @staticmethod
    def _texts(prompts: Sequence) -> list[str]:
        for p in prompts:
            if not isinstance(p, str):
                raise ValueError(f"Emu3 needs a text prompt, got {p!r}")
        return list(prompts)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(f"{BOS}{text}{self.image_prefix}")

    def head(self, hidden: Tensor) -> Tensor:
        return self.model.lm_head(hidden)

    def codebook(self) -> Tensor:
        """The VQ-VAE codebook [32768, 4], row c = visual token c (the decoder does not normalise
        it)."""
        return self.model.model.vqmodel.quantize.embedding.weight.float()

    @torch.no_grad()
    def decode_image(self, codes: Tensor, pixels=None) -> Tensor:
        # [B, 3, H, W]
        pixels = self.image_decoder.decode(codes.to(weights_device(self.image_decoder)))
        return to_image(pixels, self.pixel_mean, self.pixel_std)


def visual_tokens(img2bpe: dict[int, int], codebook_size: int, tokenizer: TextTokenizer) -> Tensor:
    """[K] vocabulary id of <|visual token c|> at index c: the engine's local id is the codebook
    index."""
    missing = [c for c in range(codebook_size) if c not in img2bpe]
    if missing:
        raise CheckpointError(
            f"{tokenizer.path}: the vocabulary lacks <|visual token {missing[0]:06d}|> and "
            f"{len(missing) - 1} more of the {codebook_size} visual tokens; "
            f"re-download {tokenizer.repo}"
        )
    return torch.tensor([img2bpe[c] for c in range(codebook_size)], dtype=torch.long)


def as_trained(tok) -> None:
    """Give a byte-level BPE tokenizers.Tokenizer upstream's text pipeline (NFC, PATTERN, then
    bytes)."""
    from tokenizers import Regex, normalizers, pre_tokenizers

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


def pixel_stats(folder: str) -> dict:
    """How the VQ-VAE's pixels were normalised, from a preprocessor_config.json if the folder has
    one."""
    path = os.path.join(folder, "preprocessor_config.json")
    if not os.path.isfile(path):
        return {}
    config = read_json(path)
    return {
        ours: config[theirs]
        for ours, theirs in (("pixel_mean", "image_mean"), ("pixel_std", "image_std"))
        if theirs in config
    }


def load_converted(folder: str, device="cpu", dtype=torch.float32, **options) -> Emu3Adapter:
    """The converted release (BAAI/Emu3-Gen-hf); the original one: original.py.
    options: ratio ("W:H"), image_area (pixels), quality_suffix (appended to every prompt)."""
    from transformers import Emu3ForConditionalGeneration

    model = load_pretrained(Emu3ForConditionalGeneration, folder, REPO, dtype)
    return Emu3Adapter(
        model, TextTokenizer(folder, REPO), device=device, **pixel_stats(folder), **options
    )
