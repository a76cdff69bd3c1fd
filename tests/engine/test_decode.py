"""The loop's invariants on the toy model: greedy == AR token for token, W = 1 is AR, determinism,
independent batch rows, structure tokens where the layout puts them, progress and abort."""

from dataclasses import replace

import pytest
import torch

from benchmarks.toy import ToyGridAdapter
from sjdvp_core import (
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    VPSettings,
    WindowSettings,
    decode,
)
from sjdvp_core.engine.drafting import copy_sources
from sjdvp_core.engine.window import LocalLayout
from tests.helpers.toy_reference import ar_greedy

TOY = ToyGridAdapter(height=6, width=6, levels=4, sharpness=6.0, seed=1)
DRAFTERS = {
    "sjd": DrafterSettings(coupled=False),
    "sjd-vp": DrafterSettings(vp=VPSettings(growth_steps=1, top_k=8), coupled=False),
    "lantern-0": DrafterSettings(verifier="lantern", lantern_delta=0.0, coupled=False),
    "gsd-1": DrafterSettings(verifier="gsd", gsd_group=1, coupled=False),
    "sjd+c": DrafterSettings(coupled=True),
    "sjd-vp+c": DrafterSettings(
        vp=VPSettings(growth_steps=1, top_k=8, strength=-0.5), coupled=True
    ),
    "sjd+cont": DrafterSettings(continuation=True),
}


def settings(W, drafter, cfg=1.0, batch=1, seed=0, greedy=False, init="random", **sampling):
    return DecodeSettings(
        window=WindowSettings(W, init=init),
        drafter=drafter,
        seed=seed,
        batch_size=batch,
        sampling=SamplingSettings(cfg_scale=cfg, greedy=greedy, **sampling),
    )


@pytest.mark.parametrize("drafter", DRAFTERS, ids=list(DRAFTERS))
@pytest.mark.parametrize("cfg", [1.0, 2.5])
@pytest.mark.parametrize("W", [1, 2, 4, 16, 64])
def test_greedy_equals_ar(W, cfg, drafter):
    classes = [0, 3, 1]
    expected = torch.stack([ar_greedy(TOY, c, cfg) for c in classes])
    for batch in (1, 3):
        res = decode(
            TOY,
            classes[:batch],
            settings(W, DRAFTERS[drafter], cfg, batch, greedy=True, temperature=0.0),
        )
        assert torch.equal(res.tokens, expected[:batch])


@pytest.mark.parametrize("init", ["random", "repeat_left", "repeat_above"])
def test_draft_inits_keep_greedy_exact_and_compress(init):
    res = decode(TOY, 2, settings(16, DRAFTERS["sjd"], greedy=True, temperature=0.0, init=init))
    assert torch.equal(res.tokens[0], ar_greedy(TOY, 2))
    assert res.stats.forward_passes < TOY.layout.length


@pytest.mark.parametrize("scheme", ["repeat_left", "repeat_above"])
def test_fresh_drafts_copy_the_nearest_known_cell(scheme):
    """The copy table against walking the layout: with positions before e known, position e + d
    copies the cell above it, or the one above that while unknown (repeat_above), else the last
    known cell (row ends in between)."""
    local = LocalLayout(TOY.layout, 18, "cpu")
    sources = copy_sources(scheme, local, 16)
    for e in range(sources.shape[0]):
        left = int(local.last_cell[max(e - 1, 0)])
        for d in range(16):
            src = (
                int(local.above[min(e + d, sources.shape[0] - 1)])
                if scheme == "repeat_above"
                else -1
            )
            while src >= e:
                src = int(local.above[src])
            assert int(sources[e, d]) == (src if src >= 0 else left), (e, d)


def test_window_one_is_plain_ar():
    res = decode(TOY, 1, settings(1, DRAFTERS["sjd"], top_k=6))
    # one pass per token up to the last image cell; the forced row end and end of image after it
    # need none
    assert res.stats.forward_passes == int(TOY.layout.grid.max()) + 1 == TOY.layout.length - 2
    assert all(int(m) == 1 for m in torch.cat(res.stats.committed_per_iter))


