"""Emu3 in its original release layout (BAAI/Emu3-Gen with BAAI/Emu3-VisionTokenizer), loaded without
remote code: a tiny random model written twice, as transformers' converter writes BAAI/Emu3-Gen-hf and in
the original layout (upstream's config fields, a tiktoken rank file with the specials and vision tokens
numbered after the ranks, original weight names in sharded safetensors, the VisionTokenizer folder), so
both folders must give the same ids, logits and images. The original names are written here by the
inverse of the loader's mapping. Size-string tests: the prompt's "H*W" is read digit by digit, as the
original tokenizer (and so training) split it, even when the tokenizer file merges digit runs."""
import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from sjdvp_core import decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.emu3.adapter import BOI, BOS, EOF, EOI, EOL, EOS, PAD, WRAPPER, Emu3Adapter
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.tiny_hf import CORPUS, spread_weights, write_shards
from tests.test_emu3 import tiny_config

CODES = 16
SIZE = dict(image_area=128, ratio="2:1")          # 16 x 8 px at the tiny VQ's f2 -> 4 rows of 8 tokens
PROMPTS = ["a red fox in the snow", "3 cats (cute), 1990s café"]
EXTRAS = [f"<|extra_{i}|>" for i in range(205)]
VISION = [WRAPPER, BOI, EOI] + [f"<|visual token {c:06d}|>" for c in range(CODES)]   # emu3_vision_tokens.txt
DIGITS = ["90*90 12*10 12*12 720*720 1990 2024 4*8 16*9 10 12 90"] * 8


def converted_tokenizer(specials):
    """A byte-level BPE as transformers' converter writes it (GPT-2 ByteLevel pre-tokenizer, which keeps
    digit runs together), the specials numbered after the ranks."""
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.train_from_iterator(CORPUS + DIGITS, trainers.BpeTrainer(
        vocab_size=320, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


def ranks_of(tok, count: int) -> dict[bytes, int]:
    """The rank file behind the converted vocabulary: ids are ranks (the converter's rule, reversed)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    byte_of = {c: b for b, c in bytes_to_unicode().items()}
    return {bytes(byte_of[c] for c in text): i for text, i in tok.get_vocab().items() if i < count}


def original_key(key: str) -> str:
    """transformers' weight name -> upstream's (the loader's mapping, inverted by hand)."""
    if key.startswith("model.text_model."):
        return "model." + key[len("model.text_model."):]
    if key == "lm_head.weight":
        return key
    key = key[len("model.vqmodel."):]
    for new, old in [(r"\.down_block\.down\.", ".down."), (r"\.up_block\.up\.", ".up."),
                     (r"\.middle_block\.attn_norm\.", ".mid.attn_1.norm."), (r"\.middle_block\.", ".mid."),
                     (r"\.attn_norms\.(\d+)\.", r".attn.\1.norm."), (r"\.(q|k|v)_proj\.", r".\1."),
                     (r"\.out_proj\.", ".proj_out.")]:
        key = re.sub(new, old, key)
    return key


def write_original(folder, model, ranks, text):
    """BAAI/Emu3-Gen's layout: config.json, emu3.tiktoken, emu3_vision_tokens.txt, tokenizer_config.json,
    sharded safetensors of Emu3ForCausalLM."""
    folder.mkdir(parents=True)
    with open(folder / "emu3.tiktoken", "w") as f:
        for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
            f.write(f"{base64.b64encode(token).decode()} {rank}\n")
    (folder / "emu3_vision_tokens.txt").write_text("\n".join(VISION) + "\n")
    first = len(ranks)
    ids = {name: first + i for i, name in enumerate(["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + EXTRAS + VISION)}
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Emu3ForCausalLM"], "attention_dropout": 0.1, "model_type": "Emu3",
        "auto_map": {"AutoConfig": "configuration_emu3.Emu3Config",
                     "AutoModelForCausalLM": "modeling_emu3.Emu3ForCausalLM"},
        "boi_token_id": ids[BOI], "bos_token_id": ids[BOS], "eof_token_id": ids[EOF], "eoi_token_id": ids[EOI],
        "eol_token_id": ids[EOL], "eos_token_id": ids[EOS], "img_token_id": ids[WRAPPER], "pad_token_id": ids[PAD],
        "hidden_act": "silu", "hidden_size": text.hidden_size, "image_area": 144, "initializer_range": 0.02,
        "intermediate_size": text.intermediate_size, "max_position_embeddings": text.max_position_embeddings,
        "num_attention_heads": text.num_attention_heads, "num_hidden_layers": text.num_hidden_layers,
        "num_key_value_heads": text.num_key_value_heads, "pretraining_tp": 1, "rms_norm_eps": text.rms_norm_eps,
        "rope_scaling": None, "rope_theta": 1000000.0, "tie_word_embeddings": False, "torch_dtype": "float32",
        "transformers_version": "4.44.0", "use_cache": True, "vocab_size": text.vocab_size}))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "auto_map": {"AutoTokenizer": ["tokenization_emu3.Emu3Tokenizer", None]}, "tokenizer_class": "Emu3Tokenizer",
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "model_max_length": text.max_position_embeddings}))
    lm = {original_key(k): v for k, v in model.state_dict().items() if not k.startswith("model.vqmodel.")}
    write_shards(folder, lm)


