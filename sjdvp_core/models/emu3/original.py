"""Emu3 from its original release (BAAI/Emu3-Gen + BAAI/Emu3-VisionTokenizer), no remote code.

Configs, weight names and the tiktoken vocabulary are mapped at load time onto transformers'
Emu3ForConditionalGeneration, so both releases run through the same Emu3Adapter. Our own code; the
mapping follows transformers' convert_emu3_weights_to_hf.py and its TikTokenConverter, checked
against upstream's own modules (github.com/baaivision/Emu3). The files it reads, and what was
checked against which upstream file: docs/families.md, "Emu3"."""

from __future__ import annotations

import base64
import logging
import os
import re

import torch
from torch import Tensor

from ..checkpoint import CheckpointError, config_errors, index_shards, read_json, read_state_dict
from ..hf_adapter import INDEX, TextTokenizer, dtype_kwarg
from .adapter import (
    BOI,
    BOS,
    EOF,
    EOI,
    EOL,
    EOS,
    PAD,
    WRAPPER,
    Emu3Adapter,
    as_trained,
    pixel_stats,
)

REPO, VISION_REPO = "BAAI/Emu3-Gen", "BAAI/Emu3-VisionTokenizer"
MODEL_TYPE, VISION_MODEL_TYPE = "Emu3", "Emu3VisionVQ"
VISION_FOLDER, VISION_SIBLING = "vision_tokenizer", "Emu3-VisionTokenizer"
RANKS_FILE, VISION_TOKENS_FILE = "emu3.tiktoken", "emu3_vision_tokens.txt"
# upstream's special tokens, numbered from the end of the ranks on; emu3_vision_tokens.txt continues
# them
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"<|extra_{i}|>" for i in range(205)]
# upstream's config defaults (a field absent from config.json takes them there too)
LM_DEFAULTS = dict(
    vocab_size=184622,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    hidden_act="silu",
    max_position_embeddings=9216,
    rms_norm_eps=1e-5,
    rope_theta=1e6,
    rope_scaling=None,
    pad_token_id=151643,
    bos_token_id=151849,
    eos_token_id=151850,
    img_token_id=151851,
    boi_token_id=151852,
    eoi_token_id=151853,
    eol_token_id=151846,
    eof_token_id=151847,
    image_area=720 * 720,
)
VQ_DEFAULTS = dict(
    codebook_size=32768,
    embed_dim=4,
    z_channels=4,
    double_z=False,
    in_channels=3,
    out_channels=3,
    temporal_downsample_factor=4,
    ch=256,
    ch_mult=[1, 2, 2, 4],
    num_res_blocks=2,
    attn_resolutions=[3],
)
TEXT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "pad_token_id",
    "bos_token_id",
    "eos_token_id",
)
VQ_FIELDS = {
    "codebook_size": "codebook_size",
    "embed_dim": "embed_dim",
    "z_channels": "latent_channels",
    "double_z": "double_latent",
    "in_channels": "in_channels",
    "out_channels": "out_channels",
    "temporal_downsample_factor": "temporal_downsample_factor",
    "ch": "base_channels",
    "ch_mult": "channel_multiplier",
    "num_res_blocks": "num_res_blocks",
    "attn_resolutions": "attn_resolutions",
}
TOKEN_FIELDS = {
    "pad_token_id": PAD,
    "bos_token_id": BOS,
    "eos_token_id": EOS,
    "img_token_id": WRAPPER,
    "boi_token_id": BOI,
    "eoi_token_id": EOI,
    "eol_token_id": EOL,
    "eof_token_id": EOF,
}
# VQ-VAE weight names, original -> converted, in order (transformers' KEYS_TO_MODIFY_MAPPING for the
# VQ-VAE)
VQ_RENAMES = [
    (r"\.mid\.attn_1\.norm\.", ".mid.attn_norm."),
    (r"\.attn\.(\d+)\.norm\.", r".attn_norms.\1."),
    (r"\.(q|k|v)\.", r".\1_proj."),
    (r"\.proj_out\.", ".out_proj."),
    (r"\.down\.", ".down_block.down."),
    (r"\.up\.", ".up_block.up."),
    (r"\.mid\.", ".middle_block."),
]
log = logging.getLogger(__name__)
# 1x1 convolutions there, linear layers here
ATTENTION_CONV = re.compile(r"\.(q|k|v|proj_out)\.weight$")


def is_original(folder: str) -> bool:
    """An Emu3 folder of the original release (config.json's model_type "Emu3"; converted ones
    say "emu3")."""
    path = os.path.join(folder, "config.json")
    return os.path.isfile(path) and read_json(path).get("model_type") == MODEL_TYPE


