"""Lumina-mGPT 1.0 (Liu et al. 2024, github.com/Alpha-VLLM/Lumina-mGPT) through transformers.

A Chameleon-7B fine-tune, run through transformers' Chameleon classes from the released
Alpha-VLLM/Lumina-mGPT-7B-* folders, with Meta's Chameleon VQGAN for the pixels. The prompt is
upstream's conversation with the image's resolution tokens put in it; row ends and the image's end
are forced, every other position is restricted to the 8192 image tokens, and logits come from the
decoder stack and lm_head. The prompt, the guidance branch, what differs from transformers'
Chameleon and upstream's sampling: docs/families.md, "Lumina-mGPT 1.0"."""

from __future__ import annotations

import logging
import os
import re
from typing import Sequence

import torch
from torch import Tensor

from ...engine.adapter import TokenLayout
from ...engine.settings import SamplingSettings
from ..checkpoint import CheckpointError
from ..hf_adapter import (
    HFAdapter,
    SizeChoice,
    TextTokenizer,
    check_folder,
    load_pretrained,
    to_image,
)
from ..placement import weights_device
from .vqgan import ChameleonVQGAN, load_vqgan, vqgan_files

log = logging.getLogger(__name__)
REPO = "Alpha-VLLM/Lumina-mGPT-7B-768 (or -512, -1024)"
BOS, PAD, END_OF_TURN = "<s>", "<pad>", "<reserved08706>"
IMAGE_START, ROW_END, IMAGE_END = "<racm3:break>", "<reserved08799>", "<eoss>"
PROMPT = "Generate an image of {w}x{h} according to the following prompt:\n{prompt}"
# upstream's text-to-image demos (image top-k)
SAMPLING = SamplingSettings(cfg_scale=4.0, top_k=2000)
GRID = 32  # pixels per resolution-token unit (2 x 2 VQGAN codes)
DIGITS = str.maketrans("ABCDEFGHIJ", "0123456789")  # image token names spell the code with letters
DEFAULT_TRAINED = 768  # the main release
# Meta's tokenizer/ folder copied into the model folder, or its files there
VQGAN_PLACES = (
    "tokenizer",
    "",
)


def resolution_token(grids: int) -> str:
    return f"<reserved{8800 + grids:05d}>"


def trained_size(folder: str) -> int | None:
    """The released folders are named by their training size (Lumina-mGPT-7B-768, -768-Omni, ...): a
    number that is a multiple of 32 at the end of a name part; None when the name carries none."""
    name = os.path.basename(os.path.normpath(folder))
    sizes = [
        int(s)
        for s in re.findall(r"(?<![\dA-Za-z])(\d{2,4})(?![\dA-Za-z])", name)
        if int(s) % GRID == 0
    ]
    return sizes[-1] if sizes else None


