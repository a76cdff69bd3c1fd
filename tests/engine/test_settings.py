import math

import pytest

from sjdvp_core import DecodeSettings, DrafterSettings, SamplingSettings, VPSettings, WindowSettings

BAD = [
    (WindowSettings, dict(size=0), "window"),
    (WindowSettings, dict(size=129), "window"),
    (WindowSettings, dict(size=2.5), "window"),
    (WindowSettings, dict(size=16, init="diagonal"), "init"),
    (SamplingSettings, dict(top_p=0.0), "top_p"),
    (SamplingSettings, dict(top_p=1.5), "top_p"),
    (SamplingSettings, dict(temperature=0.0), "temperature"),
    (SamplingSettings, dict(temperature=-1.0), "temperature"),
    (SamplingSettings, dict(cfg_scale=-0.5), "cfg_scale"),
    (SamplingSettings, dict(cfg_scale=math.nan), "cfg_scale"),
    (SamplingSettings, dict(top_k=-1), "top_k"),
    (SamplingSettings, dict(greedy="no"), "greedy"),
    (VPSettings, dict(growth_steps=0), "vp_growth_steps"),
    (VPSettings, dict(beta=1.0), "vp_beta"),
    (VPSettings, dict(beta=-0.1), "vp_beta"),
    (VPSettings, dict(top_k=0), "vp_top_k"),
    (VPSettings, dict(strength=math.inf), "vp_strength"),
    (VPSettings, dict(strength="strong"), "vp_strength"),
    (VPSettings, dict(max_score=0.0), "vp_max_score"),
    (VPSettings, dict(lossless="no"), "vp_lossless"),
    (DrafterSettings, dict(verifier="medusa"), "verifier"),
    (DrafterSettings, dict(lantern_k=0), "lantern_k"),
    (DrafterSettings, dict(lantern_delta=1.5), "lantern_delta"),
    (DrafterSettings, dict(lantern_delta=-0.1), "lantern_delta"),
    (DrafterSettings, dict(gsd_group=0), "gsd_group"),
    (DrafterSettings, dict(gsd_max_gap=0.0), "gsd_max_gap"),
    (DrafterSettings, dict(gsd_max_distance=-1.0), "gsd_max_distance"),
    (DrafterSettings, dict(vp="yes"), "vp"),
    (DecodeSettings, dict(seed=-1), "seed"),
    (DecodeSettings, dict(batch_size=0), "batch_size"),
    (DecodeSettings, dict(window=16), "window"),
]


@pytest.mark.parametrize(
    "cls,kwargs,name", BAD, ids=[f"{c.__name__}-{n}-{list(k.values())[0]}" for c, k, n in BAD]
)
def test_invalid_setting_names_itself(cls, kwargs, name):
    with pytest.raises(ValueError, match=rf"^{name}=.* must be "):
        cls(**kwargs)


def test_valid_edges_are_accepted():
    WindowSettings(size=1), WindowSettings(size=128)
    SamplingSettings(temperature=0.0, greedy=True, top_p=1.0, cfg_scale=0.0)
    VPSettings(beta=0.0, strength=-2.0)
    (
        DrafterSettings(verifier="lantern", lantern_delta=0.0),
        DrafterSettings(verifier="gsd", gsd_group=1),
    )
    assert DrafterSettings(verifier="gsd", vp=VPSettings(), coupled=False).name == "GSD-VP"
    # coupled is the default
    assert DrafterSettings().coupled and DrafterSettings().name == "SJD coupled"
    assert (
        DrafterSettings(vp=VPSettings(strength=-0.7), coupled=True).name == "SJD-VP(-0.7) coupled"
    )
