"""What every transformers-backed family shares: loading a converted folder, and the adapter.

Checks and loads a model folder and its tokenizer.json (local files only, never remote code), and
wraps the decoder stack in an engine adapter whose KV cache is written by position behind an
explicit 4D mask, so rollback costs nothing and each row may sit at its own position. How the
cache, the mask and the RoPE positions line up, and the transformers versions it was verified
with: docs/families.md, "The transformers families"."""

from __future__ import annotations

import contextlib
import copy
import inspect
import os
from typing import Callable, Sequence

import torch
from torch import Tensor
from transformers import __version__ as TRANSFORMERS_VERSION
from transformers.cache_utils import Cache

from ..engine.adapter import ModelAdapter, TokenLayout
from .checkpoint import CheckpointError, index_shards, read_json
from .kv_cache import (
    ForwardShape,
    StaticKVCache,
    additive_mask,
    adopt_branch,
    forward_bytes,
    kv_bytes,
    tree_mask,
    tree_slots,
    window_mask,
)
from .optional import require
from .placement import weights_device
from .quantize import adopt_stored, stored_quantisation

INDEX = "model.safetensors.index.json"
PROMPT_ALLOWANCE = 256  # prompt tokens cache_bytes assumes before a prompt is known


# --- the model folder -----------------------------------------------------------------------------
def check_folder(
    folder: str, repo: str, files: Sequence[str] = ("config.json", "tokenizer.json")
) -> None:
    """Raise a CheckpointError naming every missing file (`files`, and the weights and their
    shards)."""
    missing = [f for f in files if not os.path.isfile(os.path.join(folder, f))]
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        missing += [
            s for s in index_shards(index, repo) if not os.path.isfile(os.path.join(folder, s))
        ]
    elif not os.path.isfile(os.path.join(folder, "model.safetensors")):
        missing.append(
            f"the weights (model.safetensors, or {INDEX} and its model-*-of-*.safetensors shards)"
        )
    if missing:
        raise CheckpointError(
            f"{folder}: missing {', '.join(missing)}. Download every file of the Hugging Face "
            f"repository {repo} into this folder"
        )


def load_pretrained(
    model_class,
    folder: str,
    repo: str,
    dtype: torch.dtype,
    optional: Sequence[str] = (),
    reshape: Callable[[str, Tensor, torch.Size], Tensor | None] | None = None,
    config=None,
    files: Sequence[str] = ("config.json", "tokenizer.json"),
):
    """model_class.from_pretrained on a local folder; weights that are missing from the files are an
    error here (transformers would initialise them randomly and only warn), except those under
    the `optional` prefixes (parts a family never runs, which its release may omit or shape
    otherwise). `reshape(key, stored, shape)` is a family's rule for tensors its release stores
    in another shape than transformers' class: the stored tensor in `shape`, or None where the
    rule does not apply. `config`: the folder's config as the family amended it (None:
    config.json as is). `files`: what the folder must hold besides the weights."""
    check_folder(folder, repo, files)
    quantised = stored_quantisation(folder)
    if quantised and not quantised.startswith("bitsandbytes 4-bit"):
        raise CheckpointError(
            f"{folder}: its weights are stored quantised ({quantised}), which this loader does not "
            f"read; use the float release of {repo} (the loader's int8 / nf4 quantise it)"
        )
    if quantised:  # transformers reads stored 4-bit weights with both
        for package in ("bitsandbytes", "accelerate"):
            require(
                package,
                f"{folder} (weights stored {quantised})",
                "or use the float release of " + repo,
            )
    # a mismatch is named below by key and shapes (a 7B config.json beside 1B weights), not by
    # transformers' report, which quiet_transformers hides; stored 4-bit tensors are packed: their
    # shapes are transformers' to check
    name_mismatches = reshape is not None or not quantised
    try:
        # its load report would call parts we skip or reshape "newly initialized"
        with quiet_transformers():
            model, info = model_class.from_pretrained(
                folder,
                local_files_only=True,
                attn_implementation="sdpa",
                output_loading_info=True,
                ignore_mismatched_sizes=name_mismatches,
                **({"config": config} if config is not None else {}),
                **dtype_kwarg(dtype),
            )
    except Exception as e:  # corrupt or truncated files, a config of another version, ...
        raise CheckpointError(
            f"{folder}: cannot be loaded as {model_class.__name__} ({type(e).__name__}: {e}). "
            f"Re-download the files of {repo}"
        ) from e
    missing = sorted(k for k in info.get("missing_keys") or [] if not k.startswith(tuple(optional)))
    if missing:
        raise CheckpointError(
            f"{folder}: the weights lack {len(missing)} tensors of {model_class.__name__} "
            f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}); "
            f"download the complete {repo}"
        )
    params = model.state_dict()
    # key -> the stored shape: transformers 5 lists (key, stored shape, the model's), 4.x the key
    mismatched = {}
    for m in info.get("mismatched_keys") or []:
        key, stored = (m[0], tuple(m[1])) if isinstance(m, tuple) else (m, "another shape")
        mismatched[key] = stored
    for key in sorted(k for k in mismatched if not k.startswith(tuple(optional))):
        shape = params[key].shape
        fixed = None if reshape is None else reshape(key, read_tensor(folder, key), shape)
        if fixed is None or fixed.shape != shape:
            raise CheckpointError(
                f"{folder}: {key} is stored as {mismatched[key]}, {model_class.__name__} "
                f"needs {tuple(shape)} (config.json and the weights are of different models); "
                f"download the complete {repo}"
            )
        with torch.no_grad():
            params[key].copy_(fixed)
    if quantised:
        adopt_stored(model, dtype)
    return model.eval()


