"""LlamaGen for the engine: checkpoint loading and the adapter.

Loads the official .pt layouts and safetensors without unpickling objects, reading each config off
the weights; the adapter conditions on a class or caption prefix, doubles the batch for CFG, writes
its cache by position and decodes through the VQ. Which official files load, and where the image
size comes from: docs/families.md, "LlamaGen"."""

from __future__ import annotations

import json
import operator
import os
import re
from functools import lru_cache
from typing import Any, Sequence

import torch
from torch import Tensor

from ...engine.adapter import Edit, ModelAdapter, PixelSettings, TokenLayout, edit_batch
from ...engine.settings import SamplingSettings
from ..checkpoint import WEIGHT_EXT, CheckpointError, load_strict, read_state_dict
from ..images import KeptForEdits, check_reference, pil_image, signed_pixels
from ..kv_cache import ForwardShape, adopt_branch, forward_bytes, kv_bytes, tree_slots
from ..placement import moved_in, weights_device
from .gpt import GPT_SIZES, GPTConfig, LlamaGenGPT, rope_table_2d
from .vq import LlamaGenVQ, VQConfig, VQEncoding

SAMPLING = {
    "c2i": SamplingSettings(cfg_scale=4.0, top_k=2000),  # LlamaGen's own sampling scripts
    "t2i": SamplingSettings(cfg_scale=7.5, top_k=1000),
}
RELEASES = {
    "c2i": "huggingface.co/FoundationVision/LlamaGen",
    "t2i": "huggingface.co/peizesun/llamagen_t2i",
}
_FROM = f"as released at {RELEASES['c2i']} (c2i) and {RELEASES['t2i']} (t2i)"
GPT_HINT = f"a LlamaGen GPT checkpoint (keys like tok_embeddings.weight, layers.0.attention.wqkv.weight; {_FROM})"
VQ_HINT = f"a LlamaGen VQ tokenizer checkpoint (keys like quantize.embedding.weight, decoder.conv_in.weight; {_FROM})"


