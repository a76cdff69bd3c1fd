"""Train the built-in demo model: a small VQ tokenizer (LlamaGen VQ architecture, f4: 64x64 RGB ->
16x16 codes), a small LlamaGen c2i GPT over the 96 scene prompts, and a judge (a classifier of
shape, colour and background) for the prompt-match score. Seeded and resumable: each phase
checkpoints to --out and continues from there; the final weights go to sjdvp_core/demo/weights as
safetensors.

    python -m sjdvp_core.demo.train --out runs/demo            # all phases
    python -m sjdvp_core.demo.train --out runs/demo --phase gpt --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from safetensors.torch import save_file
from torch import nn
from torch.nn import functional as F

from ..models.llamagen.gpt import GPTConfig, LlamaGenGPT
from ..models.llamagen.vq import LlamaGenVQ, VQConfig
from . import scenes
from .judge import HEADS, Judge, judge_loss

WEIGHTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")
VQ_CONFIG = VQConfig(
    codebook_size=512,
    codebook_embed_dim=8,
    ch=32,
    ch_mult=[1, 2, 2],
    z_channels=64,
    num_res_blocks=1,
    norm_groups=16,
)
GPT_CONFIG = GPTConfig(
    dim=192,
    n_layer=6,
    n_head=6,
    multiple_of=64,
    num_classes=len(scenes.CLASSES),
    vocab_size=VQ_CONFIG.codebook_size,
    block_size=256,
    cls_token_num=1,
)
STEPS = {"vq": 1200, "gpt": 2500, "judge": 3000}
BATCH = {"vq": 32, "gpt": 32, "judge": 64}


def lr_at(step: int, total: int, peak: float, warmup: int = 100) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))
    )


def batch(phase: str, step: int, seed: int):
    """Fresh scenes for every step, seeded by (seed, phase, step): infinite data, reproducible."""
    phase_id = ("vq", "gpt", "judge").index(phase)
    images, classes = scenes.dataset(BATCH[phase], seed=(seed * 7919 + phase_id) * 1_000_003 + step)
    return images * 2 - 1, classes


class Checkpoint:
    def __init__(self, out: str, phase: str):
        self.path = os.path.join(out, f"{phase}.pt")

    def load(self, model, opt) -> int:
        if not os.path.exists(self.path):
            return 0
        state = torch.load(self.path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        return int(state["step"])

    def save(self, model, opt, step: int) -> None:
        tmp = self.path + ".tmp"
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, tmp)
        os.replace(tmp, self.path)


class FactorisedClasses(nn.Module):
    """Training-time parametrisation of the c2i class table as shape + colour + background
    embeddings, each seen far more often than one of 96 classes (a 96-row table barely learned in
    our budget: its conditional first-token loss stayed above the null class's). Materialised
    into the plain LlamaGen table for export, so the shipped model is an ordinary c2i LlamaGen."""

    def __init__(self, dim: int):
        super().__init__()
        self.parts = nn.ModuleList(nn.Embedding(n, dim) for n in HEADS)
        self.null = nn.Parameter(torch.zeros(dim))
        for p in (*self.parts.parameters(), self.null):
            nn.init.normal_(p, std=0.02)

    def table(self) -> torch.Tensor:
        rows = sum(part.weight[scenes.CLASS_PARTS[:, i]] for i, part in enumerate(self.parts))
        return torch.cat([rows, self.null[None]])  # [num_classes + 1, dim]


class DemoGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.gpt = LlamaGenGPT(GPT_CONFIG)
        self.classes = FactorisedClasses(GPT_CONFIG.dim)

    def forward(self, classes: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.gpt(self.classes.table()[classes][:, None], tokens)

    def materialise(self) -> LlamaGenGPT:
        with torch.no_grad():
            self.gpt.cls_embedding.embedding_table.weight.copy_(self.classes.table())
        return self.gpt


def vq_step(vq: LlamaGenVQ, images, usage) -> torch.Tensor:
    z = F.normalize(vq.encode_latent(images), dim=1)  # [B, D, h, w]
    codes = vq.quantize.nearest(z)
    zq = vq.quantize.lookup(codes)
    usage += torch.bincount(codes.flatten(), minlength=usage.numel())
    codebook_loss = (zq - z.detach()).pow(2).mean() + 0.25 * (zq.detach() - z).pow(2).mean()
    recon = vq.decode_latent(z + (zq - z).detach())
    return F.mse_loss(recon, images) + 0.5 * F.l1_loss(recon, images) + codebook_loss, z


def restart_dead_codes(vq: LlamaGenVQ, usage, z, g) -> int:
    """Codes unused since the last restart are moved onto random current encoder outputs."""
    dead = (usage == 0).nonzero().flatten()
    if len(dead):
        pool = z.detach().permute(0, 2, 3, 1).reshape(-1, z.shape[1])
        pick = torch.randint(len(pool), (len(dead),), generator=g)
        vq.quantize.embedding.weight.data[dead] = pool[pick]
    usage.zero_()
    return len(dead)


def train_phase(phase: str, out: str, seed: int, log_every: int = 50):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    total = STEPS[phase]
    vq = LlamaGenVQ(VQ_CONFIG)
    if phase == "vq":
        model, peak = vq, 1e-3
    else:
        vq.load_state_dict(torch.load(os.path.join(out, "vq.pt"), weights_only=True)["model"])
        vq.eval().requires_grad_(False)
        model, peak = (DemoGPT(), 1e-3) if phase == "gpt" else (Judge(), 2e-3)
    opt = torch.optim.AdamW(
        model.parameters(), lr=peak, weight_decay=0.05 if phase == "gpt" else 0.0, betas=(0.9, 0.95)
    )
    ckpt = Checkpoint(out, phase)
    start = ckpt.load(model, opt)
    usage = torch.zeros(VQ_CONFIG.codebook_size, dtype=torch.long)
    t0, running = time.time(), 0.0
    for step in range(start, total):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, total, peak)
        images, classes = batch(phase, step, seed)
        if phase == "vq":
            loss, z = vq_step(model, images, usage)
        elif phase == "gpt":
            with torch.no_grad():
                tokens = vq.encode(images).flatten(1)
            drop = torch.rand(len(classes), generator=g) < 0.1  # CFG: learn the null class
            logits = model(torch.where(drop, GPT_CONFIG.num_classes, classes), tokens)
            loss = F.cross_entropy(logits.reshape(-1, GPT_CONFIG.vocab_size), tokens.flatten())
        else:
            loss = judge_loss(model, images, classes)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        running += loss.item()
        if phase == "vq" and (step + 1) % 50 == 0:
            restart_dead_codes(model, usage, z, g)
        if (step + 1) % log_every == 0 or step + 1 == total:
            print(
                f"{phase} step {step + 1}/{total} loss {running / log_every:.4f} "
                f"{(time.time() - t0) / (step + 1 - start):.2f}s/step",
                flush=True,
            )
            running = 0.0
            ckpt.save(model, opt, step + 1)
    ckpt.save(model, opt, total)
    return model


def export(out: str) -> None:
    """Checkpoints -> sjdvp_core/demo/weights/*.safetensors with their configs as metadata."""
    os.makedirs(WEIGHTS, exist_ok=True)
    for phase, config in (("vq", VQ_CONFIG), ("gpt", GPT_CONFIG), ("judge", None)):
        state = torch.load(os.path.join(out, f"{phase}.pt"), weights_only=True)["model"]
        if phase == "gpt":
            demo = DemoGPT()
            demo.load_state_dict(state)
            state = demo.materialise().state_dict()
        meta = {"config": json.dumps(config.to_dict())} if config is not None else {}
        save_file(
            {k: v.contiguous() for k, v in state.items()},
            os.path.join(WEIGHTS, f"demo_{phase}.safetensors"),
            meta,
        )
    print("exported to", WEIGHTS)


def main(out: str = "runs/demo", phase: str = "all", seed: int = 0, threads: int | None = None):
    if threads:
        torch.set_num_threads(threads)
    os.makedirs(out, exist_ok=True)
    for p in {"all": ["vq", "gpt", "judge"], "export": []}.get(phase, [phase]):
        t = time.time()
        train_phase(p, out, seed)
        print(f"{p} done in {(time.time() - t) / 60:.1f} min", flush=True)
    if phase in ("all", "export"):
        export(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", default="runs/demo", help="checkpoint folder (resumes from it)")
    ap.add_argument("--phase", default="all", choices=["all", "vq", "gpt", "judge", "export"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads (1 leaves a core free)"
    )
    main(**vars(ap.parse_args()))
