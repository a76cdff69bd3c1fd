"""The momentum statistic on hand-made verification outcomes."""

import math

import torch

from sjdvp_core.engine.stats import DecodeStats, Recorder
from sjdvp_core.engine.window import FLAT, ROSE, UNKNOWN


def test_momentum_counts_only_verified_drafts_with_a_known_direction():
    tally = Recorder(4, "cpu")
    rose = torch.tensor([[ROSE, ROSE, FLAT, UNKNOWN], [FLAT, UNKNOWN, FLAT, ROSE]])
    verified = torch.tensor([[True, True, True, True], [True, True, True, False]])
    accept = torch.tensor([[True, False, True, True], [False, True, True, True]])
    tally.outcomes(verified, accept, rose)
    st = tally.into(DecodeStats(length=10, window=5))
    # rose & verified: (0,0) acc, (0,1) rej; flat & verified: (0,2) acc, (1,0) rej, (1,2) acc;
    # (1,3) rose and accepted but not verified (past the first rejection) counts nowhere
    assert (st.rose_verified, st.rose_accepted, st.flat_verified, st.flat_accepted) == (2, 1, 3, 2)
    assert st.slot_verified.tolist() == [2, 2, 2, 1] and st.slot_accepted.tolist() == [1, 1, 2, 1]
    one = torch.tensor([[True]])
    tally.outcomes(one, one, torch.tensor([[ROSE]]))
    m = tally.into(st).momentum()
    assert m["accept_if_rose"] == 2 / 3 and m["accept_if_not"] == 2 / 3
    assert m["rose_share_of_accepted"] == 2 / 4


def test_momentum_without_data_is_nan():
    m = DecodeStats(length=4, window=2).momentum()
    assert all(math.isnan(v) for v in m.values())
