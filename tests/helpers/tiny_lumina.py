"""A tiny random Lumina-mGPT 1.0 folder written the way the released ones are laid out: config.json
of a ChameleonXLLMX model (Lumina's extra keys, the vocabulary map), sharded safetensors with an
index, the tokenizer files (byte-level BPE, special tokens in the real order), and Meta's
vqgan.yaml + Lightning-style vqgan.ckpt under tokenizer/. Image tokens are named IMGIMG<digits as
letters A-J>Z and their ids are shuffled against code order, as the real vocabulary's are."""

from __future__ import annotations

import json
import os

import torch

from tests.helpers.tiny_hf import byte_bpe_tokenizer, spread_weights, write_shards

CODES = 16  # codebook size of the tiny VQGAN
MAX_GRIDS = 8  # resolution tokens <reserved08801> .. <reserved08808>
# config.json keys of Lumina's ChameleonXLLMXConfig that transformers' ChameleonConfig does not
# define
LUMINA_ONLY = (
    "architectures",
    "dropout",
    "mask_image_logits",
    "z_loss_weight",
    "torch_dtype",
    "transformers_version",
)
VQGAN_DD = dict(
    double_z=False,
    z_channels=32,
    resolution=64,
    in_channels=3,
    out_ch=3,
    ch=32,
    ch_mult=[1, 1, 1, 1, 1],
    num_res_blocks=1,
    attn_resolutions=[],
    dropout=0.0,
)


def image_token_name(code: int) -> str:
    return "IMGIMG" + "".join(chr(ord("A") + int(d)) for d in str(code)) + "Z"


def specials(seed: int = 0) -> list[str]:
    """Special tokens in the real vocabulary's order: <s> <pad> </s> <unk>, the image tokens (ids
    4..), <eoss>, <racm3:break>, then reserved tokens (end of turn, <image>, row end,
    resolutions)."""
    g = torch.Generator().manual_seed(seed)
    names = ["<s>", "<pad>", "</s>", "<unk>"] + [
        image_token_name(int(c)) for c in torch.randperm(CODES, generator=g)
    ]
    names += ["<eoss>", "<racm3:break>", "<reserved08706>", "<image>", "<reserved08799>"]
    return names + [f"<reserved{8800 + n:05d}>" for n in range(1, MAX_GRIDS + 1)]


def config_json(vocab: dict[str, int], vocab_size: int) -> dict:
    return {
        "architectures": ["ChameleonXLLMXForConditionalGeneration"],
        "model_type": "chameleon",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": None,
        "dropout": 0.05,
        "hidden_act": "silu",
        "hidden_size": 32,
        "initializer_range": 0.02,
        "intermediate_size": 64,
        "mask_image_logits": False,
        "max_position_embeddings": 256,
        "mlp_bias": False,
        "model_parallel_size": 1,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": 10000.0,
        "swin_norm": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "transformers_version": "4.44.0",
        "use_cache": True,
        "vocab_size": vocab_size,
        "z_loss_weight": 1e-05,
        "vq_config": {
            "attn_resolutions": [],
            "attn_type": "vanilla",
            "base_channels": 32,
            "channel_multiplier": [1, 1, 1, 1, 1],
            "double_latent": False,
            "dropout": 0.0,
            "embed_dim": 8,
            "in_channels": 3,
            "initializer_range": 0.02,
            "latent_channels": 32,
            "model_type": "chameleon_vqgan",
            "num_embeddings": CODES,
            "num_res_blocks": 1,
            "out_channels": 3,
            "resolution": 64,  # Lumina's converter also keeps taming's names:
            "ch": 32,
            "ch_mult": [1, 1, 1, 1, 1],
            "double_z": False,
            "n_embed": CODES,
            "out_ch": 3,
            "z_channels": 32,
        },
        "vocabulary_map": vocab,
    }


def vqgan_yaml() -> str:
    dd = "\n".join(f"      {k}: {json.dumps(v)}" for k, v in VQGAN_DD.items())
    return (
        "model:\n  target: taming.models.vqgan.VQModel\n  params:\n    embed_dim: 8\n"
        f"    n_embed: {CODES}\n    ddconfig:\n{dd}\n    lossconfig:\n"
        "      target: taming.modules.losses.vqperceptual.VQLPIPSWithDiscriminator\n"
        "      params:\n        disc_start: 0\n        disc_weight: 0.8\n        codebook_weight: 1.0\n"
    )