def write_vision_tokenizer(folder, model, vq):
    """BAAI/Emu3-VisionTokenizer's layout: config.json (Emu3VisionVQ), model.safetensors, preprocessor_config.json."""
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Emu3VisionVQModel"], "model_type": "Emu3VisionVQ",
        "auto_map": {"AutoConfig": "configuration_emu3visionvq.Emu3VisionVQConfig",
                     "AutoModel": "modeling_emu3visionvq.Emu3VisionVQModel"},
        "codebook_size": vq.codebook_size, "embed_dim": vq.embed_dim, "z_channels": vq.latent_channels,
        "double_z": False, "in_channels": 3, "out_channels": 3, "temporal_downsample_factor": 4,
        "ch": vq.base_channels, "ch_mult": list(vq.channel_multiplier), "num_res_blocks": vq.num_res_blocks,
        "attn_resolutions": list(vq.attn_resolutions), "dropout": 0.0, "torch_dtype": "float32"}))
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Emu3VisionVQImageProcessor", "image_mean": [0.4] * 3, "image_std": [0.6] * 3,
        "min_pixels": 512 * 512, "max_pixels": 1024 * 1024, "spatial_factor": 8}))
    state = {}
    for key, tensor in model.state_dict().items():
        if key.startswith("model.vqmodel."):
            attention = re.search(r"\.(q|k|v|out)_proj\.weight$", key)
            state[original_key(key)] = tensor[:, :, None, None] if attention else tensor   # 1x1 convolutions
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def write_folders(root: Path) -> tuple[str, str, str]:
    """(converted, original with vision_tokenizer/, original with a sibling Emu3-VisionTokenizer) under root."""
    from transformers import Emu3ForConditionalGeneration
    hf = root / "models" / "Emu3-Gen-hf"
    hf.mkdir(parents=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>"] + EXTRAS[1:] + VISION
    tok = converted_tokenizer(specials)
    count = tok.get_vocab_size() - len(specials)
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "bos_token": BOS, "eos_token": EOS, "pad_token": PAD}))
    config = tiny_config(tok, attn_resolutions=[1])
    model = Emu3ForConditionalGeneration(config)
    spread_weights(model)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():                              # BatchNorm statistics are weights too
        for name, buffer in model.named_buffers():
            if name.endswith(("running_mean", "running_var")):
                buffer.copy_(torch.rand(buffer.shape, generator=g) + 0.5)
    model.save_pretrained(hf, max_shard_size="1MB")
    (hf / "preprocessor_config.json").write_text(json.dumps(
        {"image_processor_type": "Emu3ImageProcessor", "image_mean": [0.4] * 3, "image_std": [0.6] * 3}))
    ranks = ranks_of(tok, count)
    original = root / "models" / "Emu3-Gen"
    write_original(original, model, ranks, config.text_config)
    write_vision_tokenizer(original / "vision_tokenizer", model, config.vq_config)
    sibling = root / "sibling" / "Emu3-Gen"
    shutil.copytree(original, sibling, ignore=shutil.ignore_patterns("vision_tokenizer"))
    shutil.copytree(original / "vision_tokenizer", root / "sibling" / "Emu3-VisionTokenizer")
    return str(hf), str(original), str(sibling)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_folders(tmp_path_factory.mktemp("emu3"))


@pytest.fixture(scope="module")
def adapters(folders):
    hf, original, _ = folders
    return load_model(hf, **SIZE), load_model(original, **SIZE)


def test_original_folders_are_detected_and_listed_without_the_vision_tokenizer(folders, adapters):
    hf, original, sibling = folders
    assert detect_family(original) == detect_family(sibling) == "emu3"
    assert isinstance(adapters[1], Emu3Adapter) and (adapters[1].height, adapters[1].width) == (4, 8)
    assert sorted(list_models([os.path.dirname(hf)])) == ["Emu3-Gen", "Emu3-Gen-hf", "demo"]   # no vision_tokenizer
    assert list_models([os.path.dirname(sibling)]) == ["demo", "Emu3-Gen"]             # not Emu3-VisionTokenizer
    assert load_model(sibling, **SIZE).pixel_mean == [0.4] * 3                          # the sibling's preprocessor


