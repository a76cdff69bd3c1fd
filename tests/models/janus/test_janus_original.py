"""Janus-Pro in the layout DeepSeek released it (deepseek-ai/Janus-Pro-1B: config.json of model_type
multi_modality, pytorch_model.bin; -7B: pytorch_model-0000N-of-00002.bin +
pytorch_model.bin.index.json), written by tests/helpers/tiny_janus.py from the same tiny random
weights as the converted folder, with the release's tensor names (janus/models/modeling_vlm.py,
vq_model.py, projector.py, siglip_vit.py of github.com/deepseek-ai/Janus). It must load without
remote code and run exactly as the converted one."""

import json
import os
import re
import shutil

import pytest
import torch

from sjdvp_core.models.checkpoint import CheckpointError
from sjdvp_core.models.janus.adapter import JanusAdapter
from sjdvp_core.models.janus.original import REPOS, janus_config, vq_shape
from sjdvp_core.models.loading import load_model
from sjdvp_core.models.registry import detect_family, list_models
from tests.helpers.tiny_hf import PROMPTS
from tests.helpers.tiny_janus import (
    JANUS_PRO_7B,
    SHARDS,
    original_name,
    write_converted,
    write_original,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    converted = tmp_path_factory.mktemp("converted") / "Janus-Pro-1B"
    converted.mkdir()
    write_converted(converted)
    root = tmp_path_factory.mktemp("models")
    return (
        str(converted),
        write_original(str(converted), root / "Janus-Pro-1B", sharded=False),
        write_original(str(converted), root / "Janus-Pro-7B", sharded=True),
    )


@pytest.fixture(scope="module")
def adapters(folders):
    return [load_model(f) for f in folders]


def test_original_folders_are_detected_listed_and_loaded(folders, adapters):
    converted, single, sharded = folders
    assert detect_family(single) == detect_family(sharded) == "janus"
    assert set(list_models([os.path.dirname(single)])) == {"demo", "Janus-Pro-1B", "Janus-Pro-7B"}
    reference = adapters[0]
    for adapter in adapters[1:]:
        assert isinstance(adapter, JanusAdapter)
        assert (adapter.bos, adapter.boi, adapter.pad_id) == (
            reference.bos,
            reference.boi,
            reference.pad_id,
        )
        assert adapter.layout.length == 16 and adapter.layout.grid.shape == (4, 4)
        assert (
            adapter.model.config.vq_config.num_patches
            == reference.model.config.vq_config.num_patches
        )
        for field in (
            "embed_dim",
            "num_embeddings",
            "base_channels",
            "channel_multiplier",
            "num_res_blocks",
            "latent_channels",
            "projection_dim",
            "image_token_embed_dim",
            "num_hidden_layers",
        ):
            assert getattr(adapter.model.config.vq_config, field) == getattr(
                reference.model.config.vq_config, field
            )
        # the text head is never run, never read; what edits run is mapped to the converted names
        assert adapter.model.lm_head is None
        for mine, theirs in (
            (adapter.reference_encoder, reference.reference_encoder),
            (adapter.model.model.vqmodel, reference.model.model.vqmodel),
        ):
            mine, theirs = mine.state_dict(), theirs.state_dict()
            assert mine.keys() == theirs.keys()
            assert all(torch.equal(mine[k], theirs[k].to(mine[k].dtype)) for k in mine)
        assert not any(p.is_meta for p in adapter.model.parameters())


@torch.inference_mode()
def test_janus_1b_single_safetensors_runs_as_janus_pro(folders, adapters, tmp_path):
    """Janus-1.3B (deepseek-ai/Janus-1.3B, the original Janus: Janus-Pro's code path, one
    model.safetensors)."""
    janus_1b = write_original(folders[0], tmp_path / "Janus-1.3B", sharded=False, safetensors=True)
    assert detect_family(janus_1b) == "janus" and list_models([str(tmp_path)]) == [
        "demo",
        "Janus-1.3B",
    ]
    adapter = load_model(janus_1b)
    assert isinstance(adapter, JanusAdapter) and adapter.model.lm_head is None
    tokens, positions = torch.tensor([[3, 7, 1, 12]]).repeat(2, 1), torch.arange(1, 5).expand(2, -1)
    outputs = []
    for each in (adapter, adapters[0]):
        _, first = each.start(PROMPTS[:1], None, True)
        outputs.append((first, each.forward(tokens, positions)))
        each.finish()
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*outputs))


@torch.inference_mode()
def test_original_logits_match_converted(adapters):
    tokens = torch.tensor([[3, 7, 1, 12], [0, 15, 4, 9]]).repeat(2, 1)
    positions = torch.arange(1, 5).expand(4, -1)
    outputs = []
    for adapter in adapters:
        _, first = adapter.start(PROMPTS, None, True)
        outputs.append((first, adapter.forward(tokens, positions)))
        adapter.finish()
    for first, later in outputs[1:]:
        assert torch.allclose(first, outputs[0][0], atol=1e-5)
        assert torch.allclose(later, outputs[0][1], atol=1e-5)


