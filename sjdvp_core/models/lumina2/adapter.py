"""Lumina-mGPT 2.0 (Xin et al. 2025, github.com/Alpha-VLLM/Lumina-mGPT-2.0) through transformers.

A 7B Chameleon-architecture model trained from scratch, run through transformers' Chameleon classes
from the released Alpha-VLLM/Lumina-mGPT-2.0 folder, with Sber AI's MoVQGAN-270M (movqgan.py) for
the pixels. It keeps 1.0's prompt and guidance branch (lumina/adapter.py); what differs, read from
upstream's code: a Qwen tokenizer with Lumina's special tokens added, image code c at vocabulary id
155000 + c, rows of an f8 grid, upstream's sampling. Each difference and its upstream source:
docs/families.md, "Lumina-mGPT 2.0". Edits (Lumina-mGPT 2.0 Omni's) complete a dual panel whose upper
half is the reference: docs/editing.md."""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any

import torch
from torch import Tensor

from ...engine.adapter import Edit, PixelSettings
from ...engine.settings import SamplingSettings
from ..checkpoint import CheckpointError, read_json
from ..hf_adapter import TextTokenizer, check_folder, load_pretrained, to_image
from ..images import KeptForEdits, check_reference, pil_image, signed_pixels
from ..lumina.adapter import (
    END_OF_TURN,
    GRID,
    IMAGE_END,
    IMAGE_START,
    ROW_END,
    LuminaAdapter,
    expand_qk_norm,
    resolution_token,
)
from ..placement import moved_in, weights_device
from .movqgan import MoVQEncoder, MoVQGAN, find_movqgan, load_movqgan

log = logging.getLogger(__name__)
REPO = "Alpha-VLLM/Lumina-mGPT-2.0"
MOVQGAN_FILE, MOVQGAN_REPO = "movqgan_270M.ckpt", "ai-forever/MoVQGAN"
IMAGE_BASE = 155000  # vocabulary id of image code 0 (upstream's get_image_token)
SAMPLING = SamplingSettings(cfg_scale=4.0, top_k=4096)
DEFAULT_SIZE = 768  # the release's size (README, generate.py's examples)
# Omni's image-to-image request (generate_examples/generate.py): the reference fills the upper half
DUAL = (
    "Generate a dual-panel image of {w}x{h} where the <upper half> displays a <{shown}>, while the "
    "<lower half> retains the original image for direct visual comparison:\n{prompt}"
)
SHOWN = "|"  # an edit's prompt: what the reference shows, SHOWN, the picture to make


