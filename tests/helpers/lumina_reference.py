"""Upstream's Lumina-mGPT generation (1.0 and 2.0 alike), the reference both families' tests
compare against: its MultiModalLogitsProcessor's allowed tokens, its unbatched CFG loop, and the
window steps with rollback against a recompute of the model's own forward without a cache."""

from __future__ import annotations

import torch

from sjdvp_core import decode
from sjdvp_core.engine.settings import SamplingSettings, method_settings
from sjdvp_core.models.lumina.adapter import IMAGE_END, ROW_END
from tests.helpers.tiny_hf import PROMPTS, assert_windows_match_recompute


def upstream_allowed(tok, image_ids, height, width, length):
    """Upstream's MultiModalLogitsProcessor by tokens since the resolution tokens: [length] allowed
    ids."""
    allowed = []
    for j in range(length):
        if (j + 1) % (width + 1) == 0:
            allowed.append([tok.id(ROW_END)])
        elif j + 1 == (width + 1) * height + 1:
            allowed.append([tok.id(IMAGE_END)])
        else:
            allowed.append(image_ids)
    return allowed


@torch.inference_mode()
def assert_ar_equals_upstream_unbatched_cfg(adapter, prompt: str, cfg: float) -> None:
    """Upstream's loop (1.0 and 2.0 alike): the guidance branch is a separate sequence from
    <racm3:break> on (own positions from 0), mixed as u + cfg (c - u), then the row-end /
    end-of-image / image-only constraint."""
    model = adapter.model
    cond, uncond = (torch.tensor(r) for r in adapter.prompt_ids([prompt], None, cfg=True))
    image_ids = sorted(adapter.layout.image_tokens.tolist())
    rows, cols = adapter.layout.grid.shape
    allowed = upstream_allowed(adapter.tokenizer, image_ids, rows, cols, adapter.layout.length)

    def logits(ids):
        return model.lm_head(model.model(input_ids=ids[None]).last_hidden_state[0, -1]).float()

    for step in allowed:
        c, u = logits(cond), logits(uncond)
        mixed = u + cfg * (c - u)
        token = torch.tensor(step)[mixed[step].argmax()]
        cond, uncond = torch.cat([cond, token[None]]), torch.cat([uncond, token[None]])
    sampling = SamplingSettings(cfg_scale=cfg, greedy=True, temperature=0.0)
    ours = decode(adapter, [prompt], method_settings("sjd", 8, sampling))
    assert torch.equal(ours.tokens[0], uncond[3:])


def assert_lumina_windows_match_recompute(adapter) -> None:
    model, rows = adapter.model, adapter.prompt_ids(PROMPTS, None, cfg=True)

    def reference(r, generated):
        ids = torch.cat([torch.tensor(rows[r]), generated])
        hidden = model.model(input_ids=ids[None]).last_hidden_state
        return model.lm_head(hidden[0, len(rows[r]) - 1 :]).float()

    assert_windows_match_recompute(adapter, PROMPTS, True, reference)
