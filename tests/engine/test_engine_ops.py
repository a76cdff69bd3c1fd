"""The engine's step stays cheap to launch: its op count per iteration (what a GPU launches besides
the model) and no host read inside the loop but the one per iteration (benchmarks.engine_ops
counts both ways)."""

import pytest

from benchmarks.engine_ops import OpCounter, count, model_uncounted
from sjdvp_core.demo import load_demo
from sjdvp_core.engine.decode import decode
from sjdvp_core.engine.settings import TreeSettings, method_settings


@pytest.fixture(scope="module")
def demo():
    return load_demo()


def test_coupled_sjd_vp_chain_step_is_at_most_half_the_ops_it_was(demo):
    settings = method_settings("sjd-vp", 32, demo.default_sampling, 0)
    per_iteration, _, iterations = count(demo, settings, "a red circle on grass")
    assert iterations > 20
    # 559: the same counter on the engine #22 started from (d3c8e43)
    assert per_iteration <= 559.0 / 2


class HostReads(OpCounter):
    """Counts reads of a tensor's value back to the host (.item(), bool(), int(), an index tensor as
    a subscript): on a GPU each waits for every queued kernel."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.counting and func.overloadpacket.__name__ in ("item", "_local_scalar_dense"):
            self.ops["read"] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("tree", [TreeSettings(), TreeSettings(width=6)], ids=["chain", "tree"])
def test_no_host_read_inside_the_loop(demo, tree):
    settings = method_settings("sjd-vp", 16, demo.default_sampling, 0, tree=tree)
    reads = HostReads()
    with model_uncounted(demo, reads), reads:
        result = decode(demo, "a red circle on grass", settings)
    assert result.stats.forward_passes > 20
    # setup and the final statistics only; n.tolist() is not a scalar read
    assert reads.ops["read"] <= 8
