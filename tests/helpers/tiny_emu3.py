"""Tiny random Emu3 folders in both layouts the loader takes, for the Emu3 tests, the family
contract, quantisation and the ComfyUI workflow:

- converted, as BAAI/Emu3-Gen-hf is (transformers' Emu3ForConditionalGeneration: config.json with
  the vocabulary map, a byte-level BPE tokenizer.json whose visual tokens are not in code order,
  sharded safetensors with an index, preprocessor_config.json);
- original, as BAAI/Emu3-Gen with BAAI/Emu3-VisionTokenizer are (upstream's config fields, a
  tiktoken rank file with the specials and vision tokens numbered after the ranks, upstream's weight
  names in sharded safetensors, the VisionTokenizer folder), written from the same weights as a
  converted folder so both must give the same ids, logits and images. Upstream's names come from
  the inverse of the loader's mapping."""

from __future__ import annotations

import base64
import json
import random
import re
import shutil
from pathlib import Path

import torch

from sjdvp_core.models.emu3.adapter import BOI, BOS, EOF, EOI, EOL, EOS, PAD, WRAPPER
from tests.helpers.tiny_hf import CORPUS, byte_bpe_tokenizer, spread_weights, write_shards

CODES = 16
SIZE = dict(image_area=128, ratio="2:1")  # 16 x 8 px at the tiny VQ's f2 -> 4 rows of 8 tokens
# the original vocabulary's specials: <|extra_0|> is the one transformers' converter renames <image>
EXTRAS = [f"<|extra_{i}|>" for i in range(205)]
# emu3_vision_tokens.txt: the image wrapper, start and end, then one token per code
VISION = [WRAPPER, BOI, EOI] + [f"<|visual token {c:06d}|>" for c in range(CODES)]
# digit runs for the BPE to merge, as the release's converted tokenizer.json merges "90*90"
DIGITS = ["90*90 12*10 12*12 720*720 1990 2024 4*8 16*9 10 12 90"] * 8


def tiny_config(tok, attn_resolutions=()):
    """A tiny Emu3Config over a tokenizer whose vocabulary holds the special and visual tokens."""
    from transformers import Emu3Config

    return Emu3Config(
        vocabulary_map=tok.get_vocab(),
        text_config=dict(
            vocab_size=tok.get_vocab_size(),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=512,
            pad_token_id=tok.token_to_id(PAD),
            bos_token_id=tok.token_to_id(BOS),
            eos_token_id=tok.token_to_id(EOS),
        ),
        vq_config=dict(
            codebook_size=CODES,
            embed_dim=4,
            latent_channels=4,
            base_channels=32,
            channel_multiplier=[1, 2],
            num_res_blocks=1,
            attn_resolutions=list(attn_resolutions),
            hidden_size=64,
            num_attention_heads=1,
        ),
    )


def write_converted(d) -> str:
    """The tiny random model, saved into the existing folder d in transformers' format."""
    from transformers import Emu3ForConditionalGeneration

    visual = [f"<|visual token {c:06d}|>" for c in range(CODES)]
    random.Random(0).shuffle(visual)  # vocabulary order != codebook order
    specials = [PAD, BOS, EOS, EOL, EOF, BOI, EOI, WRAPPER, "<image>"] + visual
    tok = byte_bpe_tokenizer(
        str(d),
        specials,
        tokenizer_class="GPT2Tokenizer",
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
    )
    config = tiny_config(tok)
    model = Emu3ForConditionalGeneration(config)
    spread_weights(model)
    model.save_pretrained(d, max_shard_size="1MB")  # sharded with an index, as the 8B release
    (d / "preprocessor_config.json").write_text(
        json.dumps(  # the VQ-VAE's pixel normalisation
            {
                "image_processor_type": "Emu3ImageProcessor",
                "image_mean": [0.4] * 3,
                "image_std": [0.6] * 3,
            }
        )
    )
    return str(d)


# --- the original release: BAAI/Emu3-Gen and BAAI/Emu3-VisionTokenizer ----------------------------
def converted_tokenizer(specials):
    """A byte-level BPE as transformers' converter writes it (GPT-2 ByteLevel pre-tokenizer, which
    keeps digit runs together), the specials numbered after the ranks."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=False, trim_offsets=True, use_regex=True
    )
    tok.train_from_iterator(
        CORPUS + DIGITS,
        trainers.BpeTrainer(vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()),
    )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def ranks_of(tok, count: int) -> dict[bytes, int]:
    """The rank file behind the converted vocabulary: ids are ranks (the converter's rule,
    reversed)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return {bytes(byte_of[c] for c in text): i for text, i in tok.get_vocab().items() if i < count}


def original_key(key: str) -> str:
    """transformers' weight name -> upstream's (the loader's mapping, inverted by hand)."""
    if key.startswith("model.text_model."):
        return "model." + key[len("model.text_model.") :]
    if key == "lm_head.weight":
        return key
    key = key[len("model.vqmodel.") :]
    for new, old in [
        (r"\.down_block\.down\.", ".down."),
        (r"\.up_block\.up\.", ".up."),
        (r"\.middle_block\.attn_norm\.", ".mid.attn_1.norm."),
        (r"\.middle_block\.", ".mid."),
        (r"\.attn_norms\.(\d+)\.", r".attn.\1.norm."),
        (r"\.(q|k|v)_proj\.", r".\1."),
        (r"\.out_proj\.", ".proj_out."),
    ]:
        key = re.sub(new, old, key)
    return key


