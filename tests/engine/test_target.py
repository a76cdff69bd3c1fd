import torch

from sjdvp_core.engine.settings import SamplingSettings
from sjdvp_core.engine.target import residual, structure_mask, top_k_filter, top_p_filter
from sjdvp_core.engine.target import target_probs as probs

INF = float("inf")


def target_probs(logits, forced, num_image, s):
    return probs(logits, structure_mask(forced, num_image, logits.shape[-1]), s)


def test_top_k_and_top_p_exact_values():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]]))
    assert top_k_filter(logits, 2).isfinite().tolist() == [[True, True, False, False]]
    assert top_k_filter(logits, 0).isfinite().all()
    assert top_p_filter(logits, 0.6).isfinite().tolist() == [[True, True, False, False]]
    assert top_p_filter(logits, 0.45).isfinite().tolist() == [[True, False, False, False]]
    assert top_p_filter(logits, 0.01).isfinite().sum() == 1  # at least one token survives
    ties = torch.log(torch.tensor([[0.4, 0.2, 0.2, 0.2]]))
    assert top_k_filter(ties, 2).isfinite().sum() == 4  # ties with the k-th are kept


def test_forcing_restriction_and_not_in_place():
    # local vocab: 3 image tokens then 1 special; slot 1 is forced to the special token
    logits = torch.tensor([[[1.0, 2.0, 3.0, 9.0], [1.0, 2.0, 3.0, 0.0]]])
    before = logits.clone()
    p = target_probs(logits, torch.tensor([[-1, 3]]), 3, SamplingSettings())
    assert torch.equal(logits, before)
    assert p[0, 0, 3] == 0 and torch.allclose(
        p[0, 0, :3], torch.tensor([1.0, 2.0, 3.0]).softmax(-1)
    )
    assert p[0, 1].tolist() == [0.0, 0.0, 0.0, 1.0]


def test_temperature_top_k_and_greedy():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 0.0]]])
    p = target_probs(logits, torch.tensor([[-1]]), 3, SamplingSettings(temperature=0.5, top_k=2))
    expected = torch.tensor([-INF, 2.0, 4.0]).softmax(-1)
    assert torch.allclose(p[0, 0, :3], expected)
    g = target_probs(
        logits, torch.tensor([[-1]]), 3, SamplingSettings(greedy=True, temperature=0.0)
    )
    assert g[0, 0].tolist() == [0.0, 0.0, 1.0, 0.0]


def test_window_vectorised_equals_per_position():
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    forced = torch.tensor([[-1, -1, 10, -1, -1], [-1, 10, -1, -1, -1], [-1] * 5])
    s = SamplingSettings(temperature=0.7, top_k=5, top_p=0.8)
    full = target_probs(logits, forced, 10, s)
    for b in range(3):
        for w in range(5):
            one = target_probs(logits[b : b + 1, w : w + 1], forced[b : b + 1, w : w + 1], 10, s)
            assert torch.allclose(full[b, w], one[0, 0])


def test_residual_is_exact_and_guarded():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.2, 0.5, 0.2, 0.1])
    assert torch.allclose(residual(p, q), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    same = residual(p, p.clone())
    assert torch.isfinite(same).all() and torch.allclose(same, p)