def load_original(folder: str, device="cpu", dtype=torch.float32, **options) -> Emu3Adapter:
    """options as emu3.load_converted's; image_area defaults to the config's (the area the
    checkpoint was trained at)."""
    check_files(folder)
    vision = vision_folder(folder)
    with config_errors(os.path.join(folder, "config.json"), REPO):
        lm = original_config(folder)
    with config_errors(os.path.join(vision, "config.json"), VISION_REPO):
        vq = vision_config(vision)
    tokenizer = OriginalTokenizer(folder)
    check_token_ids(lm, tokenizer, folder)
    with config_errors(
        f"{folder} and {vision}: the config.json files", f"{REPO} and {VISION_REPO}"
    ):
        config = hf_config(lm, vq, tokenizer, folder, vision)
    model = build_model(config, lm_state(folder, dtype) | vq_state(vision), folder, vision, dtype)
    options.setdefault("image_area", lm["image_area"])
    return Emu3Adapter(
        model, tokenizer, device=device, vision_folder=vision, **pixel_stats(vision), **options
    )


# --- the files ------------------------------------------------------------------------------------
def check_files(folder: str) -> None:
    """Raise a CheckpointError naming every missing file of the language model's folder."""
    missing = [
        f
        for f in ("config.json", RANKS_FILE, VISION_TOKENS_FILE)
        if not os.path.isfile(os.path.join(folder, f))
    ]
    shards = weight_files(folder)
    missing += [s for s in shards if not os.path.isfile(os.path.join(folder, s))]
    if not shards:
        missing.append(f"the weights ({INDEX} and its model-*-of-*.safetensors shards)")
    if missing:
        raise CheckpointError(
            f"{folder}: missing {', '.join(missing)}. Download every file of the Hugging Face "
            f"repository {REPO} into this folder"
        )


def weight_files(folder: str) -> list[str]:
    """The safetensors files the index names (or the single model.safetensors); [] if there are
    none."""
    index = os.path.join(folder, INDEX)
    if os.path.isfile(index):
        return index_shards(index, REPO)
    return (
        ["model.safetensors"] if os.path.isfile(os.path.join(folder, "model.safetensors")) else []
    )


def vision_folder(folder: str) -> str:
    """The VisionTokenizer's folder: vision_tokenizer/ inside, a sibling named Emu3-VisionTokenizer,
    or else the one sibling folder (any name: people download with --local-dir) whose config.json
    is an Emu3 vision VQ."""
    inside = os.path.join(folder, VISION_FOLDER)
    parent = os.path.dirname(os.path.abspath(folder))
    sibling = os.path.join(parent, VISION_SIBLING)
    candidates = [c for c in (inside, sibling) if os.path.isfile(os.path.join(c, "config.json"))]
    if not candidates:
        found = vision_siblings(folder)
        if len(found) > 1:
            raise CheckpointError(
                f"{folder}: several folders beside it hold an Emu3 vision tokenizer "
                f"({', '.join(found)}); move the one to use into {inside}"
            )
        candidates = [os.path.join(parent, f) for f in found]
    if not candidates:
        raise CheckpointError(
            f"{folder}: no Emu3 vision tokenizer (the VQ-VAE that turns tokens into pixels). "
            f"Download every file of the Hugging Face repository {VISION_REPO} into {inside} "
            f"(or into a folder beside this one, such as {sibling})"
        )
    vision = candidates[0]
    if not vq_weights(vision):
        raise CheckpointError(
            f"{vision}: missing model.safetensors. Download every file of the Hugging Face "
            f"repository {VISION_REPO} into this folder"
        )
    log.info("%s: using the Emu3 vision tokenizer in %s", folder, vision)
    return vision


def vision_siblings(folder: str) -> list[str]:
    """Names of the folders beside folder whose config.json says model_type Emu3VisionVQ."""
    parent, own = (
        os.path.dirname(os.path.abspath(folder)),
        os.path.basename(os.path.abspath(folder)),
    )
    found = []
    for name in sorted(os.listdir(parent)):
        config = os.path.join(parent, name, "config.json")
        if name == own or not os.path.isfile(config):
            continue
        try:
            if read_json(config).get("model_type") == VISION_MODEL_TYPE:
                found.append(name)
        except (OSError, ValueError, AttributeError):
            continue  # another model's unreadable config: not ours to judge
    return found