def write_original(folder, model, ranks, text):
    """BAAI/Emu3-Gen's layout: config.json, emu3.tiktoken, emu3_vision_tokens.txt,
    tokenizer_config.json, sharded safetensors of Emu3ForCausalLM."""
    folder.mkdir(parents=True)
    with open(folder / "emu3.tiktoken", "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    (folder / "emu3_vision_tokens.txt").write_text("\n".join(VISION) + "\n")
    first = len(ranks)
    names = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + EXTRAS + VISION
    ids = {name: first + i for i, name in enumerate(names)}
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Emu3ForCausalLM"],
                "attention_dropout": 0.1,
                "model_type": "Emu3",
                "auto_map": {
                    "AutoConfig": "configuration_emu3.Emu3Config",
                    "AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM",
                },
                "boi_token_id": ids[BOI],
                "bos_token_id": ids[BOS],
                "eof_token_id": ids[EOF],
                "eoi_token_id": ids[EOI],
                "eol_token_id": ids[EOL],
                "eos_token_id": ids[EOS],
                "img_token_id": ids[WRAPPER],
                "pad_token_id": ids[PAD],
                "hidden_act": "silu",
                "hidden_size": text.hidden_size,
                "image_area": 144,
                "initializer_range": 0.02,
                "intermediate_size": text.intermediate_size,
                "max_position_embeddings": text.max_position_embeddings,
                "num_attention_heads": text.num_attention_heads,
                "num_hidden_layers": text.num_hidden_layers,
                "num_key_value_heads": text.num_key_value_heads,
                "pretraining_tp": 1,
                "rms_norm_eps": text.rms_norm_eps,
                "rope_scaling": None,
                "rope_theta": 1000000.0,
                "tie_word_embeddings": False,
                "torch_dtype": "float32",
                "transformers_version": "4.44.0",
                "use_cache": True,
                "vocab_size": text.vocab_size,
            }
        )
    )
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "auto_map": {"AutoTokenizer": ["tokenization_emu3.Emu3Tokenizer", None]},
                "tokenizer_class": "Emu3Tokenizer",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": PAD,
                "model_max_length": text.max_position_embeddings,
            }
        )
    )
    lm = {
        original_key(k): v
        for k, v in model.state_dict().items()
        if not k.startswith("model.vqmodel.")
    }
    write_shards(folder, lm)


def write_vision_tokenizer(folder, model, vq):
    """BAAI/Emu3-VisionTokenizer's layout: config.json (Emu3VisionVQ), model.safetensors,
    preprocessor_config.json."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Emu3VisionVQModel"],
                "model_type": "Emu3VisionVQ",
                "auto_map": {
                    "AutoConfig": "configuration_emu3visionvq.Emu3VisionVQConfig",
                    "AutoModel": "modeling_emu3visionvq.Emu3VisionVQModel",
                },
                "codebook_size": vq.codebook_size,
                "embed_dim": vq.embed_dim,
                "z_channels": vq.latent_channels,
                "double_z": False,
                "in_channels": 3,
                "out_channels": 3,
                "temporal_downsample_factor": 4,
                "ch": vq.base_channels,
                "ch_mult": list(vq.channel_multiplier),
                "num_res_blocks": vq.num_res_blocks,
                "attn_resolutions": list(vq.attn_resolutions),
                "dropout": 0.0,
                "torch_dtype": "float32",
            }
        )
    )
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Emu3VisionVQImageProcessor",
                "image_mean": [0.4] * 3,
                "image_std": [0.6] * 3,
                "min_pixels": 512 * 512,
                "max_pixels": 1024 * 1024,
                "spatial_factor": 8,
            }
        )
    )
    state = {}
    for key, tensor in model.state_dict().items():
        if key.startswith("model.vqmodel."):
            attention = re.search(r"\.(q|k|v|out)_proj\.weight$", key)
            # upstream's attention projections are 1x1 convolutions
            state[original_key(key)] = tensor[:, :, None, None] if attention else tensor
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(folder / "model.safetensors"),
        metadata={"format": "pt"},
    )


def write_folders(root: Path) -> tuple[str, str, str]:
    """(converted, original with vision_tokenizer/, original with a sibling Emu3-VisionTokenizer)
    under root."""
    from transformers import Emu3ForConditionalGeneration

    hf = root / "models" / "Emu3-Gen-hf"
    hf.mkdir(parents=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>"] + EXTRAS[1:] + VISION
    tok = converted_tokenizer(specials)
    count = tok.get_vocab_size() - len(specials)
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "GPT2Tokenizer",
                "bos_token": BOS,
                "eos_token": EOS,
                "pad_token": PAD,
            }
        )
    )
    config = tiny_config(tok, attn_resolutions=[1])
    model = Emu3ForConditionalGeneration(config)
    spread_weights(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # BatchNorm statistics are weights too
        for name, buffer in model.named_buffers():
            if name.endswith(("running_mean", "running_var")):
                buffer.copy_(torch.rand(buffer.shape, generator=g) + 0.5)
    model.save_pretrained(hf, max_shard_size="1MB")
    (hf / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "Emu3ImageProcessor",
                "image_mean": [0.4] * 3,
                "image_std": [0.6] * 3,
            }
        )
    )
    ranks = ranks_of(tok, count)
    original = root / "models" / "Emu3-Gen"
    write_original(original, model, ranks, config.text_config)
    write_vision_tokenizer(original / "vision_tokenizer", model, config.vq_config)
    sibling = root / "sibling" / "Emu3-Gen"
    shutil.copytree(original, sibling, ignore=shutil.ignore_patterns("vision_tokenizer"))
    shutil.copytree(original / "vision_tokenizer", root / "sibling" / "Emu3-VisionTokenizer")
    return str(hf), str(original), str(sibling)