class Lumina2Adapter(LuminaAdapter):
    family = "Lumina-mGPT 2.0"
    patch = 8  # MoVQGAN is f8
    takes_images = True

    def __init__(
        self,
        model,
        tokenizer: TextTokenizer,
        movq: MoVQGAN,
        bos: int,
        *,
        encoder: MoVQEncoder | None = None,
        listed: str = "",
        width: int | None = None,
        height: int | None = None,
        device="cpu",
    ):
        self.tokenizer, self.bos, self.listed = tokenizer, bos, listed
        # kept in CPU memory, apart from `module`: moved in for an edit's prefill
        self.reference_encoder = encoder
        self.sources = KeptForEdits()  # references' codes, kept for the pixels (decode_image)
        self.image_tokens = torch.arange(IMAGE_BASE, IMAGE_BASE + movq.config.n_embed)
        self.positions = model.config.max_position_embeddings
        size = self.default_size()
        self.movq = self.attach(model, movq, width or size, height or size, bos, device)

    def default_size(self) -> int:
        """768 px square (the release's), or the largest square below it that fits the model's
        positions."""
        size = DEFAULT_SIZE
        while size > GRID and self.needed(size, size) > self.positions:
            size -= GRID
        return size

    def facts(self):
        n = len(self.image_tokens)
        return [
            (
                "default image",
                f"{self.width} x {self.height} px: {self.layout.length} generated tokens per row "
                f"of {self.positions} positions",
                True,
            ),
            ("image start + resolution tokens", str(self.token_names(self.image_prefix)), True),
            (
                "row end, image end",
                str(
                    self.token_names(
                        [
                            int(self.layout.forced[self.width // self.patch]),
                            int(self.layout.forced[-1]),
                        ]
                    )
                ),
                True,
            ),
            (
                "image ids",
                f"codes 0..{n - 1} are ids {IMAGE_BASE}..{IMAGE_BASE + n - 1}, "
                f"{self.listed or 'none of them a tokenizer entry'}; the model's vocabulary has "
                f"{self.text_config.vocab_size}",
                True,
            ),
            ("BOS", str(self.token_names([self.bos])), True),
            (
                "edits",
                "MoVQGAN's encoder found: reference images can be read"
                if self.reference_encoder is not None
                else "the MoVQGAN checkpoint holds no encoder: text to image only",
                True,
            ),
        ]

    @property
    def default_sampling(self) -> SamplingSettings:
        return SAMPLING

    def check_size(self, width: int, height: int) -> None:
        """Multiples of 32 px whose sequence (prompt template, image prefix, image) fits the
        positions."""
        if width < GRID or height < GRID or width % GRID or height % GRID:
            raise ValueError(
                f"{width}x{height} px: Lumina-mGPT 2.0 generates multiples of {GRID} px "
                f"(its resolution tokens count {GRID} px grids)"
            )
        if self.needed(width, height) > self.positions:
            raise ValueError(
                f"{width}x{height} px needs {self.image_length(width, height)} image tokens per row; "
                f"Lumina-mGPT 2.0 has {self.positions} positions for prompt and image. The largest that "
                f"fit: {self.largest(width, height)} at this aspect ratio, "
                f"{self.largest(GRID, GRID)} square"
            )

    def image_length(self, width: int, height: int) -> int:
        rows, cols = height // self.patch, width // self.patch
        return rows * (cols + 1) + 1

    def needed(self, width: int, height: int) -> int:
        """Positions per row at this size with an empty prompt: the template, the image prefix,
        the image."""
        return len(self._encode_at("", width, height)) + 3 + self.image_length(width, height)

    def largest(self, width: int, height: int) -> str:
        """The largest size at width:height (in whole grids) whose sequence fits."""
        g = math.gcd(width // GRID, height // GRID)
        w, h = width // GRID // g, height // GRID // g
        k = 1
        while self.needed((k + 1) * w * GRID, (k + 1) * h * GRID) <= self.positions:
            k += 1
        fits = self.needed(k * w * GRID, k * h * GRID) <= self.positions
        return f"{k * w * GRID}x{k * h * GRID}" if fits else "none"

    # --- edits: a dual panel whose upper half is the reference (Lumina-mGPT 2.0 Omni) ---------------
    def _encode(self, condition) -> list[int]:
        if not isinstance(condition, Edit):
            return super()._encode(condition)
        return self._dual_request(condition) + self._reference_rows(self.reference_codes(condition))

    def prompt_ids(self, conditions, negatives, cfg: bool) -> list[list[int]]:
        """As 1.0's, but an edit's guidance branch keeps its reference: upstream's unconditional row
        is the sequence from the image start on."""
        rows = super().prompt_ids(conditions, negatives, False)
        if not cfg:
            return rows
        return rows + [
            rows[b][-self._reference_length() - 3 :]
            if isinstance(c, Edit)
            else list(self.image_prefix)
            for b, c in enumerate(conditions)
        ]

    def prompt_length(self, conditions, negatives, cfg: bool) -> int | None:
        """Counted without encoding the references (a memory estimate runs first)."""
        if conditions is None:
            return None
        lengths = [
            len(self._dual_request(c)) + self._reference_length()
            if isinstance(c, Edit)
            else len(self._encode(c))
            for c in conditions
        ]
        return max(map(len, self._with_room([[0] * n for n in lengths])))

    def _dual_request(self, edit: Edit) -> list[int]:
        """BOS, Omni's request for a width x 2 height dual panel, and the panel's image start."""
        if len(edit.images) != 1:
            raise ValueError(
                f"Lumina-mGPT 2.0 edits take one reference image (the upper panel); got "
                f"{len(edit.images)}: connect one image"
            )
        shown, bar, prompt = edit.text.partition(SHOWN)
        if not bar or not shown.strip():
            raise ValueError(
                f"Lumina-mGPT 2.0 edits need what the reference shows, then '{SHOWN}', then the "
                f"picture to make, e.g. 'depth map {SHOWN} a cabin in the snow' (Omni's tasks: "
                "depth map, canny edge map, or a few words on the subject)"
            )
        check_reference(edit.images[0], "Lumina-mGPT 2.0", self.patch)
        w, h = self.width, 2 * self.height
        text = DUAL.format(w=w, h=h, shown=shown.strip(), prompt=prompt.strip())
        tok = self.tokenizer
        panel = [tok.id(IMAGE_START), tok.id(resolution_token(h // GRID))]
        return (
            [self.bos]
            + tok.encode(text + END_OF_TURN)
            + panel
            + [tok.id(resolution_token(w // GRID))]
        )

    def _reference_length(self) -> int:
        return (self.height // self.patch) * (self.width // self.patch + 1)

    def _reference_rows(self, codes: Tensor) -> list[int]:
        """The reference's codes [h, w] as the panel's first rows: image ids, each row ended."""
        ids = torch.cat(
            [codes.cpu() + IMAGE_BASE, torch.full((codes.shape[0], 1), self.tokenizer.id(ROW_END))],
            1,
        )
        return ids.flatten().tolist()

    @torch.no_grad()
    def reference_codes(self, edit: Edit, size: tuple[int, int] | None = None) -> Tensor:
        """The reference's MoVQGAN codes [h, w] at this size or `size` (width, height; kept for the
        pixels): centre-cropped to it as upstream's center_crop does, then encoded."""
        width, height = size or (self.width, self.height)
        return self.sources.get(
            edit, lambda: self._encode_reference(edit, width, height), (width, height)
        )

    def _encode_reference(self, edit: Edit, width: int, height: int) -> Tensor:
        if self.reference_encoder is None:
            raise ValueError(
                "this MoVQGAN checkpoint holds no encoder, which edits need to read the reference: "
                f"download {MOVQGAN_FILE} of {MOVQGAN_REPO} again (it has both sides)"
            )
        pixels = signed_pixels(center_crop(pil_image(edit.images[0]), width, height))
        with moved_in(self.reference_encoder, self.device) as encoder:
            return encoder(pixels.to(self.device))[0].cpu()

    @torch.no_grad()
    def decode_image(self, codes: Tensor, pixels: PixelSettings | None = None) -> Tensor:
        """An edit's lower panel is decoded with the reference above it, as upstream decodes the
        whole panel (the decoder's attention and convolutions see both), then cut out."""
        prompts = list(pixels.prompts) if pixels is not None else []
        if not any(isinstance(p, Edit) for p in prompts):
            return super().decode_image(codes)
        decoder, (h, w) = self.image_decoder, codes.shape[1:]
        size = (w * self.patch, h * self.patch)  # the codes' own (this adapter may be another size)
        out = []
        for b in range(codes.shape[0]):
            if not isinstance(prompts[b], Edit):
                out.append(super().decode_image(codes[b : b + 1]))
                continue
            panel = torch.cat([self.reference_codes(prompts[b], size).to(codes.device), codes[b]])
            image = to_image(decoder.decode_code(panel[None].to(weights_device(decoder))))
            out.append(image[:, size[1] :])
        return torch.cat(out)


def center_crop(image, width: int, height: int):
    """A PIL image at width x height as upstream's center_crop makes it: halved (box filter) while
    twice the size, scaled to cover (bicubic), centre cut."""
    from PIL import Image

    while image.width >= 2 * width and image.height >= 2 * height:
        image = image.resize((image.width // 2, image.height // 2), resample=Image.BOX)
    scale = max(width / image.width, height / image.height)
    size = (round(image.width * scale), round(image.height * scale))
    image = image.resize(size, resample=Image.BICUBIC)
    left, top = (image.width - width) // 2, (image.height - height) // 2
    return image.crop((left, top, left + width, top + height))


def check_added_tokens(tokenizer: TextTokenizer, added: list[dict]) -> None:
    """Every added token of tokenizer.json has the id the file gives it once read (the tokenizers
    library renumbers added tokens that leave a gap after the base vocabulary, and says nothing)."""
    moved = [(t["content"], t["id"], tokenizer.tok.token_to_id(t["content"])) for t in added]
    moved = [m for m in moved if m[1] != m[2]]
    if moved:
        shown = ", ".join(
            f"{name} is {want} in the file, {got} as read" for name, want, got in moved[:3]
        )
        raise CheckpointError(
            f"{tokenizer.path}: its special tokens do not keep their ids when read ({shown}"
            f"{' ...' if len(moved) > 3 else ''}); the file is incomplete or not Lumina-mGPT "
            f"2.0's: download tokenizer.json again from {REPO}"
        )


def token_name(value: Any) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, an AddedToken dict, or null."""
    return value.get("content") if isinstance(value, dict) else value


def bos_id(folder: str, tokenizer: TextTokenizer) -> int:
    """As xllmx's Tokenizer takes it: the tokenizer's bos_token, else its eos_token."""
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: missing; download it from {REPO}")
    config = read_json(path)
    name = token_name(config.get("bos_token")) or token_name(config.get("eos_token"))
    if not name:
        raise CheckpointError(
            f"{path}: names neither a bos_token nor an eos_token; download it again from {REPO}"
        )
    return tokenizer.id(name)


def check_image_room(codes: int, vocab_size: int, folder: str) -> None:
    if IMAGE_BASE + codes > vocab_size:
        raise CheckpointError(
            f"{folder}: a vocabulary of {vocab_size} has no room for {codes} image codes from id "
            f"{IMAGE_BASE}; this is not Lumina-mGPT 2.0 with MoVQGAN-270M ({REPO})"
        )


def image_entries(
    tokenizer: TextTokenizer, tokenizer_json: dict, codes: int, vocabulary_map: dict | None
) -> str:
    """What tokenizer.json holds at the image ids 155000 + c, in words; CheckpointError where it is not
    an image.

    The ids are the contract and the names a check: each id is either no entry, or an added token
    named as special tokens are (`<...>`) on one pattern for every code, any number in it
    counting with the code (`<MOVQGAN_17>` at code 17, or at 17 + a fixed offset). A BPE text
    token there, names off the pattern, or a `<MOVQGAN` name (tokenizer or config.json's
    vocabulary map) at another id means the ids moved."""
    image = range(IMAGE_BASE, IMAGE_BASE + codes)
    listed = {
        t["id"]: t["content"] for t in tokenizer_json.get("added_tokens", []) if t["id"] in image
    }
    vocab = tokenizer_json.get("model", {}).get("vocab") or {}
    if isinstance(vocab, list):  # a Unigram model: [piece, score] by id
        vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
    # added may repeat there
    text = {i: name for name, i in vocab.items() if i in image and listed.get(i) != name}
    if text:
        shown = ", ".join(f"{text[i]!r} at {i}" for i in sorted(text)[:3])
        raise CheckpointError(
            f"{tokenizer.path}: ids {IMAGE_BASE}..{image[-1]} are image codes in Lumina-mGPT 2.0, "
            f"but {len(text)} of them are text tokens here ({shown}); use the tokenizer.json of "
            f"{REPO}"
        )
    named = [(t["content"], t["id"]) for t in tokenizer_json.get("added_tokens", [])]
    astray = sorted(
        (i, name)
        for name, i in named + list((vocabulary_map or {}).items())
        if name.startswith("<MOVQGAN") and i not in image
    )
    if astray:
        raise CheckpointError(
            f"{tokenizer.path}: image token {astray[0][1]} is id {astray[0][0]} "
            f"({len(astray)} outside {IMAGE_BASE}..{image[-1]}), where Lumina-mGPT 2.0 puts code c "
            f"at {IMAGE_BASE} + c: the ids moved. Download tokenizer.json and config.json again "
            f"from {REPO}"
        )
    if not listed:
        return ""
    first = min(listed)
    pattern = _name_pattern(listed[first], first - IMAGE_BASE)
    off = [
        (i, name)
        for i, name in sorted(listed.items())
        if pattern is None or _name_pattern(name, i - IMAGE_BASE) != pattern
    ]
    if off:
        shown = ", ".join(f"{name!r} at {i}" for i, name in off[:3])
        raise CheckpointError(
            f"{tokenizer.path}: {len(off)} entries at the image ids {IMAGE_BASE}..{image[-1]} are "
            f"not image tokens ({shown}); the ids moved or the file is not Lumina-mGPT 2.0's: "
            f"download it again from {REPO}"
        )
    return (
        f"{len(listed)} of them listed as image tokens in the tokenizer ({listed[first]} .. "
        f"{listed[max(listed)]})"
        + ("" if len(listed) == codes else f", {codes - len(listed)} not listed")
    )


def _name_pattern(name: str, code: int) -> tuple[str, int | None] | None:
    """(the name with its numbers as #, its last number less the code), or None for a name not
    bracketed as special tokens are."""
    if not (name.startswith("<") and name.endswith(">")):
        return None
    numbers = re.findall(r"\d+", name)
    return re.sub(r"\d+", "#", name), int(numbers[-1]) - code if numbers else None


def find_decoder(folder: str) -> str:
    path = find_movqgan(folder, MOVQGAN_FILE)
    if path is None:
        raise CheckpointError(
            f"{folder}: {MOVQGAN_FILE} missing. Lumina-mGPT 2.0 decodes images with MoVQGAN-270M: "
            f"download {MOVQGAN_FILE} from https://huggingface.co/{MOVQGAN_REPO} into "
            f"{os.path.join(folder, 'movqgan')}"
        )
    return path


def load_lumina2(
    folder: str,
    device="cpu",
    dtype=torch.float32,
    width: int | None = None,
    height: int | None = None,
) -> Lumina2Adapter:
    """width, height: the image size in pixels (default 768 x 768, the release's)."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    check_folder(folder, REPO)  # the cheap checks first: no 16 GB load before a bad file
    tokenizer = TextTokenizer(folder, REPO)
    tokenizer_json = read_json(tokenizer.path)
    check_added_tokens(tokenizer, tokenizer_json.get("added_tokens", []))
    for name in (IMAGE_START, IMAGE_END, ROW_END, resolution_token(1)):
        tokenizer.id(name)
    bos = bos_id(folder, tokenizer)
    decoder = find_decoder(folder)
    movq, encoder = load_movqgan(decoder)
    if movq.config.downsample != Lumina2Adapter.patch:
        raise CheckpointError(
            f"{decoder}: an f{movq.config.downsample} MoVQGAN; Lumina-mGPT 2.0's (270M) is f8"
        )
    try:
        config = ChameleonConfig.from_pretrained(folder, local_files_only=True)
    except Exception as e:  # unreadable or of another version
        raise CheckpointError(
            f"{folder}: config.json cannot be read as a Chameleon config ({type(e).__name__}: "
            f"{e}); download it again from {REPO}"
        ) from e
    check_image_room(movq.config.n_embed, config.vocab_size, folder)
    listed = image_entries(tokenizer, tokenizer_json, movq.config.n_embed, config.vocabulary_map)
    # transformers' Chameleon reads 1.0's image-token names from it; 2.0 has none
    if config.vocabulary_map is None:
        config.vocabulary_map = {}
    model = load_pretrained(
        ChameleonForConditionalGeneration,
        folder,
        REPO,
        dtype,
        optional=("model.vqmodel.",),
        reshape=expand_qk_norm,
        config=config,
    )
    return Lumina2Adapter(
        model,
        tokenizer,
        movq,
        bos,
        encoder=encoder,
        listed=listed,
        width=width,
        height=height,
        device=device,
    )
