"""The memory table (README.md and docs/memory.md, tools/memory_table.py) is the estimator's output
on each release's real architecture, and those architectures are the releases': their weights,
counted at the dtype the release stores, come to its download size."""

import importlib.util
import os
import sys

import pytest

from sjdvp_core.hub import catalogue
from sjdvp_core.models.memory import weight_need
from tests.helpers import paths

REPO = str(paths.REPO)


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location(
        "memory_table", os.path.join(REPO, "tools", "memory_table.py")
    )
    # its dataclass looks itself up
    module = sys.modules["memory_table"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("page", ["README.md", "docs/memory.md"])
def test_memory_table_is_the_estimators_output(tool, page):
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        text = f.read()
    expected = tool.readme_with(tool.table(readme=page == "README.md"), text)
    assert expected == text, "run python tools/memory_table.py --write"


def _decoder_bytes(adapter) -> int:
    return sum(t.numel() * t.element_size() for t in adapter.image_decoder.state_dict().values())


# release -> (the dtype its files store, bytes of its weight files, whether our image decoder is
# among them)
STORED = {
    "Emu3-Gen": ("fp32", catalogue.EMU3_BYTES, True),  # model + vision tokenizer
    "LlamaGen-c2i-XL-384": ("fp32", 3_099_048_319 + catalogue.VQ_DS16_BYTES, True),
    "Lumina-mGPT-7B-768": ("bf16", catalogue.LUMINA_BYTES, False),  # the VQGAN comes from elsewhere
    "Lumina-mGPT-2.0": ("bf16", catalogue.LUMINA2_BYTES, False),
}


@pytest.mark.parametrize("name", sorted(STORED))
def test_release_architectures_come_to_their_download_size(tool, name):
    release = next(r for r in tool.RELEASES if r.name == name)
    dtype, download, with_decoder = STORED[name]
    adapter = release.build()
    counted = weight_need(adapter, dtype, dtype)
    if not with_decoder:
        counted -= _decoder_bytes(adapter)
    encoder = getattr(adapter, "reference_encoder", None)  # in the files, held apart (edits)
    if encoder is not None:
        counted += sum(t.numel() * t.element_size() for t in encoder.state_dict().values())
    assert abs(counted / download - 1) < 0.002, (counted, download)  # measured: within 0.1%


def test_quantised_precisions_fit_smaller_cards(tool):
    """nf4 < int8 < bf16 for every release, the decode's share the same at each."""
    for release in tool.RELEASES:
        n = tool.needs(release)
        assert n["nf4"].total < n["int8"].total < n["bf16"].total
        assert n["nf4"].decode == n["int8"].decode == n["bf16"].decode
