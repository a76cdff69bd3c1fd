"""The model-adapter interface and the token layout an adapter describes.

The engine never knows which family it runs: an adapter prefills the condition (and its CFG twin),
scores windows of tokens, and says which generated positions are image cells, which are forced
structure tokens (row ends, end of image) and which vocabulary ids are image tokens. The engine
works in a compact "local" vocabulary: image tokens first, in codebook order (so local id ==
codebook index, which LANTERN and GSD rely on), then the structure tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch import Tensor

from .settings import SamplingSettings


@dataclass(frozen=True)
class TokenLayout:
    """Where the generated tokens go. Positions count generated tokens from 0."""

    image_tokens: Tensor  # [K] vocabulary id of codebook entry c at index c
    special_tokens: (
        Tensor  # [S] vocabulary ids of forced structure tokens (disjoint from image_tokens)
    )
    forced: Tensor  # [L] vocabulary id forced at each position, -1 where the model chooses
    grid: Tensor  # [h, w] position of each image cell, raster order
    # [h', w'] grids of image tokens generated before the image grid that are not part of the image
    # (GLM-Image's small prior grid, which conditions the large one): drafted, and their cells'
    # neighbours guessed, as the image grid's are
    prior_grids: tuple[Tensor, ...] = ()

    def __post_init__(self):
        L = self.forced.numel()
        for grid in self.grids:
            if grid.numel() == 0 or int(grid.max()) >= L or int(grid.min()) < 0:
                raise ValueError(
                    "TokenLayout: every grid must hold positions inside the generated sequence"
                )
            if bool((self.forced[grid.flatten()] >= 0).any()):
                raise ValueError("TokenLayout: an image cell cannot be a forced position")
        if torch.isin(self.special_tokens, self.image_tokens).any():
            raise ValueError("TokenLayout: special tokens must not be image tokens")
        forced_ids = self.forced[self.forced >= 0]
        if not bool(torch.isin(forced_ids, self.special_tokens).all()):
            raise ValueError("TokenLayout: every forced token must be listed in special_tokens")

    @property
    def length(self) -> int:
        return self.forced.numel()

    @property
    def grids(self) -> tuple[Tensor, ...]:
        """The prior grids, then the image grid."""
        return (*self.prior_grids, self.grid)

    @property
    def jacobi_span(self) -> tuple[int, int]:
        """Positions that may be drafted: the grids. Structure tokens outside them decode as AR."""
        return min(int(g.min()) for g in self.grids), max(int(g.max()) for g in self.grids) + 1

    @classmethod
    def raster(
        cls,
        image_tokens: Tensor,
        height: int,
        width: int,
        *,
        row_end: int | None = None,
        prefix: Sequence[int] = (),
        suffix: Sequence[int] = (),
    ) -> "TokenLayout":
        """The common layout: forced prefix, h rows of w cells (each followed by row_end if given),
        forced suffix."""
        row = width + (row_end is not None)
        forced = (
            [*prefix]
            + ([-1] * width + ([row_end] if row_end is not None else [])) * height
            + [*suffix]
        )
        forced = torch.tensor(forced, dtype=torch.long)
        grid = len(prefix) + torch.arange(height)[:, None] * row + torch.arange(width)[None, :]
        specials = sorted({int(t) for t in forced.tolist() if t >= 0})
        return cls(
            image_tokens.long().cpu(), torch.tensor(specials, dtype=torch.long), forced, grid
        )


Fact = tuple[str, str, bool]  # (what, detail, as expected): a line of the check command's report


@dataclass(frozen=True, eq=False)
class Edit:
    """A condition with reference images, for families that take them (ModelAdapter.takes_images):
    what to draw, and the images it edits or draws from (each [H, W, 3] float in [0, 1], as
    ComfyUI's IMAGE holds them)."""

    text: str
    images: tuple[Tensor, ...]

    def __post_init__(self):
        if len(self.images) == 0:
            raise ValueError(
                "an Edit needs at least one image; give the text alone to draw from text"
            )
        for image in self.images:
            if not isinstance(image, Tensor) or image.dim() != 3 or image.shape[-1] != 3:
                raise ValueError(
                    f"an Edit's images are RGB [H, W, 3] tensors (ComfyUI's IMAGE), got "
                    f"{tuple(image.shape) if isinstance(image, Tensor) else type(image).__name__}"
                )


def edit_batch(conditions: Sequence[Any], family: str, edits: str = "edits of images") -> bool:
    """Whether a batch's conditions are edits (all of them) or text alone (none), for a family that
    decodes one kind a batch; the error that says so for a mixed batch."""
    kinds = {isinstance(c, Edit) for c in conditions}
    if len(kinds) > 1:
        raise ValueError(
            f"{family} decodes a batch either as {edits} or from text alone: connect the images to "
            "every decode of the batch, or to none"
        )
    return kinds == {True}


@dataclass(frozen=True)
class PixelSettings:
    """How a family whose pixels come from a diffusion model (GLM-Image's DiT) draws them from the
    tokens: the prompts it is conditioned on (one per image), its steps and guidance (None: the
    family's defaults), the seed of its noise, and a call after each step (done, total) that may
    raise to stop. A VQ decoder needs none."""

    prompts: Sequence[Any] = ()
    steps: int | None = None
    guidance: float | None = None
    seed: int = 0
    progress: Callable[[int, int], None] | None = None


class ModelAdapter:
    """What a model family implements for the engine, with the optional parts supplied here (so the
    engine and the check command never probe an adapter). Rows R = B, or with CFG 2B (cond rows
    first) or 3B (row_groups)."""

    family: str = "model"  # the family's display name ("Lumina-mGPT", "LlamaGen c2i", ...)
    layout: TokenLayout  # where the generated tokens go, at the current size
    device: torch.device  # where the weights are
    # the family's recommended cfg, top-k, ...
    default_sampling: SamplingSettings = SamplingSettings()
    module: torch.nn.Module  # every weight a decode uses, for a memory manager to move
    # what decode_image needs: part of module (a VQ decoder), or apart from it
    image_decoder: torch.nn.Module
    # the image decoder is a model of its own (GLM-Image's DiT), loaded for the pixels only, after
    # the decode: it is not in `module` nor in a decode's memory, and previews do not use it
    # (preview_image)
    pixels_apart: bool = False
    takes_images: bool = (
        False  # conditions may be Edits (reference images with the text): image-to-image
    )
    trees: bool = False  # forward_tree and adopt are implemented (draft trees can be scored)
    example_condition: Any = "a red fox in the snow"  # what the check command's test forward uses
    precision: str = ""  # how the weights were loaded where a loader chose it (auto: its reasons)
    patch: int = 0  # pixels per image code (its side), where the family knows it
    # what reads an edit's references (encoders), kept in CPU memory apart from `module` and moved
    # to the device for an edit's prefill; None: the family takes no references, or needs no model
    reference_encoder: torch.nn.Module | None = None

    def start(
        self,
        conditions: Sequence[Any],
        negatives: Sequence[Any] | None,
        cfg: bool,
        scratch: int = 0,
    ) -> tuple[TokenLayout, Tensor]:
        """Prefill the condition prefix (and with cfg, the unconditional or negative twin); return
        the layout and the logits [R, V] for generated position 0. scratch: cache entries to keep
        past the sequence for draft-tree branches."""
        raise NotImplementedError

    def row_groups(self, conditions: Sequence[Any] | None, cfg: bool) -> int:
        """Model rows start() runs per image: the condition, with cfg also its unconditional (or
        negative) twin; a family whose edits are guided by the text and the reference apart
        (Janus-4o) runs a third, the text with the reference's understanding alone (cfg_mix)."""
        return 2 if cfg else 1

    def reference_bytes(self, conditions: Sequence[Any] | None) -> int:
        """Memory these conditions' references take while the prompt is prefilled beyond the
        weights (reference_encoder, moved in for them), for memory managers."""
        encoder = self.reference_encoder
        if encoder is None or not any(isinstance(c, Edit) for c in conditions or ()):
            return 0
        return sum(t.numel() * t.element_size() for t in encoder.state_dict().values())

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Score a window: tokens [R, W] placed at generated positions [R, W] (consecutive per row,
        each < layout.length) -> logits [R, W, V]; slot i predicts position positions[:, i] + 1.
        Cache entries at or after a row's first window position are overwritten: that is the
        rollback, so rejected drafts cost nothing to undo."""
        raise NotImplementedError

    def forward_tree(
        self, tokens: Tensor, positions: Tensor, ancestors: Tensor, chain: int
    ) -> Tensor:
        """Score a draft tree: tokens [R, N] at generated positions [R, N] -> logits [R, N, V]. The
        first `chain` nodes are a window as in forward() (written where forward() writes them);
        the others go to scratch entries past the sequence. Node i sees the sequence before
        positions[:, 0] and the nodes j with ancestors[i, j] ([N, N] bool, itself included),
        nothing else (kv_cache.tree_mask)."""
        raise ValueError(
            f"{self.family}: this model adapter cannot score draft trees; set tree width to 1"
        )

    def adopt(self, tokens: Tensor, positions: Tensor, chain: int, nodes: Tensor) -> None:
        """The tree last scored by forward_tree(tokens, positions, ancestors, chain): its nodes [R,
        M] become the cache entries of their positions (the accepted branch); a chain node given
        here is already in place. The tree's inputs come again because a forward may keep no
        state for this: a recorded pass replays without running Python (engine/captured.py)."""
        raise ValueError(
            f"{self.family}: this model adapter cannot score draft trees; set tree width to 1"
        )

    def with_size(self, width: int, height: int) -> "ModelAdapter":
        """The same model generating at width x height pixels (a new adapter sharing the weights),
        for families whose size is a choice; the others generate at one size."""
        h, w = self.layout.grid.shape
        if self.patch and (width, height) == (w * self.patch, h * self.patch):
            return self  # its own size, asked for by name
        own = f"{w * self.patch}x{h * self.patch} px" if self.patch else f"{w}x{h} tokens"
        raise ValueError(f"{self.family} generates at one size ({own}); set width and height to 0")

    def finish(self) -> None:
        """The decode ended (or was aborted): free per-run state such as KV caches."""

    def prompt_length(
        self, conditions: Sequence[Any] | None, negatives: Sequence[Any] | None, cfg: bool
    ) -> int | None:
        """The longest prompt these conditions make, in tokens (None: not known, e.g. no conditions
        given). It raises the error start() would give for conditions the model cannot take, so
        that a decode says so before its slow first steps (a memory estimate, the automatic
        window's first calibration)."""
        return None

    def cache_bytes(
        self, rows: int, scratch: int = 0, prompt: int | None = None, itemsize: int | None = None
    ) -> int:
        """Memory a decode of `rows` rows needs beyond the weights (the KV cache, with `scratch`
        entries for draft trees; prompt: its length where known; itemsize: of the compute dtype,
        default the weights'), for memory managers."""
        return 0

    def forward_bytes(
        self,
        rows: int,
        tokens: int,
        scratch: int = 0,
        prompt: int | None = None,
        itemsize: int | None = None,
        scored: int | None = None,
    ) -> int:
        """Transient memory of one forward of `tokens` per row, `scored` of them (default all) to
        logits (attention scores, mask, activations, logits), for memory managers."""
        return 0

    def blocks(self) -> list[torch.nn.Module]:
        """The transformer blocks, whose linear layers hold most of the weights: what int8 / NF4
        quantisation swaps (models.quantize) and what a device map places block by block (empty:
        none)."""
        return []

    def pixel_blocks(self) -> list[torch.nn.Module]:
        """A pixel model apart's transformer blocks (pixels_apart: GLM-Image's DiT), which int8 /
        NF4 quantise with the generator's (empty: none, or an image decoder that keeps its
        dtype)."""
        return []

    def codebook(self) -> Tensor | None:
        """[K, d] VQ embedding of each image token, in TokenLayout.image_tokens order (None: none
        known; the verifiers that need one say so)."""
        return None

    def decode_image(self, codes: Tensor, pixels: PixelSettings | None = None) -> Tensor:
        """codes [B, h, w] (codebook indices) -> images [B, H, W, 3] float in [0, 1]. pixels: for a
        family whose pixels come from a diffusion model (its prompts are required there); a VQ
        decoder ignores it."""
        raise NotImplementedError

    def preview_image(self, codes: Tensor) -> Tensor:
        """What a live preview shows of codes [B, h, w], as decode_image returns (a family whose
        decoder is too slow to run per preview gives a cheap picture of its tokens)."""
        return self.decode_image(codes)

    def facts(self) -> list[Fact]:
        """The family's tokens and sizes that a wrong tokenizer file or config would silently
        change, for the check command (python -m sjdvp_core.check)."""
        return []


KEEP_SIZE = 0  # at_size's width and height: the model's own size


def at_size(adapter: ModelAdapter, width: int, height: int) -> ModelAdapter:
    """The adapter generating at width x height pixels; KEEP_SIZE for both keeps its size."""
    if not width and not height:
        return adapter
    if not width or not height:
        raise ValueError(
            f"width={width}, height={height}: give both in pixels, or 0 for both (the model's default)"
        )
    return adapter.with_size(width, height)