def gpt_config_from_state(
    state: dict[str, Tensor], meta: dict[str, str], path: str, image_tokens: int | None
) -> GPTConfig:
    if "config" in meta:
        return GPTConfig(**json.loads(meta["config"]))
    if "tok_embeddings.weight" not in state:
        raise CheckpointError(f"{path}: is not {GPT_HINT}")
    vocab, dim = state["tok_embeddings.weight"].shape
    n_layer = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("layers."))
    # heads are not in the weights: released sizes by table, others with LlamaGen's head size of 64
    heads = {(L, d): h for L, h, d in GPT_SIZES.values()}.get((n_layer, dim))
    if heads is None and dim % 64:
        raise CheckpointError(
            f"{path}: a GPT with {n_layer} layers of width {dim} is not a released LlamaGen "
            f"size {sorted(GPT_SIZES)}; save it as .safetensors with a 'config' metadata entry"
        )
    heads = heads or dim // 64
    head_dim = dim // heads
    kv_heads = (state["layers.0.attention.wqkv.weight"].shape[0] // head_dim - heads) // 2
    if "cls_embedding.embedding_table.weight" in state:
        kind = dict(
            model_type="c2i",
            num_classes=state["cls_embedding.embedding_table.weight"].shape[0] - 1,
            cls_token_num=1,
        )
    else:
        kind = dict(
            model_type="t2i",
            caption_dim=state["cls_embedding.cap_proj.fc1.weight"].shape[1],
            cls_token_num=state["cls_embedding.uncond_embedding"].shape[0],
        )
    if image_tokens is None:
        size = re.search(r"_(256|384|512)(?:\D|$)", os.path.basename(path))
        if size is None:
            raise CheckpointError(
                f"{path}: the image size is not in the file name (…_256.pt, …_384.pt, "
                "…_512.pt); rename the file as released or give the image size"
            )
        image_tokens = (int(size.group(1)) // 16) ** 2
    return GPTConfig(
        dim=dim,
        n_layer=n_layer,
        n_head=heads,
        n_kv_head=kv_heads if kv_heads != heads else None,
        vocab_size=vocab,
        block_size=image_tokens,
        ffn_dim=state["layers.0.feed_forward.w1.weight"].shape[0],
        **kind,
    )


def vq_config_from_state(state: dict[str, Tensor], meta: dict[str, str], path: str) -> VQConfig:
    if "config" in meta:
        return VQConfig(**json.loads(meta["config"]))
    if "quantize.embedding.weight" not in state or "decoder.conv_in.weight" not in state:
        raise CheckpointError(f"{path}: is not {VQ_HINT}")
    size, dim = state["quantize.embedding.weight"].shape
    ch = state["decoder.conv_out.weight"].shape[1]
    levels = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("decoder.conv_blocks."))
    mult = [
        state[f"decoder.conv_blocks.{levels - 1 - i}.res.0.conv1.weight"].shape[0] // ch
        for i in range(levels)
    ]
    blocks = 1 + max(
        int(k.split(".")[4]) for k in state if k.startswith("decoder.conv_blocks.0.res.")
    )
    return VQConfig(
        codebook_size=size,
        codebook_embed_dim=dim,
        ch=ch,
        ch_mult=mult,
        z_channels=state["post_quant_conv.weight"].shape[0],
        num_res_blocks=blocks - 1,
    )


def load_gpt(path: str, image_tokens: int | None = None) -> LlamaGenGPT:
    state, meta = read_state_dict(path, GPT_HINT)
    config = gpt_config_from_state(state, meta, path, image_tokens)
    with torch.device("meta"):
        model = LlamaGenGPT(config)
    load_strict(model, state, path, GPT_HINT)
    model.rope = rope_table_2d(config)  # a non-persistent buffer: rebuild it off the meta device
    return model.eval()


def load_vq(path: str, encoder: bool = False) -> LlamaGenVQ:
    """The tokenizer; the encoder weights are dropped unless asked for (decoding needs none)."""
    state, meta = read_state_dict(path, VQ_HINT)
    config = vq_config_from_state(state, meta, path)
    with torch.device("meta"):
        model = LlamaGenVQ(config)
    load_strict(model, state, path, VQ_HINT)
    if not encoder:
        model.encoder = None
    return model.eval()


def is_gpt_file(name: str) -> bool:
    return name.startswith(("c2i_", "t2i_")) and name.endswith(WEIGHT_EXT)


def gpt_files(folder: str) -> list[str]:
    """The LlamaGen GPT checkpoints in a folder."""
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if is_gpt_file(n))


def load_llamagen(path: str, device: torch.device, dtype: torch.dtype) -> "LlamaGenAdapter":
    """The adapter for a LlamaGen folder (or one GPT file in it): the GPT, the tokenizer released
    for its kind, and for t2i the FLAN-T5-XL folder beside them."""
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    gpts = gpt_files(folder) if os.path.isdir(path) else [path]
    if len(gpts) > 1:
        raise CheckpointError(
            f"{folder}: holds several LlamaGen GPT files ({', '.join(map(os.path.basename, gpts))}); "
            "select one file instead of the folder"
        )
    gpt = load_gpt(gpts[0])
    kind = gpt.config.model_type
    vq = load_vq(pick_vq(folder, os.path.basename(gpts[0]), kind), encoder=True)
    text_encoder = None
    if kind == "t2i":
        from .t5_text import T5CaptionEncoder

        text_encoder = T5CaptionEncoder(
            os.path.join(folder, "flan-t5-xl"), device=device, dtype=dtype
        )
    names = imagenet_classes() if kind == "c2i" and gpt.config.num_classes == 1000 else None
    return LlamaGenAdapter(
        gpt, vq, class_names=names, text_encoder=text_encoder, device=device, dtype=dtype
    )