def test_original_vocabulary_gives_the_converted_ids(adapters):
    converted, original = adapters
    for name in ["<|endoftext|>", "<|im_end|>", *EXTRAS[1:], *VISION]:
        assert original.tokenizer.id(name) == converted.tokenizer.id(name), name
    assert original.tokenizer.id("<|extra_0|>") == converted.tokenizer.id("<image>")     # the converter's rename
    assert original.model.config.image_token_id == converted.model.config.image_token_id
    assert torch.equal(original.layout.image_tokens, converted.layout.image_tokens)
    for cfg in (False, True):
        assert original.prompt_ids(PROMPTS, None, cfg) == converted.prompt_ids(PROMPTS, None, cfg)


def test_original_tokenizer_follows_upstreams_rules(adapters):
    """NFC first, one token per special name, PAT_STR's pieces (a letter run takes one leading symbol)."""
    tok = adapters[1].tokenizer
    assert tok.encode("cafe\u0301") == tok.encode("café")
    assert tok.encode(f"{BOS}{EOL}<|visual token 000003|>") == [tok.id(BOS), tok.id(EOL), tok.id(VISION[6])]
    pieces = tok.tok.pre_tokenizer.pre_tokenize_str("(cats) don't 1990")
    assert [p for p, _ in pieces] == ["(cats", ")", "Ġdon", "'t", "Ġ", "1", "9", "9", "0"]


def test_size_string_is_read_digit_by_digit_even_where_the_tokenizer_merges_digits(folders, adapters):
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(os.path.join(folders[0], "tokenizer.json"))   # as the converter writes it
    merged = [raw.token_to_id(t) for t in ("90", "12", "10")]
    assert None not in merged and raw.encode("90*90").ids == [merged[0], raw.token_to_id("*"), merged[0]]
    for adapter in adapters:
        tok = adapter.tokenizer
        digits = [tok.id(c) for c in "12*10"]
        tall = adapter.with_size(20, 24)                                 # 12 x 10 tokens at f2
        assert tall.image_prefix == f"{BOI}12*10{WRAPPER}"
        row = tall.prompt_ids(["a fox"], None, cfg=False)[0]
        assert row[-7:] == [tok.id(BOI), *digits, tok.id(WRAPPER)]
        assert not set(merged) & set(row)


@torch.inference_mode()
def test_original_logits_equal_the_converted(adapters):
    outs = []
    for adapter in adapters:
        layout, first = adapter.start(PROMPTS, None, True)
        window = layout.image_tokens[torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6], [5, 3, 5, 8], [9, 7, 9, 3]])]
        outs.append((first, adapter.forward(window, torch.arange(4).expand(4, -1))))
        adapter.finish()
    for a, b in zip(*outs):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-5)


def test_original_decoded_images_equal_the_converted(adapters):
    converted, original = adapters
    res = decode(original, PROMPTS, method_settings("sjd", 8, SamplingSettings(cfg_scale=3.0, top_k=8),
                                                     batch_size=2, seed=1))
    image = original.decode_image(res.codes)
    assert image.shape == (2, 8, 16, 3) and original.pixel_mean == [0.4] * 3
    assert torch.allclose(image, converted.decode_image(res.codes), atol=1e-5)
    assert torch.equal(original.codebook(), converted.codebook())


def test_original_image_area_defaults_to_the_configs(folders):
    adapter = load_model(folders[1])                  # config.json's image_area 144: 12 x 12 px -> 6 x 6 tokens
    assert (adapter.height, adapter.width) == (6, 6)


def _variant(folder, tmp_path, name, drop=()):
    d = tmp_path / name / "Emu3-Gen"
    shutil.copytree(folder, d, ignore=shutil.ignore_patterns(*drop))
    return d


def _drop_tensor(path, prefix):
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(path))
    dropped = sorted(k for k in tensors if k.startswith(prefix))[0]
    del tensors[dropped]
    save_file(tensors, str(path), metadata={"format": "pt"})


