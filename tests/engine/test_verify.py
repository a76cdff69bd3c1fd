import torch

from sjdvp_core.engine.settings import DrafterSettings
from sjdvp_core.engine.verify import Verifier, first_rejection, latent_neighbours, model_neighbours


def test_first_rejection_counts_leading_accepts():
    accept = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert first_rejection(accept).tolist() == [2, 0, 4]


def test_sjd_ratio():
    v = Verifier(DrafterSettings(), None, 3)
    p = torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]])
    q = torch.tensor([[[0.25, 0.5, 0.25], [0.2, 0.2, 0.6]]])
    a = v.accept_prob(p, q, torch.tensor([[1, 2]]))
    assert torch.allclose(a, torch.tensor([[0.6, 1.0]]))


def test_latent_neighbours_are_nearest_first_and_cached():
    codebook = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    nb = latent_neighbours(codebook, 2)
    assert nb.tolist() == [[1, 2], [0, 2], [1, 0], [2, 1]]
    assert nb.dtype == torch.int16  # a quarter of int64: the table is kept with the model
    model = torch.nn.Linear(1, 1)  # the weights the table lives with
    cached = model_neighbours(model, codebook, 2)
    assert torch.equal(cached, nb)
    # computed once per model, whatever tensor its codebook comes in, and reused for smaller k
    assert model_neighbours(model, codebook.clone(), 1).data_ptr() == cached.data_ptr()
    assert model_neighbours(torch.nn.Linear(1, 1), codebook, 1).data_ptr() != cached.data_ptr()


def test_lantern_adds_neighbour_mass_within_delta():
    codebook = torch.tensor([[0.0], [1.0], [3.0], [10.0]])
    # draft x = 0; neighbours 1 (p=0.05) then 2 (p=0.1): cumulative 0.05, 0.15
    p = torch.tensor([[[0.1, 0.05, 0.1, 0.75]]])
    q = torch.tensor([[[0.5, 0.2, 0.2, 0.1]]])
    x = torch.tensor([[0]])
    for delta, expected in [(0.0, 0.2), (0.1, 0.3), (0.15, 0.5)]:
        v = Verifier(
            DrafterSettings(verifier="lantern", lantern_delta=delta, lantern_k=3), codebook, 4
        )
        assert torch.allclose(v.accept_prob(p, q, x), torch.tensor([[expected]]))


def test_lantern_leaves_structure_tokens_alone():
    codebook = torch.tensor([[0.0], [1.0]])
    v = Verifier(DrafterSettings(verifier="lantern", lantern_delta=0.5, lantern_k=1), codebook, 2)
    p = torch.tensor([[[0.4, 0.4, 0.2]]])
    q = torch.tensor([[[0.0, 0.0, 1.0]]])
    assert torch.allclose(v.accept_prob(p, q, torch.tensor([[2]])), torch.tensor([[0.2]]))


def test_gsd_cluster_by_rank_and_gap():
    p = torch.tensor([[[0.30, 0.25, 0.20, 0.15, 0.10]]])
    q = torch.tensor([[[0.10, 0.50, 0.20, 0.10, 0.10]]])
    x = torch.tensor([[1]])  # rank 1
    sjd = Verifier(DrafterSettings(), None, 5).accept_prob(p, q, x)
    g1 = Verifier(DrafterSettings(verifier="gsd", gsd_group=1), None, 5).accept_prob(p, q, x)
    assert torch.allclose(sjd, g1) and torch.allclose(sjd, torch.tensor([[0.5]]))
    # G = 3: ranks 0..2 -> tokens 0, 1, 2: p(C) = 0.75, q(C) = 0.8
    g3 = Verifier(DrafterSettings(verifier="gsd", gsd_group=3), None, 5).accept_prob(p, q, x)
    assert torch.allclose(g3, torch.tensor([[0.75 / 0.8]]))
    # a tight gap keeps only tokens within 0.06 of p(x) = 0.25: tokens 0 (0.30) and 2 (0.20)... and
    # x
    tight = DrafterSettings(verifier="gsd", gsd_group=5, gsd_max_gap=0.051)
    gt = Verifier(tight, None, 5).accept_prob(p, q, x)
    assert torch.allclose(gt, torch.tensor([[0.75 / 0.8]]))
    # a codebook distance filter drops far tokens
    codebook = torch.tensor([[0.0], [0.1], [5.0], [0.2], [0.3]])
    near = DrafterSettings(verifier="gsd", gsd_group=3, gsd_max_distance=1.0)
    gd = Verifier(near, codebook, 5).accept_prob(p, q, x)
    assert torch.allclose(gd, torch.tensor([[0.55 / 0.6]]))


def test_gsd_counts_a_top_ranked_draft_once():
    # x = token 0 is rank 0: the ranks below it are out of range and must not add x again
    p = torch.tensor([[[0.40, 0.35, 0.25]]])
    q = torch.tensor([[[0.30, 0.60, 0.10]]])
    v = Verifier(DrafterSettings(verifier="gsd", gsd_group=5, gsd_max_gap=0.1), None, 3)
    assert torch.allclose(v.accept_prob(p, q, torch.tensor([[0]])), torch.tensor([[0.75 / 0.9]]))


def test_verifier_table_and_method_list_agree_with_the_settings():
    """A verifier is one class in verify.VERIFIERS; the settings' names and the method list
    follow it."""
    from sjdvp_core.engine.settings import METHODS
    from sjdvp_core.engine.settings import VERIFIERS as NAMES
    from sjdvp_core.engine.verify import VERIFIERS

    assert tuple(VERIFIERS) == NAMES
    assert list(METHODS) == ["ar"] + [n + s for n in NAMES for s in ("", "-vp")]
    assert [
        Verifier(DrafterSettings(verifier=n), torch.randn(4, 2), 4).rule.name for n in NAMES
    ] == list(NAMES)