@contextlib.contextmanager
def quiet_transformers():
    """transformers logs errors only, for the duration: our loaders check the weights themselves."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def read_tensor(folder: str, key: str) -> Tensor:
    """One tensor from the folder's safetensors (sharded or not)."""
    from safetensors import safe_open

    index = os.path.join(folder, INDEX)
    name = read_json(index)["weight_map"][key] if os.path.isfile(index) else "model.safetensors"
    with safe_open(os.path.join(folder, name), framework="pt") as f:
        return f.get_tensor(key)


def dtype_kwarg(dtype: torch.dtype) -> dict:
    """The dtype argument of from_pretrained / _from_config: `dtype` since 4.56, `torch_dtype`
    before."""
    return {"dtype" if _version() >= (4, 56) else "torch_dtype": dtype}


def _version() -> tuple[int, int]:
    major, minor = TRANSFORMERS_VERSION.split(".")[:2]
    return int(major), int(minor)


class TextTokenizer:
    """tokenizer.json read with the tokenizers library, exactly as saved (transformers' tokenizer
    classes rebuild some pipelines differently across versions). Special tokens are looked up by
    name."""

    def __init__(self, folder: str, repo: str):
        from tokenizers import Tokenizer

        self.path, self.repo = os.path.join(folder, "tokenizer.json"), repo
        try:
            self.tok = Tokenizer.from_file(self.path)
        except Exception as e:  # the tokenizers library raises plain Exceptions
            raise CheckpointError(
                f"{self.path}: cannot be read as a tokenizer ({e}); download it again from {repo}"
            ) from e

    def encode(self, text: str) -> list[int]:
        """Special-token names inside text become their ids; nothing is added around it."""
        return self.tok.encode(text, add_special_tokens=False).ids

    def id(self, name: str) -> int:
        token = self.tok.token_to_id(name)
        if token is None:
            raise CheckpointError(
                f"{self.path}: has no token {name!r}; use the tokenizer.json of {self.repo}"
            )
        return token


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[Tensor, Tensor]:
    """Token lists -> ids [R, P] right-aligned, valid [R, P] (False on the padding)."""
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    valid = torch.zeros(len(prompts), P, dtype=torch.bool)
    for r, p in enumerate(prompts):
        ids[r, P - len(p) :] = torch.tensor(p, dtype=torch.long)
        valid[r, P - len(p) :] = True
    return ids, valid