def pick_vq(folder: str, gpt_name: str, kind: str) -> str:
    """The tokenizer file for a GPT of `kind` (c2i / t2i). The c2i and t2i tokenizers share the
    codebook shape, so the wrong one would load and draw wrong images: a tokenizer named for the
    other kind is refused. Among several of the right kind the ds16 one (every released GPT's)
    comes first."""
    other = "t2i" if kind == "c2i" else "c2i"
    names = sorted(
        sorted(n for n in os.listdir(folder) if n.startswith("vq_") and n.endswith(WEIGHT_EXT)),
        key=lambda n: "_ds16" not in n,
    )
    usable = [n for n in names if f"_{kind}" in n or f"_{other}" not in n]
    if usable:
        return os.path.join(folder, usable[0])
    wrong = (
        f"; {', '.join(names)} is the {other} models' tokenizer (same codebook shape, wrong images)"
        if names
        else ""
    )
    raise CheckpointError(
        f"{folder}: no tokenizer for the {kind} model {gpt_name}{wrong}. Download vq_ds16_{kind}.pt "
        f"from {RELEASES[kind]} into this folder"
    )


@lru_cache(maxsize=1)
def imagenet_classes() -> list[str]:
    with open(os.path.join(os.path.dirname(__file__), "imagenet_classes.txt")) as f:
        return [line.strip() for line in f if line.strip()]


