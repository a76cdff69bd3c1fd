"""GPU check, for sessions lent a GPU: every family at real size with random bf16 weights (no download),
through our adapters' real cache and mask code.

1. Forward time of a window of W tokens (1 / 16 / 32 / 64) with CFG rows (R = 2) at mid-image: the premise
   of speculative decoding on a GPU is that t(W) / t(1) stays near 1.
2. The engine's own cost per iteration (targets, verification, drafting: plain, coupled, coupled + VP
   auto, and the last through torch.compile, DecodeSettings.compile) at each family's image vocabulary,
   with a model that costs nothing, against 1.
3. Wall-clock on the demo model: AR vs SJD / SJD-VP (coupled) side by side.

    python -m benchmarks.gpu_check --out gpu_check.json            # on the GPU machine
    python -m benchmarks.gpu_check --tiny                           # the same code path, tiny, on a CPU
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
from dataclasses import replace

import torch

from sjdvp_core import DecodeSettings, DrafterSettings, SamplingSettings, VPSettings, WindowSettings, decode
from sjdvp_core.engine.adapter import ModelAdapter, TokenLayout
from sjdvp_core.models.hf_adapter import HFAdapter, dtype_kwarg
from sjdvp_core.timing import interleaved

WINDOWS = (1, 16, 32, 64)


def hf_models(tiny: bool):
    """(name, model, lm, text config, head, image tokens, image grid h, w): real-size configs from the
    releases' config.json values, or tiny ones for a CPU dry run."""
    from transformers import (
        ChameleonConfig,
        ChameleonForConditionalGeneration,
        Emu3Config,
        Emu3ForConditionalGeneration,
        JanusConfig,
        JanusForConditionalGeneration,
    )
    s = (lambda real, small: small if tiny else real)  # noqa: E731
    text = dict(hidden_size=s(4096, 64), intermediate_size=s(11008, 128), num_hidden_layers=s(32, 2),
                num_attention_heads=s(32, 4), num_key_value_heads=s(32, 4))
    lumina = ChameleonConfig(vocab_size=65536, max_position_embeddings=10240, qk_layernorm=True,
                             vocabulary_map={"<image>": 8711}, **text)
    emu3 = Emu3Config(vocabulary_map={"<|extra_200|>": 151846, "<image>": 151851},
                      text_config=dict(vocab_size=184622, max_position_embeddings=9216,
                                       **{**text, "intermediate_size": s(14336, 128), "num_key_value_heads": s(8, 2)}))
    janus = JanusConfig(text_config=dict(vocab_size=102400, max_position_embeddings=16384,
                                         **{**text, "num_hidden_layers": s(30, 2)}),
                        vq_config=dict(projection_dim=s(4096, 64), image_token_embed_dim=s(4096, 64)))
    for name, cls, config, grid, K in (("Lumina-mGPT 7B (768 px)", ChameleonForConditionalGeneration, lumina, 48, 8192),
                                       ("Emu3-Gen 8B (720 px)", Emu3ForConditionalGeneration, emu3, 90, 32768),
                                       ("Janus-Pro 7B (384 px)", JanusForConditionalGeneration, janus, 24, 16384)):
        yield name, cls, config, s(grid, 10), K


class Probe(HFAdapter):
    """An HFAdapter with a random prompt; head = the family's output projection."""
    def __init__(self, model, lm, config, head, K, grid, device):
        layout = TokenLayout.raster(torch.arange(K), grid, grid, row_end=K)
        super().__init__(model, lm, config, layout, 0, device)
        self._head = head

    def prompt_ids(self, conditions, negatives, cfg):
        return [list(range(1, 65))] * (2 * len(conditions) if cfg else len(conditions))

    def head(self, hidden):
        return self._head(hidden)


def build(cls, config, dtype, device):
    with torch.device("meta"):
        model = cls._from_config(config, **dtype_kwarg(dtype))
    model = model.to_empty(device=device)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    return model.eval()


def timed(fn, repeats: int) -> float:
    """Median seconds of fn() over repeats, after a warm-up, synchronising the GPU."""
    return interleaved({"fn": fn}, repeats)["fn"].median