def vq_weights(vision: str) -> str | None:
    """The VQ-VAE's weight file (model.safetensors as released, or a pytorch_model.bin)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if os.path.isfile(os.path.join(vision, name)):
            return os.path.join(vision, name)
    return None


def original_config(folder: str) -> dict:
    config = {**LM_DEFAULTS, **read_json(os.path.join(folder, "config.json"))}
    if config["num_key_value_heads"] is None:  # upstream's rule: no grouping
        config["num_key_value_heads"] = config["num_attention_heads"]
    if config["rope_scaling"] is not None:
        raise CheckpointError(
            f"{folder}: config.json asks for rope_scaling {config['rope_scaling']}, which no Emu3 "
            f"release uses; download {REPO} again"
        )
    return config


def vision_config(vision: str) -> dict:
    config = read_json(os.path.join(vision, "config.json"))
    if config.get("model_type") != VISION_MODEL_TYPE:
        raise CheckpointError(
            f"{vision}: config.json is model_type {config.get('model_type')!r}, not the Emu3 vision "
            f"tokenizer ({VISION_MODEL_TYPE!r}); download {VISION_REPO} into this folder"
        )
    return {**VQ_DEFAULTS, **config}


# --- the vocabulary -------------------------------------------------------------------------------
class OriginalTokenizer(TextTokenizer):
    """emu3.tiktoken (base64 token and rank per line) and emu3_vision_tokens.txt as a byte-level BPE
    of the tokenizers library, with the ids of upstream's Emu3Tokenizer: ranks are ids, then
    SPECIALS and the vision tokens follow in file order. Merges come from the ranks as
    TikTokenConverter derives them."""

    def __init__(self, folder: str):
        from tokenizers import AddedToken, Tokenizer, models

        self.path, self.repo = os.path.join(folder, VISION_TOKENS_FILE), REPO
        ranks = read_ranks(os.path.join(folder, RANKS_FILE))
        self.specials = specials = SPECIALS + read_lines(self.path)
        chars = byte_chars()
        vocab = {"".join(chars[b] for b in token): rank for token, rank in ranks.items()}
        vocab |= {name: len(ranks) + i for i, name in enumerate(specials)}
        if len(vocab) != len(ranks) + len(specials):
            raise CheckpointError(
                f"{folder}: {VISION_TOKENS_FILE} repeats a token of {RANKS_FILE} or of itself; "
                f"download both again from {REPO}"
            )
        merges = [
            ("".join(chars[b] for b in left), "".join(chars[b] for b in right))
            for left, right in merges_of(ranks)
        ]
        self.tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
        self.tok.add_special_tokens(
            [AddedToken(name, special=True, normalized=False) for name in specials]
        )
        as_trained(self.tok)

    def vocabulary_map(self) -> dict[str, int]:
        """The special and vision tokens by name, <image> standing for <|extra_0|> as in the
        converted config."""
        names = {name: self.tok.token_to_id(name) for name in self.specials}
        return names | {"<image>": names["<|extra_0|>"]}

    def id(self, name: str) -> int:
        token = self.tok.token_to_id(name)
        if token is None:
            raise CheckpointError(
                f"{self.path}: has no token {name!r}; download it again from {REPO}"
            )
        return token


def read_ranks(path: str) -> dict[bytes, int]:
    """upstream's _load_tiktoken_bpe, with errors that say what to do; ranks must be 0..n-1."""
    ranks, number = {}, 0
    try:
        with open(path, "rb") as f:
            for number, line in enumerate(f.read().splitlines(), 1):  # noqa: B007 (the error below names it)
                if line:
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
    except (OSError, ValueError) as e:
        raise CheckpointError(
            f"{path}: cannot be read as a tiktoken vocabulary (line {number}: {e}); "
            f"download it again from {REPO}"
        ) from e
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise CheckpointError(
            f"{path}: the ranks are not 0..{len(ranks) - 1} each once; download it again from {REPO}"
        )
    return ranks


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def byte_chars() -> list[str]:
    """GPT-2's printable stand-in for each byte value (the alphabet of byte-level BPE
    vocabularies)."""
    kept = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    spare = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(spare)) for b in range(256)]


