"""Same seed, settings and device -> the same tokens as when these pins were recorded: the guard that a
restructuring of the engine changed no draw. Every method with independent and with coupled drafts,
batch 3 with CFG, on the demo model and on the toy.

Pins are (forward passes, first 16 hex digits of sha256 of the tokens). After a change that is meant to
move the random stream, re-record with `python -m tests.test_pinned_tokens` and say in the commit
which pins moved and why."""
from __future__ import annotations

import hashlib

import pytest
import torch

from sjdvp_core import DecodeSettings, DrafterSettings, SamplingSettings, VPSettings, WindowSettings, decode

DRAFTERS = {
    "sjd": DrafterSettings(),
    "sjd-vp+1": DrafterSettings(vp=VPSettings(strength=1.0)),
    "sjd-vp-1": DrafterSettings(vp=VPSettings(strength=-1.0)),
    "sjd-vp-auto": DrafterSettings(vp=VPSettings()),
    "lantern": DrafterSettings(verifier="lantern", lantern_k=31),
    "gsd": DrafterSettings(verifier="gsd"),
}
RUNS = [("ar", False)] + [(name, coupled) for name in DRAFTERS for coupled in (False, True)]


def _model(name: str):
    if name == "demo":
        from sjdvp_core.demo import load_demo
        return load_demo(), ["a red circle on grass", "a blue square on snow", "a green diamond on sand"], 16
    from sjdvp_core.models.toy import ToyGridAdapter
    return ToyGridAdapter(height=6, width=6, levels=8), [0, 1, 2], 8


def run(model: str, method: str, coupled: bool) -> tuple[int, str]:
    adapter, prompts, window = _model(model)
    drafter = DrafterSettings() if method == "ar" else DRAFTERS[method]
    settings = DecodeSettings(window=WindowSettings(1 if method == "ar" else window),
                              drafter=DrafterSettings(**{**drafter.__dict__, "coupled": coupled}),
                              sampling=SamplingSettings(cfg_scale=3.0), seed=7, batch_size=3)
    result = decode(adapter, prompts, settings)
    digest = hashlib.sha256(result.tokens.cpu().numpy().tobytes()).hexdigest()[:16]
    return result.stats.forward_passes, digest


PINS = {
    ('demo', 'ar', False): (256, '6350ca234ac09146'),
    ('demo', 'sjd', False): (164, '990879a1fdbe7b52'),
    ('demo', 'sjd', True): (124, 'a1f52210bf8d5eba'),
    ('demo', 'sjd-vp+1', False): (136, 'c7df06229fe32c3e'),
    ('demo', 'sjd-vp+1', True): (130, '645a644466884a2d'),
    ('demo', 'sjd-vp-1', False): (126, 'b020955fc3e0c6f8'),
    ('demo', 'sjd-vp-1', True): (109, '320251df8a9913ff'),
    ('demo', 'sjd-vp-auto', False): (129, 'dce30aac3904cd27'),
    ('demo', 'sjd-vp-auto', True): (116, 'fe6b58b9718cf366'),
    ('demo', 'lantern', False): (113, 'ff8838590ac8b723'),
    ('demo', 'lantern', True): (98, '63e236f2b79e06af'),
    ('demo', 'gsd', False): (111, '4245e31df7768c99'),
    ('demo', 'gsd', True): (107, '28943c20aec63a1b'),
    ('toy', 'ar', False): (41, '63a75992ac27d2fb'),
    ('toy', 'sjd', False): (15, '36e1984354ba878c'),
    ('toy', 'sjd', True): (14, '04fb49ab6d95a7de'),
    ('toy', 'sjd-vp+1', False): (15, '98f6018978b7182d'),
    ('toy', 'sjd-vp+1', True): (14, '04fb49ab6d95a7de'),
    ('toy', 'sjd-vp-1', False): (15, '6ae97b47c1fd50e1'),
    ('toy', 'sjd-vp-1', True): (13, '12595a8178c2e1b9'),
    ('toy', 'sjd-vp-auto', False): (15, 'f9efad2c33a510ca'),
    ('toy', 'sjd-vp-auto', True): (14, '04fb49ab6d95a7de'),
    ('toy', 'lantern', False): (6, 'ef1f487441f3ef02'),
    ('toy', 'lantern', True): (6, '5e8db7062e25c101'),
    ('toy', 'gsd', False): (14, '7edba60b4525ba62'),
    ('toy', 'gsd', True): (13, '3cbaf850541d307b'),
}


@pytest.mark.parametrize("model", ["demo", "toy"])
@pytest.mark.parametrize("method,coupled", RUNS)
def test_pinned_tokens(model, method, coupled):
    assert run(model, method, coupled) == PINS[(model, method, coupled)]


if __name__ == "__main__":
    torch.set_num_threads(1)
    for model in ("demo", "toy"):
        for method, coupled in RUNS:
            print(f"    ({model!r}, {method!r}, {coupled}): {run(model, method, coupled)},")