def write_vqgan(folder: str, seed: int = 0) -> None:
    """vqgan.yaml + a Lightning-style vqgan.ckpt: weights under "state_dict", with encoder and
    loss keys."""
    from sjdvp_core.models.lumina.vqgan import ChameleonVQGAN, read_vqgan_yaml

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vqgan.yaml"), "w") as f:
        f.write(vqgan_yaml())
    torch.manual_seed(seed)
    state = ChameleonVQGAN(read_vqgan_yaml(os.path.join(folder, "vqgan.yaml"))).state_dict()
    state["encoder.conv_in.weight"] = torch.randn(32, 3, 3, 3)
    state["quant_conv.weight"] = torch.randn(8, 32, 1, 1)
    state["loss.discriminator.main.0.weight"] = torch.randn(64, 3, 4, 4)
    torch.save(
        {
            "epoch": 3,
            "global_step": 1000,
            "pytorch-lightning_version": "1.9.0",
            "state_dict": state,
        },
        os.path.join(folder, "vqgan.ckpt"),
    )


def write_lumina(folder: str, seed: int = 0, vqgan: bool = True) -> str:
    """The model folder (and, if asked, its tokenizer/ subfolder with the VQGAN); returns folder. It
    carries no weights for transformers' VQ encoder (model.vqmodel.*), which a release may omit,
    and keeps the q/k-norm parameters per model-parallel shard, [1, head_dim], as Lumina's code
    saves them."""
    from transformers import ChameleonConfig, ChameleonForConditionalGeneration

    os.makedirs(folder, exist_ok=True)
    tok = byte_bpe_tokenizer(
        folder,
        specials(seed),
        vocab_size=360,
        tokenizer_class="LlamaTokenizer",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        sep_token="<reserved08706>",
        legacy=False,
        processor_class="ChameleonProcessor",
    )
    config = config_json(tok.get_vocab(), tok.get_vocab_size())
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    model = ChameleonForConditionalGeneration(
        ChameleonConfig(**{k: v for k, v in config.items() if k not in LUMINA_ONLY})
    )
    spread_weights(model, seed=seed)
    state = {
        k: v.contiguous()
        for k, v in model.state_dict().items()
        if not k.startswith("model.vqmodel.")
    }
    g = torch.Generator().manual_seed(seed)
    # Lumina's layout: [model parallel 1, D]
    for k in [k for k in state if "_norm." in k and "self_attn" in k]:
        state[k] = 1 + 0.5 * torch.randn(1, state[k].shape[1], generator=g)
    write_shards(folder, state)
    if vqgan:
        write_vqgan(os.path.join(folder, "tokenizer"), seed)
    return folder


def write_lumina_4bit(folder: str, seed: int = 0) -> str:
    """Lumina-mGPT-7B-768-bnb-int4's layout, written by bitsandbytes itself: write_lumina's model
    loaded through transformers with load_in_4bit (its defaults, as the release's config.json
    keeps them: FP4, blocks of 64, no double quantisation) and saved: one model.safetensors of
    packed uint8 weights with their quant-state keys (absmax, quant_map,
    quant_state.bitsandbytes__fp4) and float norms and embeddings; config.json is Lumina's own
    plus the quantization_config; q/k norms stay per model-parallel shard."""
    import shutil
    import tempfile

    from safetensors.torch import load_file, save_file
    from transformers import BitsAndBytesConfig, ChameleonForConditionalGeneration

    with tempfile.TemporaryDirectory() as tmp:
        source = write_lumina(os.path.join(tmp, "float"), seed)
        # the [1, D] q/k norms: put back as stored below
        model = ChameleonForConditionalGeneration.from_pretrained(
            source,
            quantization_config=BitsAndBytesConfig(load_in_4bit=True),
            dtype=torch.bfloat16,
            ignore_mismatched_sizes=True,
        )
        model.save_pretrained(folder)
        with open(os.path.join(folder, "config.json")) as f:
            quantization = json.load(f)["quantization_config"]
        with open(os.path.join(source, "config.json")) as f:
            config = json.load(f) | {"quantization_config": quantization, "torch_dtype": "bfloat16"}
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        float_state = {}
        for name in os.listdir(source):
            if name.endswith(".safetensors"):
                float_state |= load_file(os.path.join(source, name))
        path = os.path.join(folder, "model.safetensors")
        state = load_file(path)
        state |= {
            k: v.to(torch.bfloat16)
            for k, v in float_state.items()
            if "_norm." in k and "self_attn" in k
        }
        save_file(state, path, metadata={"format": "pt"})
        for name in os.listdir(source):
            if name.startswith(("tokenizer", "special_tokens")):
                copy = shutil.copytree if os.path.isdir(os.path.join(source, name)) else shutil.copy
                copy(os.path.join(source, name), os.path.join(folder, name))
    return folder