def test_same_seed_same_tokens_other_seed_differs():
    for name in ("sjd", "sjd-vp"):
        a = decode(TOY, 1, settings(8, DRAFTERS[name], cfg=2.0, batch=2, seed=7))
        b = decode(TOY, 1, settings(8, DRAFTERS[name], cfg=2.0, batch=2, seed=7))
        c = decode(TOY, 1, settings(8, DRAFTERS[name], cfg=2.0, batch=2, seed=8))
        assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens, c.tokens)


def test_structure_tokens_land_where_the_layout_says():
    res = decode(TOY, 0, settings(16, DRAFTERS["sjd-vp"], batch=4, top_k=5))
    forced = TOY.layout.forced
    assert torch.equal(res.tokens[:, forced >= 0], forced[forced >= 0].expand(4, -1))
    assert torch.isin(res.tokens[:, forced < 0], TOY.image_tokens).all()
    assert torch.equal(
        TOY.image_tokens[res.codes].flatten(1), res.tokens[:, TOY.layout.grid.flatten()]
    )


def test_batch_rows_advance_independently_and_count_passes():
    res = decode(TOY, [0, 1, 2, 3], settings(16, DRAFTERS["sjd"], batch=4, top_k=5))
    st = res.stats
    assert st.forward_passes == int(st.row_forward_passes.max())
    assert len(set(st.row_forward_passes.tolist())) > 1  # rows took different numbers of passes
    it = st.commit_iter
    assert (it >= 0).all() and (it.diff(dim=1) >= 0).all()  # committed left to right, each once
    # the first token, and the forced tail, take no pass
    per_row = torch.stack(st.committed_per_iter).sum(0)
    assert per_row.tolist() == [TOY.layout.length - 3] * 4


def test_progress_reports_and_can_abort():
    seen = []

    def progress(done, total, codes):
        seen.append((done, total, int((codes >= 0).sum())))

    decode(TOY, 0, settings(8, DRAFTERS["sjd"], batch=2), progress=progress)
    dones = [d for d, _, _ in seen]
    assert dones == sorted(dones) and dones[-1] == seen[-1][1] == 2 * TOY.layout.length
    cells, L = TOY.layout.grid.numel(), TOY.layout.length
    # structure tokens are not cells
    assert all(k <= d and d - k <= 2 * (L - cells) for d, _, k in seen)
    assert seen[-1][2] == 2 * cells

    class Stop(Exception):
        pass

    def abort(done, total, partial):
        if done > 10:
            raise Stop

    with pytest.raises(Stop):
        decode(TOY, 0, settings(8, DRAFTERS["sjd"]), progress=abort)
    # the adapter is reusable after an abort
    assert decode(TOY, 0, settings(8, DRAFTERS["sjd"], seed=3)).tokens.shape == (
        1,
        TOY.layout.length,
    )


def test_conditions_per_image_must_match_batch():
    with pytest.raises(ValueError, match="conditions"):
        decode(TOY, [0, 1], settings(4, DRAFTERS["sjd"], batch=3))
    with pytest.raises(ValueError, match="settings is a builtins.dict: give a .*DecodeSettings"):
        decode(TOY, 0, {"seed": 1})


def test_logits_that_overflowed_say_which_precision_to_load():
    """A model overflowing at fp16 gives NaN logits, which would draw token 0 everywhere (a flat
    image)."""

    class Overflowing(ToyGridAdapter):
        def start(self, conditions, negatives, cfg, scratch=0):
            layout, logits = super().start(conditions, negatives, cfg, scratch)
            return layout, torch.full_like(logits, float("nan"))

    with pytest.raises(ValueError, match="logits are NaN.*load it in bf16 or fp32"):
        decode(Overflowing(height=2, width=2), 0, settings(4, DRAFTERS["sjd"]))
    # finite logits that a tiny temperature scales past float's range: the same flat image, refused
    # too
    cold = DecodeSettings(window=WindowSettings(4), sampling=SamplingSettings(temperature=1e-40))
    with pytest.raises(
        ValueError, match="temperature=1e-40 with cfg_scale=1 scales the logits past float's range"
    ):
        decode(ToyGridAdapter(height=2, width=2), 0, cold)