def merges_of(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every split of every token into two tokens, by the rank of the token they make, then of the
    parts: a BPE with these merges (and whole pieces looked up first) merges as tiktoken does."""
    found = [
        (rank, ranks[token[:i]], ranks[token[i:]], token[:i], token[i:])
        for token, rank in ranks.items()
        for i in range(1, len(token))
        if token[:i] in ranks and token[i:] in ranks
    ]
    return [(left, right) for *_, left, right in sorted(found)]


def check_token_ids(config: dict, tokenizer: OriginalTokenizer, folder: str) -> None:
    """config.json's token ids must be the vocabulary's: else the two files are of different
    releases."""
    for field, name in TOKEN_FIELDS.items():
        if tokenizer.id(name) != config[field]:
            raise CheckpointError(
                f"{folder}: config.json gives {field}={config[field]}, but {name} is "
                f"{tokenizer.id(name)} in {RANKS_FILE} + {VISION_TOKENS_FILE}; download all "
                f"files of {REPO} again"
            )
    if tokenizer.tok.get_vocab_size() > config["vocab_size"]:
        raise CheckpointError(
            f"{folder}: the vocabulary has {tokenizer.tok.get_vocab_size()} tokens, more than the "
            f"model's vocab_size {config['vocab_size']}; download all files of {REPO} again"
        )


# --- the model ------------------------------------------------------------------------------------
def hf_config(lm: dict, vq: dict, tokenizer: OriginalTokenizer, folder: str, vision: str):
    """transformers' Emu3Config for the original configs (as convert_emu3_weights_to_hf.py builds
    it)."""
    from transformers import Emu3Config

    width = vq["ch"] * vq["ch_mult"][-1]
    if any(vq["ch"] * vq["ch_mult"][level] != width for level in vq["attn_resolutions"]):
        raise CheckpointError(
            f"{vision}: attention at levels {vq['attn_resolutions']} of channels "
            f"{vq['ch_mult']} is not a layout transformers' Emu3VQVAE has; use {VISION_REPO}"
        )
    return Emu3Config(
        text_config={k: lm[k] for k in TEXT_FIELDS},
        vq_config={ours: vq[theirs] for theirs, ours in VQ_FIELDS.items()}
        | dict(hidden_size=width, num_attention_heads=1),
        vocabulary_map=tokenizer.vocabulary_map(),
    )


def lm_state(folder: str, dtype: torch.dtype) -> dict[str, Tensor]:
    """The language model's tensors under the converted release's names (text_model.model.*,
    text_model.lm_head), floats cast to dtype one by one (the original stores float32: 32 GB)."""
    from safetensors import safe_open

    state = {}
    for name in weight_files(folder):
        path = os.path.join(folder, name)
        try:
            with safe_open(path, framework="pt") as f:
                for key in f.keys():
                    tensor = f.get_tensor(key)
                    state["text_model." + key] = (
                        tensor.to(dtype) if tensor.is_floating_point() else tensor
                    )
        except Exception as e:  # safetensors raises its own errors for truncated or foreign files
            raise CheckpointError(
                f"{path}: cannot be read as safetensors ({type(e).__name__}: {e}); download it "
                f"again from {REPO}"
            ) from e
    return state


def vq_state(vision: str) -> dict[str, Tensor]:
    """The VQ-VAE's tensors under the converted names (vqmodel.*), attention 1x1 convolutions as
    matrices."""
    state, _ = read_state_dict(vq_weights(vision), f"the weights of {VISION_REPO}")
    return {
        "vqmodel." + vq_key(key): tensor.flatten(1) if ATTENTION_CONV.search(key) else tensor
        for key, tensor in state.items()
    }


def vq_key(key: str) -> str:
    for pattern, replacement in VQ_RENAMES:
        key = re.sub(pattern, replacement, key)
    return key


def build_model(config, state: dict[str, Tensor], folder: str, vision: str, dtype: torch.dtype):
    """Emu3ForConditionalGeneration from the mapped tensors; each one it needs must be there,
    nothing else."""
    from transformers import Emu3ForConditionalGeneration

    try:
        model, info = Emu3ForConditionalGeneration.from_pretrained(
            None,
            config=config,
            state_dict=state,
            attn_implementation="sdpa",
            output_loading_info=True,
            **dtype_kwarg(dtype),
        )
    except Exception as e:  # shapes that do not fit the config, ...
        raise CheckpointError(
            f"{folder}: cannot be loaded as Emu3ForConditionalGeneration ({type(e).__name__}: "
            f"{e}). Download all files of {REPO} and {VISION_REPO} again"
        ) from e
    for kind in ("missing_keys", "unexpected_keys"):
        keys = sorted(info.get(kind) or [])
        if keys:
            vq = all(k.startswith(("model.vqmodel.", "vqmodel.")) for k in keys)
            where, repo = (vision, VISION_REPO) if vq else (folder, REPO)
            raise CheckpointError(
                f"{where}: the weights {'lack' if kind == 'missing_keys' else 'have unknown'} "
                f"{len(keys)} tensors ({', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}, "
                f"in transformers' names); download the complete {repo}"
            )
    return model.eval()