@torch.inference_mode()
def forward_times(tiny: bool, device, dtype, repeats: int) -> list[dict]:
    rows = []
    for name, cls, config, grid, K in hf_models(tiny):
        model = build(cls, config, dtype, device)
        if hasattr(model, "model") and hasattr(model.model, "language_model"):          # Janus
            lm, head, text = model.model.language_model, model.model.generation_head, config.text_config
        elif hasattr(model.model, "text_model"):                                          # Emu3
            lm, head, text = model.model.text_model, model.lm_head, config.text_config
        else:                                                                             # Chameleon
            lm, head, text = model.model, model.lm_head, config
        probe = Probe(model, lm, text, head, K, grid, device)
        probe.start([None], None, True)
        mid = min(probe.layout.length // 2, probe.layout.length - max(WINDOWS))
        embed_ids = torch.randint(0, K, (2, 64), device=device)
        t = {}
        for W in WINDOWS:
            positions = mid + torch.arange(W, device=device).expand(2, W)
            tokens = embed_ids[:, :W]
            t[W] = timed(lambda probe=probe, tokens=tokens, positions=positions: probe.forward(tokens, positions),
                         repeats)
        rows.append(dict(model=name, tokens=probe.layout.length,
                         **{f"ms_W{W}": round(1000 * t[W], 2) for W in WINDOWS},
                         **{f"ratio_W{W}": round(t[W] / t[1], 3) for W in WINDOWS[1:]}))
        print(rows[-1], flush=True)
        probe.finish()
        del model, probe
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


class FreeModel(ModelAdapter):
    """Logits that cost (almost) nothing, so a decode's time is the engine's own."""
    family = "free model"

    def __init__(self, K, grid, device):
        self.device = torch.device(device)
        self.layout = TokenLayout.raster(torch.arange(K), grid, grid, row_end=K)
        self.default_sampling = SamplingSettings(cfg_scale=3.0, top_k=2000)
        self.module = torch.nn.Module()
        self.V = K + 1
        self.gen = torch.Generator(device=self.device).manual_seed(0)
        self.table = torch.randn(8, self.V, device=self.device) * 3

    def start(self, conditions, negatives, cfg, scratch=0):
        return self.layout, self.table[:2 * len(conditions) if cfg else len(conditions)].clone()

    def forward(self, tokens, positions):
        return self.table[(positions + tokens) % 8]


def _ms_per_iteration(runs, *phases: str) -> float:
    """The median over decodes of the time their phases (draft, verify, step: DecodeStats.time_*) took per
    iteration, in ms."""
    return round(1000 * statistics.median(sum(getattr(r.stats, f"time_{p}") for p in phases)
                                          / (r.stats.forward_passes - 1) for r in runs), 3)


MODES = {"cuda": ("default", "reduce-overhead"), "cpu": ("default",)}   # torch.compile modes timed per device


def engine_times(tiny: bool, device, repeats: int = 3) -> list[dict]:
    """Engine ms per iteration (draft and verify phases, or the compiled step's one), the median over `repeats`
    seeds per row."""
    rows = []
    drafters = {"sjd": DrafterSettings(coupled=False), "sjd coupled": DrafterSettings(coupled=True),
                "sjd-vp auto coupled": DrafterSettings(vp=VPSettings(), coupled=True)}
    last = list(drafters.items())[-1]     # the default drafter is also timed with the compiled step
    for name, K, grid in (("Lumina-mGPT", 8192, 48), ("Emu3", 32768, 90), ("Janus-Pro", 16384, 24)):
        model = FreeModel(K, 8 if tiny else grid, device)
        eager = None
        for (label, drafter), mode in [(d, None) for d in drafters.items()] + [(last, m) for m in MODES[device.type]]:
            s = DecodeSettings(window=WindowSettings(32), drafter=drafter, sampling=model.default_sampling,
                               compile=mode is not None)
            os.environ["SJDVP_COMPILE_MODE"] = "" if mode in (None, "default") else mode
            torch._dynamo.reset()
            skips = torch._dynamo.utils.counters["inductor"]["cudagraph_skips"]
            try:
                if mode is not None:
                    decode(model, [None], s)          # compiles (not timed)
                runs = [decode(model, [None], replace(s, seed=seed), timing=True) for seed in range(repeats)]
            except Exception as e:                    # an experimental mode may fail on this device: report it
                rows.append(dict(vocab=name, drafter=label, compiled=mode, error=f"{type(e).__name__}: {e}"[:500]))
                print(rows[-1], flush=True)
                continue
            finally:
                os.environ.pop("SJDVP_COMPILE_MODE")
            res = runs[0]
            eager = res.tokens if mode is None else eager
            per_iteration = functools.partial(_ms_per_iteration, runs)
            iters = res.stats.forward_passes - 1
            rows.append(dict(vocab=name, drafter=label, compiled=mode, iterations=iters,
                             same_tokens_as_eager=None if mode is None else bool(torch.equal(res.tokens, eager)),
                             engine_ms_per_iteration=per_iteration("draft", "verify", "step"),
                             draft_ms=per_iteration("draft"), verify_ms=per_iteration("verify"),
                             compiled_step_ms=per_iteration("step"),
                             # graphs inductor ran without CUDA graphs under reduce-overhead (mutated inputs...)
                             cudagraph_skips=torch._dynamo.utils.counters["inductor"]["cudagraph_skips"] - skips))
            print(rows[-1], flush=True)
    return rows


def demo_wall_clock(device) -> list[dict]:
    from .compare_methods import main as compare
    out = compare(model="demo", windows=(16, 32), seeds=2, prompts=4, methods=("ar", "sjd", "sjd-vp", "gsd-vp"),
                  coupling=("off", "on"), repeats=3, device=str(device))
    return [{k: r[k] for k in ("method", "window", "coupled", "step_compression", "latency_speedup", "wall_s")}
            for r in out]


def main(tiny=False, out=None, repeats=10, skip_demo=False):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    report = dict(device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu", tiny=tiny,
                  forward=forward_times(tiny, device, dtype, repeats),
                  engine=engine_times(tiny, device, max(1, repeats // 3)))
    if not skip_demo:
        report["demo"] = demo_wall_clock(device)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="tiny configs: a dry run of the same code on a CPU")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--skip-demo", dest="skip_demo", action="store_true")
    ap.add_argument("--out")
    main(**vars(ap.parse_args()))