def supported_sizes(trained: int, max_ratio: float = 4.0) -> list[tuple[int, int]]:
    """(width, height) pairs Lumina-mGPT trains on at `trained` px: grids of 32 px patches on the
    boundary of trained² pixels, aspect ratio at most 4 (upstream's crop-size list)."""
    budget, sizes = (trained // GRID) ** 2, []
    wp, hp = budget, 1
    while wp > 0:  # walk the boundary wp * hp <= budget from wide to tall
        if max(wp, hp) / min(wp, hp) <= max_ratio:
            sizes.append((wp * GRID, hp * GRID))
        if (hp + 1) * wp <= budget:
            hp += 1
        else:
            wp -= 1
    return sizes


class LuminaAdapter(SizeChoice, HFAdapter):
    """Lumina-mGPT's prompt, image prefix and image-only guidance branch around a Chameleon stack;
    the image codes' vocabulary ids, the image decoder and the sizes allowed are the release's
    own (1.0 here; 2.0 in lumina2.py)."""

    family = "Lumina-mGPT"
    patch = 16  # pixels per image code: Meta's VQGAN is f16

    def facts(self):
        return [
            (
                "trained size",
                f"{self.trained} px; default image {self.width} x {self.height}",
                True,
            ),
            ("image start + resolution tokens", str(self.token_names(self.image_prefix)), True),
            (
                "codes 0, 1, 2 are tokens",
                str(self.token_names(self.image_tokens[:3].tolist())),
                True,
            ),
        ]

    def __init__(
        self,
        model,
        tokenizer: TextTokenizer,
        vqgan: ChameleonVQGAN,
        *,
        width: int | None = None,
        height: int | None = None,
        trained: int = DEFAULT_TRAINED,
        device="cpu",
    ):
        self.tokenizer, self.trained, self.bos = tokenizer, trained, tokenizer.id(BOS)
        self.image_tokens = image_token_ids(tokenizer, vqgan)
        self.vqgan = self.attach(
            model, vqgan, width or trained, height or trained, tokenizer.id(PAD), device
        )

    def attach(self, model, decoder: torch.nn.Module, width: int, height: int, pad_id: int, device):
        """Wrap the Chameleon stack at width x height; returns the image decoder, in fp32 on
        `device`. transformers' VQ encoder (model.model.vqmodel) goes: generation never encodes,
        and Lumina may not ship it."""
        layout = self.size_to(width, height)
        model.model.vqmodel = None
        HFAdapter.__init__(self, model, model.model, model.config, layout, pad_id, device)
        self.image_decoder = decoder.to(device, torch.float32)
        self.module = torch.nn.ModuleDict({"model": model, "vqgan": self.image_decoder})
        self._codebook: Tensor | None = None
        return self.image_decoder

    def check_size(self, width: int, height: int) -> None:
        """Only sizes Lumina-mGPT 1.0 trained on."""
        if (width, height) not in supported_sizes(self.trained):
            sizes = ", ".join(f"{w}x{h}" for w, h in supported_sizes(self.trained))
            raise ValueError(
                f"{width}x{height} px is not a size Lumina-mGPT trained at {self.trained} px "
                f"generates; choose one of {sizes}"
            )

    def size_to(self, width: int, height: int) -> TokenLayout:
        """Set the image size (and the prompt's resolution tokens, in 32 px grids)."""
        self.check_size(width, height)
        self.width, self.height = width, height
        tok = self.tokenizer
        self.image_prefix = [
            tok.id(IMAGE_START),
            tok.id(resolution_token(height // GRID)),
            tok.id(resolution_token(width // GRID)),
        ]
        return TokenLayout.raster(
            self.image_tokens,
            height // self.patch,
            width // self.patch,
            row_end=tok.id(ROW_END),
            suffix=[tok.id(IMAGE_END)],
        )

    @property
    def default_sampling(self) -> SamplingSettings:
        return SAMPLING

    def prompt_ids(
        self, conditions: Sequence, negatives: Sequence | None, cfg: bool
    ) -> list[list[int]]:
        if negatives is not None:
            raise ValueError(
                f"{self.family}'s guidance branch sees only the image, never text (as upstream); "
                "leave the negative prompt empty"
            )
        rows = [self._encode(c) for c in conditions]
        return rows + [list(self.image_prefix)] * (len(conditions) if cfg else 0)

    def _encode(self, prompt) -> list[int]:
        if not isinstance(prompt, str):
            raise ValueError(f"{self.family} needs a text prompt, got {prompt!r}")
        return self._encode_at(prompt, self.width, self.height) + self.image_prefix

    def _encode_at(self, prompt: str, width: int, height: int) -> list[int]:
        """BOS and upstream's text-to-image request at this size, closed by the end of turn."""
        return [self.bos] + self.tokenizer.encode(
            PROMPT.format(w=width, h=height, prompt=prompt) + END_OF_TURN
        )

    def head(self, hidden: Tensor) -> Tensor:
        return self.model.lm_head(hidden)

    def codebook(self) -> Tensor:
        """The image decoder's codebook [K, d] in code order (= the engine's local image ids),
        once per device."""
        weight = self.image_decoder.codebook()
        if self._codebook is None or self._codebook.device != weight.device:
            self._codebook = weight.detach().float()
        return self._codebook

    @torch.no_grad()
    def decode_image(self, codes: Tensor, pixels=None) -> Tensor:
        return to_image(
            self.image_decoder.decode_code(codes.to(weights_device(self.image_decoder)))
        )


def image_token_ids(tokenizer: TextTokenizer, vqgan: ChameleonVQGAN) -> Tensor:
    """[K] vocabulary id of codebook entry c at index c. Chameleon names image tokens IMGIMG + the
    code's digits as letters A-J + one more letter (IMGIMGBCZ is code 12), as its
    VocabTranslation reads them."""
    by_code = {}
    for name, i in tokenizer.tok.get_vocab().items():
        digits = name[len("IMGIMG") : -1].translate(DIGITS)
        if name.startswith("IMGIMG") and digits.isdigit():
            by_code[int(digits)] = i
    n, f = vqgan.config.n_embed, vqgan.config.downsample
    if sorted(by_code) != list(range(n)) or f != 16:
        raise CheckpointError(
            f"{tokenizer.path}: its {len(by_code)} IMGIMG image tokens do not fit the VQGAN ({n} "
            f"codes, f{f}); Lumina-mGPT needs Meta's Chameleon VQGAN (8192 codes, f16): use the "
            f"vqgan.yaml and vqgan.ckpt of Meta's Chameleon release"
        )
    return torch.tensor([by_code[c] for c in range(n)], dtype=torch.long)


def expand_qk_norm(key: str, stored: Tensor, shape: torch.Size) -> Tensor | None:
    """Lumina's Chameleon code keeps the q/k LayerNorm parameters per model-parallel shard, [mp, D],
    and repeats each over its shard's heads at run time; transformers stores them per head, [H,
    D]."""
    if (
        re.search(r"self_attn\.[qk]_norm\.(weight|bias)$", key)
        and stored.dim() == 2
        and stored.shape[1] == shape[1]
        and shape[0] % stored.shape[0] == 0
    ):
        return stored.repeat_interleave(shape[0] // stored.shape[0], dim=0)
    return None


def find_vqgan(folder: str) -> str:
    """The folder holding vqgan.yaml + vqgan.ckpt: <model>/tokenizer/ (Meta's tokenizer folder
    copied in) or the model folder itself. When neither has them, load_vqgan's message names
    <model>/tokenizer/."""
    for place in VQGAN_PLACES:
        where = os.path.join(folder, place) if place else folder
        if None not in vqgan_files(where):
            return where
    return os.path.join(folder, VQGAN_PLACES[0])


def load_lumina(
    folder: str,
    device="cpu",
    dtype=torch.float32,
    width: int | None = None,
    height: int | None = None,
    trained: int | None = None,
) -> LuminaAdapter:
    """width, height: the image size in pixels (default: the trained size). trained: the size the
    model was trained at (512, 768 or 1024; nothing in its files says so): given, or read from
    the folder's name as released, else 768 with a warning, since a wrong one gives the model
    prompts it never saw."""
    from transformers import ChameleonForConditionalGeneration

    if trained is not None and (trained <= 0 or trained % GRID):
        raise ValueError(
            f"trained={trained}: Lumina-mGPT was trained at 512, 768 or 1024 px (a multiple of {GRID})"
        )
    check_folder(folder, REPO)  # the cheap checks first: no 14 GB load before a missing file
    tokenizer = TextTokenizer(folder, REPO)
    if not any(name.startswith("IMGIMG") for name in tokenizer.tok.get_vocab()):
        raise CheckpointError(
            f"{folder}: a Chameleon-architecture model without Chameleon's IMGIMG image tokens, "
            "so not Lumina-mGPT 1.0. A Lumina-mGPT 2.0 folder (config.json and tokenizer.json of "
            "Alpha-VLLM/Lumina-mGPT-2.0) is recognised by its vocabulary and loads as its own family"
        )
    vqgan = load_vqgan(find_vqgan(folder))
    model = load_pretrained(
        ChameleonForConditionalGeneration,
        folder,
        REPO,
        dtype,
        optional=("model.vqmodel.",),
        reshape=expand_qk_norm,
    )
    return LuminaAdapter(
        model,
        tokenizer,
        vqgan,
        width=width,
        height=height,
        trained=trained or _trained_from_name(folder),
        device=device,
    )


def _trained_from_name(folder: str) -> int:
    size = trained_size(folder)
    if size is None:
        size = DEFAULT_TRAINED
        log.warning(
            "%s: the folder's name does not say which size this Lumina-mGPT was trained at; assuming %d. "
            "Name the folder as released (Lumina-mGPT-7B-512, -768 or -1024) or pass trained=<size>",
            folder,
            size,
        )
    return size