def test_relaxed_verifier_without_codebook_says_what_to_do():
    class NoCodebook(ToyGridAdapter):
        def codebook(self):
            return None

    with pytest.raises(ValueError, match="codebook.*verifier='sjd'"):
        decode(NoCodebook(height=2, width=2), 0, settings(4, DrafterSettings(verifier="lantern")))


@pytest.mark.parametrize("drafter", ["sjd", "sjd+c", "auto+c"])
def test_state_bytes_is_what_the_window_really_holds(drafter, monkeypatch):
    """The estimate, against the bytes of the per-vocabulary tensors of the window a decode holds
    after a step (the estimate doubles them for one iteration's temporaries)."""
    from dataclasses import fields

    from sjdvp_core.engine.budget import state_bytes
    from sjdvp_core.engine.drafting import Drafter

    chosen = {
        "sjd": DrafterSettings(),
        "sjd+c": DrafterSettings(coupled=True),
        "auto+c": DrafterSettings(vp=VPSettings(), coupled=True),
    }[drafter]
    held = []
    redraft = Drafter.redraft
    monkeypatch.setattr(
        Drafter, "redraft", lambda self, *a, **k: held.append(redraft(self, *a, **k)) or held[-1]
    )
    s = settings(32, chosen, batch=2)
    decode(TOY, [0, 1], s)
    window = held[0]
    tensors = [getattr(window, f.name) for f in fields(window)] + [
        window.history.pbar,
        window.history.prev,
        window.history.growth,
    ]
    vocab = TOY.layout.image_tokens.numel() + TOY.layout.special_tokens.numel()
    per_vocab = sum(
        t.numel() * t.element_size()
        for t in tensors
        if isinstance(t, torch.Tensor) and t.shape[-1] == vocab
    )
    assert state_bytes(s, TOY.layout) == 2 * per_vocab


def test_tokens_scored_per_forward_count_the_window():
    """What a pass costs on a CPU: AR scores one token per forward, a window of W at most W."""
    ar = decode(TOY, 0, settings(1, DRAFTERS["sjd"])).stats
    assert ar.tokens_scored == ar.forward_passes - 1 and ar.tokens_per_forward == 1
    sjd = decode(TOY, 0, settings(8, DRAFTERS["sjd"])).stats
    assert 1 < sjd.tokens_per_forward <= 8


def test_decode_bytes_count_lantern_s_neighbour_table_until_it_is_built():
    """LANTERN holds a [codes, k] table of each code's nearest codes, built in chunks on its first
    decode and kept with the model: the estimate counts it as built (it was missing: about 2 GB
    on Emu3's 32768 codes at the widget's largest k), and not again once it is held."""
    from sjdvp_core.engine.budget import decode_bytes
    from sjdvp_core.engine.verify import latent_neighbours, neighbour_bytes

    toy = ToyGridAdapter(height=4, width=4, levels=4)
    s = settings(8, DrafterSettings(verifier="lantern", lantern_k=5))
    plain = settings(8, DrafterSettings())
    codes = toy.layout.image_tokens.numel()
    assert decode_bytes(toy, s) - decode_bytes(toy, plain) == neighbour_bytes(codes, 5)
    decode(toy, [0], s)
    assert decode_bytes(toy, s) == decode_bytes(toy, plain)  # held with the model now
    # rebuilt
    assert decode_bytes(toy, replace(s, drafter=replace(s.drafter, lantern_k=9))) > decode_bytes(
        toy, s
    )
    table = latent_neighbours(torch.randn(codes, 3), 5)
    assert 2 * table.numel() * table.element_size() < neighbour_bytes(codes, 5)
    assert neighbour_bytes(32768, 16000) > 2 * 32768 * 16000 * 2 > 2e9  # Emu3, int16, at k = 16000