def test_original_decodes_the_same_images(adapters):
    codes = torch.randint(0, 16, (2, 4, 4), generator=torch.Generator().manual_seed(0))
    reference = adapters[0].decode_image(codes)
    for adapter in adapters[1:]:
        assert torch.allclose(adapter.decode_image(codes), reference, atol=1e-5)
        assert torch.allclose(adapter.codebook(), adapters[0].codebook(), atol=1e-6)


def test_original_janus_pro_7b_config_maps_right():
    """The released 7B config.json with VQ-16's tensor shapes gives what the release builds."""
    from transformers import JanusVisionConfig, JanusVisionModel, JanusVQVAE, JanusVQVAEConfig

    with torch.device("meta"):
        vq = JanusVQVAE(JanusVQVAEConfig())  # its defaults are VQ-16
        tower = JanusVisionModel(JanusVisionConfig())  # and SigLIP-L at 384 px
    shapes = {original_name(f"model.vqmodel.{k}"): t.shape for k, t in vq.state_dict().items()}
    shapes |= {
        original_name(f"model.vision_model.{k}"): t.shape for k, t in tower.state_dict().items()
    }
    assert vq_shape(shapes) == dict(
        base_channels=128,
        channel_multiplier=[1, 1, 2, 2, 4],
        num_res_blocks=2,
        latent_channels=256,
        embed_dim=8,
        num_embeddings=16384,
    )
    tokens = {"bos_token_id": 100000, "eos_token_id": 100001, "pad_token_id": 100002}
    config = janus_config(JANUS_PRO_7B, shapes, tokens)
    text, vq = config.text_config, config.vq_config
    assert (
        text.hidden_size,
        text.intermediate_size,
        text.num_hidden_layers,
        text.num_attention_heads,
        text.num_key_value_heads,
        text.vocab_size,
        text.rms_norm_eps,
    ) == (4096, 11008, 30, 32, 32, 102400, 1e-6)
    assert (text.bos_token_id, text.pad_token_id, text.hidden_act) == (100000, 100002, "silu")
    assert (vq.num_patches, vq.projection_dim, vq.image_token_embed_dim, vq.num_hidden_layers) == (
        24,
        4096,
        4096,
        2,
    )
    vision = config.vision_config
    assert (
        vision.hidden_size,
        vision.num_hidden_layers,
        vision.num_attention_heads,
        vision.mlp_ratio,
        vision.image_size,
        vision.patch_size,
        vision.num_image_tokens,
        vision.projection_dim,
        vision.depth,
    ) == (1024, 24, 16, 4.0, 384, 16, 576, 4096, 2)


def test_original_missing_files_shards_and_tensors_are_named(folders, tmp_path):
    _, single, sharded = folders

    def variant(name, source, drop=()):
        d = tmp_path / name
        shutil.copytree(source, d, ignore=shutil.ignore_patterns(*drop))
        return d

    cases = [
        (variant("no_tokenizer", single, ["tokenizer.json"]), r"missing tokenizer\.json"),
        (variant("no_weights", single, ["*.bin"]), r"missing the weights \(pytorch_model\.bin"),
        (variant("no_shard", sharded, [SHARDS[1]]), f"missing {SHARDS[1]}"),
    ]
    partial = variant("partial", single)
    state = torch.load(partial / "pytorch_model.bin", weights_only=True)
    del state["gen_head.vision_head.weight"]
    torch.save(state, partial / "pytorch_model.bin")
    cases.append((partial, r"missing: model\.generation_head\.vision_head\.weight"))
    wrong_type = variant("wrong_type", single)
    config = json.loads((wrong_type / "config.json").read_text())
    config["language_config"]["hidden_size"] = "x"
    (wrong_type / "config.json").write_text(json.dumps(config))
    cases.append((wrong_type, r"config\.json: cannot be read as the model's configuration"))
    no_map = variant("no_weight_map", sharded)
    (no_map / "pytorch_model.bin.index.json").write_text('{"metadata": {}}')
    cases.append(
        (no_map, r"index\.json: a weights index without its weight_map; download it again")
    )
    for path, message in cases:
        with pytest.raises(CheckpointError, match=message) as err:
            load_model(str(path))
        assert REPOS in str(err.value), str(err.value)


class Payload:
    """Stands for any Python object a pickle may carry."""


def test_original_bin_with_pickled_objects_is_refused(folders, tmp_path):
    _, single, _ = folders
    for name, obj in (("object", {"gen_embed.weight": Payload()}), ("number", {"step": 3})):
        d = tmp_path / name
        shutil.copytree(single, d)
        torch.save(obj, d / "pytorch_model.bin")
        with pytest.raises(CheckpointError, match=re.escape(str(d / "pytorch_model.bin"))):
            load_model(str(d))
