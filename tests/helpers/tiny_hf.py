"""Shared helpers for tiny transformers model folders written as the converted hub folders are
(config.json, tokenizer.json + tokenizer_config.json, model.safetensors), and the checks every
transformers family must pass: greedy SJD == AR, and window steps with rollback == a full recompute."""

from __future__ import annotations

import json
import os

import torch

from sjdvp_core import SamplingSettings, TreeSettings, decode
from sjdvp_core.engine.settings import method_settings

# two prompts of different token lengths, so a batch of them is padded
PROMPTS = ["a red fox in the snow", "a blue sky"]
CORPUS = [
    "a red fox in the snow",
    "a blue sky over the sea",
    "a portrait of a young girl",
    "User: Assistant: draw 4*4 8*8 2*4 lowres, bad anatomy, text, blurry.",
] * 4


def byte_bpe_tokenizer(folder: str, specials: list[str], vocab_size: int = 300, **config):
    """A byte-level BPE tokenizer.json (the format of both converted checkpoints) with `specials` as
    added special tokens in the given order, plus tokenizer_config.json and special_tokens_map.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    with open(os.path.join(folder, "special_tokens_map.json"), "w") as f:
        json.dump({k: v for k, v in config.items() if k.endswith("_token")}, f)
    return tok


def write_shards(folder, state: dict, shards: int = 2) -> None:
    """state as model-0000i-of-0000n.safetensors shards (keys dealt round-robin) and their index, as
    the sharded releases are laid out."""
    from safetensors.torch import save_file

    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: state[k].contiguous() for k in names[i::shards]}
        save_file(part, os.path.join(folder, file), metadata={"format": "pt"})
        weight_map |= {k: file for k in part}
    total = sum(t.numel() * t.element_size() for t in state.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f)


def spread_weights(model: torch.nn.Module, std: float = 0.2, seed: int = 0) -> None:
    """Random weights far from the near-uniform init, so greedy argmaxes are not ties."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * std)


def assert_greedy_sjd_equals_ar(adapter, prompts, windows=(4, 16), cfg_scales=(1.0, 3.0)) -> None:
    for cfg in cfg_scales:
        sampling = SamplingSettings(cfg_scale=cfg, greedy=True, temperature=0.0)
        ar = decode(adapter, prompts, method_settings("ar", 1, sampling, batch_size=len(prompts)))
        for method in ("sjd", "sjd-vp"):
            for W in windows:
                res = decode(
                    adapter, prompts, method_settings(method, W, sampling, batch_size=len(prompts))
                )
                assert torch.equal(res.tokens, ar.tokens), (cfg, method, W)
                assert res.stats.forward_passes <= ar.stats.forward_passes
        s = method_settings(
            "sjd",
            windows[0],
            sampling,
            batch_size=len(prompts),
            tree=TreeSettings(width=3, depth=2),
        )
        assert torch.equal(decode(adapter, prompts, s).tokens, ar.tokens), (cfg, "tree")


@torch.inference_mode()
def assert_windows_match_recompute(adapter, prompts, cfg: bool, reference, steps=6, seed=0) -> None:
    """Windows of random width at per-row positions, each row accepting its own number of drafts (so
    rows drift apart); the valid logits must equal `reference(row, generated_tokens)`, a
    recompute of that row's unpadded sequence without any cache. reference returns logits [T + 1,
    V] for a row's prompt followed by T generated tokens."""
    g = torch.Generator().manual_seed(seed)
    layout, first = adapter.start(prompts, None, cfg)
    R, K, L = first.shape[0], layout.image_tokens.numel(), layout.length
    truth = layout.image_tokens[torch.randint(0, K, (R, L), generator=g)]
    forced = layout.forced >= 0
    truth[:, forced] = layout.forced[forced]
    for r in range(R):
        assert torch.allclose(first[r], reference(r, truth[r, :0])[-1], atol=1e-4)
    n = torch.ones(R, dtype=torch.long)
    for _ in range(steps):
        W = int(torch.randint(2, 7, (1,), generator=g))
        accept = torch.randint(0, W, (R,), generator=g).clamp(max=(L - n).clamp(min=0))
        # drafts, mostly wrong
        window = layout.image_tokens[torch.randint(0, K, (R, W), generator=g)]
        for r in range(R):
            window[r, : 1 + accept[r]] = truth[r, n[r] - 1 : n[r] + accept[r]]
        positions = ((n - 1)[:, None] + torch.arange(W)).clamp(max=L - 1)
        logits = adapter.forward(window, positions)
        # input at position L - 1 predicts nothing (and clamped drafts share its slot)
        for r in range(R):
            valid = min(int(accept[r]) + 1, int((positions[r] < L - 1).sum()))
            if valid == 0:
                continue
            ref = reference(r, truth[r, : n[r] + valid - 1])[-valid:]
            assert torch.allclose(logits[r, :valid], ref, atol=1e-4), (r, n[r], accept[r])
        n = (n + accept + 1).clamp(max=L)
    adapter.finish()


def variant(folder: str, tmp_path, name: str, drop=(), write=None) -> str:
    """A copy of folder without the files matching drop, with some files' text replaced (write)."""
    import shutil

    d = tmp_path / name
    shutil.copytree(folder, d, ignore=shutil.ignore_patterns(*drop))
    for f, text in (write or {}).items():
        (d / f).write_text(text)
    return str(d)


def hf_broken_folders(folder: str, tmp_path) -> list[tuple[str, str]]:
    """Copies of a transformers-format folder with one file the loader needs removed or broken, each
    with the message it must give: (folder, regex)."""

    def copy(name: str, drop=(), write=None) -> str:
        return variant(folder, tmp_path, name, drop, write)

    weights = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    cases = [
        (copy("no_tokenizer", drop=["tokenizer.json"]), r"missing tokenizer\.json"),
        (
            copy("no_weights", drop=["*.safetensors", "*.index.json"]),
            r"missing the weights \(model\.",
        ),
        (copy("bad_tokenizer", write={"tokenizer.json": "{}"}), r"tokenizer\.json: cannot be read"),
        (copy("bad_weights", write={weights[0]: "not a safetensors file"}), "cannot be loaded"),
    ]
    if os.path.isfile(os.path.join(folder, "model.safetensors.index.json")):
        cases.append((copy("no_shard", drop=[weights[-1]]), f"missing {weights[-1]}"))
    cases.append(
        (without_a_tensor(copy("partial_weights"), weights[0]), "the weights lack 1 tensors")
    )
    with open(os.path.join(folder, "config.json")) as f:
        other = json.dumps(widened(json.load(f)))
    cases.append(
        (
            copy("another_models_config", write={"config.json": other}),
            r"is stored as .* needs .*\(config\.json and the weights are of different models\)",
        )
    )
    return cases


def widened(config):
    """A config.json's sections with every intermediate_size doubled: another model's config
    beside these weights."""
    if isinstance(config, dict):
        return {k: v * 2 if k == "intermediate_size" else widened(v) for k, v in config.items()}
    return config


def without_a_tensor(folder: str, shard: str) -> str:
    """Drop one tensor from a weight file (and from the shard index, if any): an incomplete
    checkpoint."""
    from safetensors.torch import load_file, save_file

    path = os.path.join(folder, shard)
    tensors = load_file(path)
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, path, metadata={"format": "pt"})
    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            data = json.load(f)
        del data["weight_map"][dropped]
        with open(index, "w") as f:
            json.dump(data, f)
    return folder