class LlamaGenAdapter(ModelAdapter):
    """The engine's view of a LlamaGen GPT + VQ pair. Conditions: class ids or names (c2i, with
    `class_names`), or prompts encoded by `text_encoder` into ([B, T, caption_dim], mask [B, T])
    (t2i). An edit completes its reference: the reference's upper half, tokenised by the VQ's
    encoder (kept apart, in CPU memory), is given; the model draws the lower half (docs/editing.md,
    "Completing a picture")."""

    trees = True

    def __init__(
        self,
        gpt: LlamaGenGPT,
        vq: LlamaGenVQ,
        *,
        class_names: Sequence[str] | None = None,
        class_parser=None,
        text_encoder=None,
        sampling: SamplingSettings | None = None,
        device="cpu",
        dtype=torch.float32,
    ):
        self.gpt = gpt.to(device, dtype)
        self.gpt.rope = self.gpt.rope.float()
        self.vq = vq.to(device, torch.float32)
        self.patch = vq.config.downsample
        parts = {"gpt": self.gpt, "vq": self.vq} | (
            {"text": text_encoder.model} if text_encoder is not None else {}
        )
        self.module = torch.nn.ModuleDict(parts)  # all weights (T5's too), for memory managers
        self.image_decoder = self.vq
        self._codebook: Tensor | None = None
        self.config = gpt.config
        self.sampling = sampling
        self.class_names = list(class_names) if class_names is not None else None
        self.class_parser = class_parser
        self.text_encoder = text_encoder
        grid = self.config.grid
        self.layout = TokenLayout.raster(torch.arange(self.config.vocab_size), grid, grid)
        given = grid // 2  # an edit's rows of its reference, from the top
        self.layouts = {
            False: (self.layout, self.config.cls_token_num),
            True: (
                TokenLayout.raster(torch.arange(self.config.vocab_size), grid - given, grid),
                self.config.cls_token_num + given * grid,
            ),
        }
        self.offset = self.config.cls_token_num  # the GPT position of generated position 0
        # the VQ's encoding side where its file holds it: what an edit reads its reference with
        self.reference_encoder = VQEncoding(vq) if vq.encoder is not None else None
        self.takes_images = self.reference_encoder is not None
        self.sources = KeptForEdits()  # references' codes, kept for the pixels (decode_image)
        if vq.config.codebook_size != self.config.vocab_size:
            raise CheckpointError(
                f"the VQ tokenizer has {vq.config.codebook_size} codes but the GPT expects "
                f"{self.config.vocab_size}; use the tokenizer released with this GPT"
            )

    @property
    def device(self) -> torch.device:
        """Where the output head computes (models.placement.weights_device): the engine's tensors
        live there."""
        return weights_device(self.gpt.output)

    @property
    def family(self) -> str:
        return f"LlamaGen {self.config.model_type}"

    @property
    def default_sampling(self) -> SamplingSettings:
        return self.sampling if self.sampling is not None else SAMPLING[self.config.model_type]

    @property
    def example_condition(self):
        return 0 if self.config.model_type == "c2i" else ModelAdapter.example_condition

    def facts(self):
        c = self.config
        what = (
            f"{c.num_classes} classes"
            if c.model_type == "c2i"
            else f"captions of {c.cls_token_num} T5 tokens"
        )
        return [
            (
                "model",
                f"{c.model_type}, {c.n_layer} layers, width {c.dim}, {what}, codebook {c.vocab_size}",
                True,
            )
        ]

    # --- conditions ----------------------------------------------------------------------------
    def class_id(self, condition: Any) -> int:
        n = self.config.num_classes
        if isinstance(condition, str):
            if self.class_parser is not None:
                return self.class_parser(condition)
            names = [c.lower() for c in (self.class_names or [])]
            key = condition.strip().lower()
            if key.isdigit():
                condition = int(key)
            elif key in names:
                return names.index(key)
            else:
                raise ValueError(
                    f"unknown class {condition!r}: give a class index 0..{n - 1} or a class name"
                )
        try:
            # 3.7 is not class 3
            index = None if isinstance(condition, bool) else operator.index(condition)
        except TypeError:
            index = None
        if index is None:
            raise ValueError(f"class {condition!r}: give a class index 0..{n - 1} or a class name")
        if not 0 <= index < n:
            raise ValueError(f"class {condition} is out of range 0..{n - 1}")
        return index

    def _class_ids(self, conditions: Sequence[Any], negatives) -> list[int] | None:
        """A class-to-image model's class ids for the conditions (None: a text-to-image model), or
        the error that says what to give instead."""
        if negatives is not None:
            raise ValueError(
                "LlamaGen models have no negative prompt (their guidance branch is a learned empty "
                "condition); leave it empty"
            )
        if self.config.model_type != "c2i":
            if self.text_encoder is None:
                raise ValueError(
                    "this LlamaGen text-to-image model needs its FLAN-T5-XL text encoder folder"
                )
            for prompt in conditions:  # T5 would caption None as "none", 3 as "3"
                if not isinstance(prompt, str):
                    raise ValueError(f"{self.family} needs a text prompt, got {prompt!r}")
            return None
        return [self.class_id(x) for x in conditions]

    def _prefix(
        self, conditions: Sequence[Any], negatives, cfg: bool
    ) -> tuple[Tensor, Tensor | None]:
        c = self.config
        ids = self._class_ids(conditions, negatives)
        if ids is not None:
            ids += [c.num_classes] * (len(conditions) if cfg else 0)
            return self.gpt.embed_condition(torch.tensor(ids, device=self.device)), None
        captions, mask = self.text_encoder(list(conditions))  # [B, T, D], [B, T]
        # the encoder may sit elsewhere
        captions, mask = (
            captions.to(self.device),
            mask.to(self.device),
        )
        if cfg:
            uncond = self.gpt.cls_embedding.uncond_embedding.expand_as(captions)
            captions, mask = torch.cat([captions, uncond]), torch.cat([mask, mask])
        dtype = self.gpt.output.weight.dtype
        return self.gpt.embed_condition(captions.to(self.device, dtype)), mask.to(self.device)

    # --- the adapter interface -----------------------------------------------------------------
    def start(self, conditions, negatives, cfg: bool, scratch: int = 0):
        edits = edit_batch(conditions, "LlamaGen", "completions of images")
        texts = [c.text if isinstance(c, Edit) else c for c in conditions]
        prefix, mask = self._prefix(texts, negatives, cfg)
        self.gpt.setup_caches(prefix.shape[0], prefix_valid=mask, scratch=scratch)
        logits = self.gpt.prefill(prefix)
        self.layout, self.offset = self.layouts[edits]
        if not edits:
            return self.layout, logits
        given = torch.stack([self.given_codes(c) for c in conditions]).to(self.device)
        given = torch.cat([given] * (prefix.shape[0] // len(conditions)))  # the CFG rows'
        at = self.config.cls_token_num + torch.arange(given.shape[1], device=self.device)
        return self.layout, self.gpt.decode(given, at.expand_as(given))[:, -1]

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        return self.gpt.decode(tokens, positions + self.offset)

    def forward_tree(
        self, tokens: Tensor, positions: Tensor, ancestors: Tensor, chain: int
    ) -> Tensor:
        at = positions + self.offset
        return self.gpt.decode_tree(tokens, at, tree_slots(at, chain, self.gpt.max_len), ancestors)

    def adopt(self, tokens: Tensor, positions: Tensor, chain: int, nodes: Tensor) -> None:
        adopt_branch(self.gpt.caches(), positions + self.offset, chain, self.gpt.max_len, nodes)

    def finish(self) -> None:
        self.gpt.release_caches()
        self.layout, self.offset = self.layouts[False]

    def reference_grid(self, edit: Edit) -> Tensor:
        """An edit's reference as codes [grid, grid] (kept for the pixels): centre-cropped to a
        square, resized to the model's image size (bicubic), encoded by the VQ's encoder."""
        return self.sources.get(edit, lambda: self._encode_reference(edit))

    @torch.no_grad()
    def _encode_reference(self, edit: Edit) -> Tensor:
        if len(edit.images) != 1:
            raise ValueError(
                f"{self.family} completes one reference image; got {len(edit.images)}: connect one"
            )
        check_reference(edit.images[0], self.family, self.patch)
        from PIL import Image

        picture = pil_image(edit.images[0])
        crop = min(picture.size)
        left, top = (picture.width - crop) // 2, (picture.height - crop) // 2
        side = self.config.grid * self.patch
        picture = picture.crop((left, top, left + crop, top + crop)).resize(
            (side, side), resample=Image.BICUBIC
        )
        with moved_in(self.reference_encoder, self.device) as encoder:
            return encoder(signed_pixels(picture).to(self.device))[0].cpu()

    def given_codes(self, edit: Edit) -> Tensor:
        """The reference's rows an edit keeps: its upper half, flat."""
        grid = self.reference_grid(edit)
        return grid[: grid.shape[0] // 2].flatten()

    def blocks(self) -> list[torch.nn.Module]:
        """The GPT's blocks, then the T5 caption encoder's (t2i)."""
        encoder = (
            list(self.text_encoder.model.encoder.block) if self.text_encoder is not None else []
        )
        return list(self.gpt.layers) + encoder

    def prompt_length(self, conditions, negatives, cfg: bool) -> int:
        if conditions is not None:  # an unknown class is told before anything runs
            self._class_ids([c.text if isinstance(c, Edit) else c for c in conditions], negatives)
        # a fixed prefix: the class token, or the caption's 120 slots
        return self.config.cls_token_num

    def forward_bytes(
        self,
        rows: int,
        tokens: int,
        scratch: int = 0,
        prompt: int | None = None,
        itemsize: int | None = None,
        scored: int | None = None,
    ) -> int:
        c = self.config
        return forward_bytes(
            ForwardShape(c.n_head, c.dim, c.ffn_hidden, c.vocab_size),
            rows,
            tokens,
            self.gpt.max_len + scratch,
            itemsize or self.gpt.output.weight.element_size(),
            tokens if scored is None else scored,
        )

    def cache_bytes(
        self, rows: int, scratch: int = 0, prompt: int | None = None, itemsize: int | None = None
    ) -> int:
        c = self.config
        itemsize = itemsize or self.gpt.output.weight.element_size()
        return kv_bytes(
            c.n_layer, rows, c.kv_heads, self.gpt.max_len + scratch, c.head_dim, itemsize
        )

    def codebook(self) -> Tensor:
        """The l2-normalised codebook (what the decoder looks up), kept per device."""
        if self._codebook is None or self._codebook.device != self.device:
            with torch.no_grad():
                self._codebook = self.vq.quantize.codebook().float()
        return self._codebook

    @torch.no_grad()
    def decode_image(self, codes: Tensor, pixels: PixelSettings | None = None) -> Tensor:
        """codes [B, h, w]; an edit's lower half is decoded under the reference's upper half, and
        the whole picture returned."""
        prompts = list(pixels.prompts) if pixels is not None else []
        if any(isinstance(p, Edit) for p in prompts):
            w = codes.shape[-1]
            given = torch.stack([self.given_codes(p).view(-1, w) for p in prompts])
            codes = torch.cat([given.to(codes.device), codes], 1)
        images = self.vq.decode_code(codes.to(weights_device(self.vq)))
        return ((images.float() + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1).cpu()