def test_original_missing_files_say_what_to_download(folders, tmp_path):
    original = folders[1]
    no_vision = _variant(original, tmp_path, "no_vision", drop=["vision_tokenizer"])
    with pytest.raises(CheckpointError, match="no Emu3 vision tokenizer") as err:
        load_model(str(no_vision), **SIZE)
    assert "BAAI/Emu3-VisionTokenizer" in str(err.value) and str(no_vision / "vision_tokenizer") in str(err.value)
    assert "Emu3-VisionTokenizer" in str(err.value).split(" (or into ")[1]

    no_shard = _variant(original, tmp_path, "no_shard", drop=["model-00002-of-00002.safetensors"])
    with pytest.raises(CheckpointError, match=r"missing model-00002-of-00002\.safetensors.*BAAI/Emu3-Gen "):
        load_model(str(no_shard), **SIZE)

    no_vocab = _variant(original, tmp_path, "no_vocab", drop=["emu3.tiktoken"])
    with pytest.raises(CheckpointError, match=r"missing emu3\.tiktoken.*BAAI/Emu3-Gen "):
        load_model(str(no_vocab), **SIZE)

    partial = _variant(original, tmp_path, "partial")
    _drop_tensor(partial / "model-00001-of-00002.safetensors", "model.layers.")
    with pytest.raises(CheckpointError, match=r"lack 1 tensors \(model\.text_model\.layers\..*BAAI/Emu3-Gen$"):
        load_model(str(partial), **SIZE)

    partial_vq = _variant(original, tmp_path, "partial_vq")
    _drop_tensor(partial_vq / "vision_tokenizer" / "model.safetensors", "decoder.")
    with pytest.raises(CheckpointError, match=r"vision_tokenizer: the weights lack 1 tensors \(model\.vqmodel\.decoder"
                                              r".*BAAI/Emu3-VisionTokenizer$"):
        load_model(str(partial_vq), **SIZE)

    # JSON, but not the model's: a field of the wrong type, a config that is a list (was a traceback from inside
    # transformers' config classes)
    wrong_type = _variant(original, tmp_path, "wrong_type")
    config = json.loads((wrong_type / "config.json").read_text())
    (wrong_type / "config.json").write_text(json.dumps({**config, "num_hidden_layers": "two"}))
    with pytest.raises(CheckpointError, match=r"the config\.json files: cannot be read as the model's configuration "
                                              r".*download the config\.json of BAAI/Emu3-Gen"):
        load_model(str(wrong_type), **SIZE)
    a_list = _variant(original, tmp_path, "a_list")
    (a_list / "vision_tokenizer" / "config.json").write_text("[]")
    with pytest.raises(CheckpointError, match=r"vision_tokenizer/config\.json: cannot be read as the model's "
                                              r"configuration .*BAAI/Emu3-VisionTokenizer"):
        load_model(str(a_list), **SIZE)


def test_a_vision_tokenizer_beside_the_model_under_any_name_is_found_and_named(folders, tmp_path):
    """People download with --local-dir and name folders as they like: the one sibling whose config is an
    Emu3 vision VQ is used (and the check says which); two are refused by name; other models are ignored."""
    import io

    from sjdvp_core.hub.check import check
    original = Path(folders[1])
    model = _variant(original, tmp_path, "renamed", drop=["vision_tokenizer"])
    shutil.copytree(original / "vision_tokenizer", model.parent / "Emu3-VisionTokenizer-original")
    shutil.copytree(folders[0], model.parent / "Emu3-Gen-hf")              # another model beside: not a VQ
    (model.parent / "notes").mkdir()
    assert load_model(str(model), **SIZE).vision_folder == str(model.parent / "Emu3-VisionTokenizer-original")
    out = io.StringIO()
    assert check(str(model), run_forward=False, out=out) == 0, out.getvalue()
    assert f"vision tokenizer: {model.parent / 'Emu3-VisionTokenizer-original'}" in out.getvalue()
    assert sorted(list_models([str(model.parent)])) == ["Emu3-Gen", "Emu3-Gen-hf", "demo"]   # the VQs are not models
    shutil.copytree(original / "vision_tokenizer", model.parent / "emu3-vq-copy")
    with pytest.raises(CheckpointError, match=r"several folders beside it hold an Emu3 vision tokenizer "
                                              r"\(Emu3-VisionTokenizer-original, emu3-vq-copy\); move the one"):
        load_model(str(model), **SIZE)


def test_original_folder_passes_the_check_with_its_size_string(folders):
    import io

    from sjdvp_core.hub.check import check
    out = io.StringIO()
    problems = check(folders[1], out=out)
    text = out.getvalue()
    assert problems == 0, text
    assert "vision_tokenizer/model.safetensors" in text and "<|image start|>" in text
    assert "('6', '6'" not in text and "'6'), (" in text      # "6*6": one token per digit
