"""The momentum statistic on hand-made verification outcomes."""
import math

import torch

from sjdvp_core.engine.stats import DecodeStats, Recorder


def test_momentum_counts_only_carried_drafts_with_a_known_direction():
    tally = Recorder(4, "cpu")
    rose = torch.tensor([[1, 1, 0, -1], [0, 1, 0, 1]], dtype=torch.int8)
    carried = torch.tensor([[True, True, True, True], [True, False, True, True]])
    accept = torch.tensor([[True, False, True, True], [False, True, True, True]])
    tally.outcomes(carried, accept, rose, carried)
    st = tally.into(DecodeStats(length=10, window=5))
    # rose & carried: (0,0) acc, (0,1) rej, (1,3) acc; not-rose & carried: (0,2) acc, (1,0) rej, (1,2) acc
    assert (st.rose_verified, st.rose_accepted, st.flat_verified, st.flat_accepted) == (3, 2, 3, 2)
    assert st.slot_verified.tolist() == [2, 1, 2, 2] and st.slot_accepted.tolist() == [1, 0, 2, 2]
    one = torch.tensor([[True]])
    tally.outcomes(one, one, torch.tensor([[1]], dtype=torch.int8), one)
    m = tally.into(st).momentum()
    assert m["accept_if_rose"] == 3 / 4 and m["accept_if_not"] == 2 / 3
    assert m["rose_share_of_accepted"] == 3 / 5


def test_momentum_without_data_is_nan():
    m = DecodeStats(length=4, window=2).momentum()
    assert all(math.isnan(v) for v in m.values())