# --- the cache ------------------------------------------------------------------------------------
class PositionCache(Cache):
    """A transformers Cache whose update() writes each row's new keys/values at `slots` [R, W] (set
    before every forward) and returns the whole buffers: one StaticKVCache per layer (the engine's
    position-written cache), allocated at the layer's first write in the dtype and on the device of
    its keys."""

    is_compileable = False

    def __init__(self, rows: int, max_len: int):
        try:
            super().__init__(layers=[])  # transformers 5.x keeps per-layer objects; ours are below
        except TypeError:
            super().__init__()  # transformers 4.x
        self.rows, self.max_len = rows, max_len
        self.kv: dict[int, StaticKVCache] = {}
        self.slots: Tensor | None = None

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        if layer_idx not in self.kv:
            _, H, _, D = key_states.shape
            self.kv[layer_idx] = StaticKVCache(
                self.rows, H, self.max_len, D, key_states.dtype, key_states.device
            )
        return self.kv[layer_idx].update(self.slots, key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.max_len


def cache_argument(module: torch.nn.Module) -> str:
    """transformers 5.x calls the cache argument `cache` (`past_key_values` is deprecated there);
    4.x only knows `past_key_values`."""
    return "cache" if "cache" in inspect.signature(module.forward).parameters else "past_key_values"


# --- the adapter ----------------------------------------------------------------------------------
class HFAdapter(ModelAdapter):
    """The engine side of a transformers model. A family supplies the layout, its prompts (cond
    rows, then uncond rows), how generated tokens are embedded and how hidden states become
    logits."""

    family = "transformers"
    trees = True
    sequential_positions = (
        True  # generated tokens' positions follow the prompt's one by one (GLM-Image's: its grids)
    )

    def __init__(
        self,
        model: torch.nn.Module,
        lm: torch.nn.Module,
        text_config,
        layout: TokenLayout,
        pad_id: int,
        device="cpu",
    ):
        self.model = model.to(device)
        self.module = model  # every weight, for a memory manager to move
        self.lm, self.text_config, self.layout, self.pad_id = lm, text_config, layout, pad_id
        self._cache_arg = cache_argument(lm)
        self.cache: PositionCache | None = None

    @property
    def device(self) -> torch.device:
        """Where the embeddings compute (models.placement.weights_device): the engine's tensors
        live there."""
        return weights_device(self.lm.get_input_embeddings())

    # --- family hooks -----------------------------------------------------------------------------
    def prompt_ids(
        self, conditions: Sequence, negatives: Sequence | None, cfg: bool
    ) -> list[list[int]]:
        raise NotImplementedError

    def embed(self, tokens: Tensor) -> Tensor:
        """Generated vocabulary ids [R, W] -> input embeddings [R, W, C]."""
        return self.lm.get_input_embeddings()(tokens)

    def head(self, hidden: Tensor) -> Tensor:
        raise NotImplementedError

    def prompt_embeddings(self, ids: Tensor, conditions: Sequence) -> Tensor:
        """The left-padded prompts ids [R, P] of `conditions` -> input embeddings [R, P, C]. A family
        whose references enter as features, not tokens (Janus-4o's), places them here."""
        return self.lm.get_input_embeddings()(ids)

    def prompt_positions(
        self, ids: Tensor, valid: Tensor, conditions: Sequence
    ) -> tuple[Tensor, Tensor]:
        """RoPE positions of the left-padded prompts ids [R, P] (valid: not padding) of `conditions`
        (row r is conditions[r]'s; rows past them are CFG's unconditional ones), and each row's
        position for generated position 0 [R]: the real prompt tokens counted, as transformers'
        own left-padded generation does. A family whose prompts hold images placed in 2-D
        (GLM-Image's edits) returns [3, R, P]."""
        return (valid.cumsum(1) - 1).clamp(min=0), valid.sum(1)

    def rope_positions(self, positions: Tensor) -> Tensor:
        """RoPE positions of generated positions [R, W]: counted on from the row's first
        (prompt_positions). A family whose positions follow its grids (GLM-Image's 3-D ones)
        returns [3, R, W]."""
        return self.prompt_len[:, None] + positions

    # --- the adapter interface --------------------------------------------------------------------
    def start(self, conditions, negatives, cfg: bool, scratch: int = 0):
        rows = self._with_room(self.prompt_ids(conditions, negatives, cfg))
        ids, valid = (t.to(self.device) for t in left_pad(rows, self.pad_id))
        R, P = ids.shape
        S = P + self.layout.length + scratch
        positions, self.prompt_len = self.prompt_positions(ids, valid, conditions)
        self.prefix_len = P
        self.key_valid = torch.ones(R, S, dtype=torch.bool, device=self.device)
        self.key_valid[:, :P] = valid
        self.cache = PositionCache(R, S)
        slots = torch.arange(P, device=self.device).expand(R, -1)
        hidden = self._run(self.prompt_embeddings(ids, conditions), slots, positions)
        return self.layout, self.head(hidden[:, -1]).float().to(self.device)

    def forward(self, tokens: Tensor, positions: Tensor) -> Tensor:
        if self.cache is None:
            raise RuntimeError(f"{self.family}: forward() before start()")
        hidden = self._run(
            self.embed(tokens), self.prefix_len + positions, self.rope_positions(positions)
        )
        return self.head(hidden).float().to(self.device)  # a split model's head may sit elsewhere

    def forward_tree(
        self, tokens: Tensor, positions: Tensor, ancestors: Tensor, chain: int
    ) -> Tensor:
        if self.cache is None:
            raise RuntimeError(f"{self.family}: forward_tree() before start()")
        slots = tree_slots(self.prefix_len + positions, chain, self._scratch)
        mask = tree_mask(slots, ancestors, self.cache.max_len, self.key_valid)
        hidden = self._run(self.embed(tokens), slots, self.rope_positions(positions), mask)
        return self.head(hidden).float().to(self.device)  # a split model's head may sit elsewhere

    def adopt(self, tokens: Tensor, positions: Tensor, chain: int, nodes: Tensor) -> None:
        adopt_branch(
            self.cache.kv.values(), self.prefix_len + positions, chain, self._scratch, nodes
        )

    @property
    def _scratch(self) -> int:
        """The first cache slot past the sequence: where a draft tree's siblings go."""
        return self.prefix_len + self.layout.length

    def _run(
        self, x: Tensor, slots: Tensor, position_ids: Tensor, mask: Tensor | None = None
    ) -> Tensor:
        """Embeddings [R, W, C] written at cache slots [R, W] with RoPE positions [R, W] (or [3, R,
        W]) under mask (causal over the slots unless given) -> hidden [R, W, C]."""
        S = self.cache.max_len
        if mask is None:
            mask = window_mask(slots, S, self.key_valid)  # [R, 1, W, S]
        additive = additive_mask(mask.to(x.device), x.dtype)
        self.cache.slots = slots
        out = self.lm(
            inputs_embeds=x,
            attention_mask=additive,
            position_ids=position_ids,
            use_cache=True,
            **{self._cache_arg: self.cache},
        )
        return out.last_hidden_state

    def finish(self) -> None:
        self.cache = self.key_valid = None

    def token_names(self, ids) -> list[tuple[int, str]]:
        """(id, token) pairs, for the check command's facts."""
        return [(int(i), self.tokenizer.tok.id_to_token(int(i))) for i in ids]

    def blocks(self) -> list[torch.nn.Module]:
        return list(self.lm.layers)

    def prompt_length(self, conditions, negatives, cfg: bool) -> int | None:
        if conditions is None:
            return None
        return max(map(len, self._with_room(self.prompt_ids(conditions, negatives, cfg))))

    def _with_room(self, rows: list[list[int]]) -> list[list[int]]:
        """rows, or the ValueError that says the longest prompt (negative prompts included) leaves
        the image no room within the positions the model was trained on (transformers would run
        past them without a word)."""
        limit, image = (
            getattr(self.text_config, "max_position_embeddings", None),
            self.layout.length,
        )
        longest = max(map(len, rows))
        if self.sequential_positions and limit and longest + image > limit:
            raise ValueError(
                f"the prompt is {longest} tokens; with this image size ({image} image tokens) "
                f"{self.family} has room for {limit - image}. Shorten it (or make the image smaller)"
            )
        return rows

    def forward_bytes(
        self,
        rows: int,
        tokens: int,
        scratch: int = 0,
        prompt: int | None = None,
        itemsize: int | None = None,
        scored: int | None = None,
    ) -> int:
        c = self.text_config
        shape = ForwardShape(
            c.num_attention_heads,
            c.hidden_size,
            c.intermediate_size,
            self.logits_width,
            scores=False,
        )
        return forward_bytes(
            shape,
            rows,
            tokens,
            self._entries(scratch, prompt),
            itemsize or self._itemsize,
            tokens if scored is None else scored,
        )

    @property
    def logits_width(self) -> int:
        """Entries of the logits head() returns."""
        return self.text_config.vocab_size

    def cache_bytes(
        self, rows: int, scratch: int = 0, prompt: int | None = None, itemsize: int | None = None
    ) -> int:
        c = self.text_config
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        return kv_bytes(
            c.num_hidden_layers,
            rows,
            kv_heads,
            self._entries(scratch, prompt),
            head_dim,
            itemsize or self._itemsize,
        )

    @property
    def _itemsize(self) -> int:
        """Of the compute dtype: the embeddings' (kept unquantised)."""
        return self.lm.get_input_embeddings().weight.element_size()

    def _entries(self, scratch: int, prompt: int | None) -> int:
        """Cache slots of a decode: the prompt (PROMPT_ALLOWANCE where not known), the image, the
        scratch."""
        return (PROMPT_ALLOWANCE if prompt is None else prompt) + self.layout.length + scratch


class SizeChoice:
    """For families whose image size is a choice (Lumina-mGPT, Emu3): the same model at another
    size, sharing every weight. A family implements size_to(width, height): it sets this
    adapter's size-dependent prompt parts to that size (it changes the adapter: with_size calls
    it on a copy) and returns the layout."""

    def size_to(self, width: int, height: int) -> TokenLayout:
        raise NotImplementedError

    def with_size(self, width: int, height: int):
        out = copy.copy(self)
        out.layout, out.cache = out.size_to(width, height), None
        return out


def to_image(
    pixels: Tensor, mean: Sequence[float] = (0.5,) * 3, std: Sequence[float] = (0.5,) * 3
) -> Tensor:
    """A VQ decoder's normalised output [B, 3, H, W] -> [B, H, W, 3] in [0, 1] on the CPU."""
    mean = torch.tensor(mean, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(std, device=pixels.device).view(1, 3, 1, 1)
    return (pixels.float() * std + mean).clamp(0, 1).permute(0, 2, 3, 1).cpu()
