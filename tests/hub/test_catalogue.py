"""Every catalogue entry against a recorded listing of its real repositories
(tests/data/hub_listings.json: file names and sizes as the Hub's pages showed them, with where
each was read): each allow pattern takes at least one real file, through the same selection the
downloader runs, and the entry's size is the sum of the files it takes (exact where the listing
has bytes, shown with "~" where it has the Hub's rounding)."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from sjdvp_core.hub import catalogue
from sjdvp_core.hub.download import DownloadError, select
from tests.helpers.paths import TESTS

LISTINGS = json.load(open(TESTS / "data" / "hub_listings.json"))["repos"]
UNITS = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}


def bounds(size: int | str | dict) -> tuple[int, int]:
    """A listed size -> (smallest, largest) byte count it can stand for: exact bytes, the Hub's
    display (three significant figures, trailing zeros dropped: "5 GB" is 4.995-5.005 GB), or an
    estimate where no page showed the size ({"estimated": bytes, "from": why}: -10% to +25%)."""
    if isinstance(size, int):
        return size, size
    if isinstance(size, dict):
        assert size["from"], "an estimate says what it rests on"
        return int(size["estimated"] * 0.9), int(size["estimated"] * 1.25)
    value, unit = size.split()
    v, scale = Decimal(value), UNITS[unit]
    if unit == "B":
        return int(v), int(v)
    half = Decimal(5) * Decimal(10) ** (v.adjusted() - 3)  # half a unit in the third figure
    return int((v - half) * scale), int((v + half) * scale)


def taken(entry: catalogue.Entry) -> list[tuple[str, str]]:
    """(repository, file) for every file the entry downloads, as the downloader selects them."""
    out = []
    for src in entry.sources:
        assert src.repo in LISTINGS, (
            f"{src.repo}: no recorded listing (add it to tests/data/hub_listings.json)"
        )
        out += [(src.repo, name) for name in select(src, LISTINGS[src.repo]["files"], src.repo)]
    return out


def test_bounds_of_the_hub_display():
    assert bounds(287_920_306) == (287_920_306, 287_920_306) and bounds("346 B") == (346, 346)
    assert bounds("4.18 GB") == (4_175_000_000, 4_185_000_000) and bounds("5 GB") == (
        4_995_000_000,
        5_005_000_000,
    )
    assert bounds("53 kB") == (52_950, 53_050) and bounds("444 MB") == (443_500_000, 444_500_000)
    assert bounds({"estimated": 1000, "from": "parameters x 4 bytes"}) == (900, 1250)


LISTED = [e for e in catalogue.ENTRIES if not e.estimate]
UNLISTED = [e for e in catalogue.ENTRIES if e.estimate]


@pytest.mark.parametrize("entry", UNLISTED, ids=lambda e: e.name)
def test_an_unlisted_entry_says_what_its_size_rests_on_and_requires_only_what_is_sure(entry):
    """A release no stored Hub page lists (Janus-4o-7B, Lumina-mGPT-2.0-Omni): shown with '~', its
    size's basis named, and from its own repository only the files every save of its code writes
    required (the weights are taken in whatever form the repository holds; the loader checks the
    folder after). A listed repository beside it (MoVQGAN) is checked as any."""
    unlisted = [s for s in entry.sources if s.repo not in LISTINGS]
    assert entry.approx and entry.estimate and unlisted
    for source in unlisted:
        assert set(source.files) <= {"config.json", "tokenizer.json"}
        assert {"model-*.safetensors", "pytorch_model-*.bin"} <= set(source.optional)
    for source in entry.sources:
        if source not in unlisted:
            assert select(source, LISTINGS[source.repo]["files"], source.repo)


@pytest.mark.parametrize("entry", LISTED, ids=lambda e: e.name)
def test_entry_matches_its_real_repositories(entry):
    files = taken(entry)
    lo = sum(bounds(LISTINGS[repo]["files"][name])[0] for repo, name in files)
    hi = sum(bounds(LISTINGS[repo]["files"][name])[1] for repo, name in files)
    assert lo <= entry.size <= hi, (
        f"{entry.name}: {entry.size:,} bytes, the listing says {lo:,}-{hi:,}"
    )
    assert entry.approx == (lo != hi), (
        f"{entry.name}: shown {'with' if entry.approx else 'without'} '~'"
    )
    if entry.model:
        assert entry.model in [name for _, name in files]


def test_a_pattern_matching_nothing_in_the_real_listing_is_caught():
    """Janus-Pro-1B holds one pytorch_model.bin and no index: the pattern that once asked for one
    fails."""
    janus_1b = catalogue.Source(
        "deepseek-ai/Janus-Pro-1B", ("config.json", "pytorch_model.bin.index.json")
    )
    with pytest.raises(DownloadError, match="no file matching 'pytorch_model.bin.index.json'"):
        select(janus_1b, LISTINGS[janus_1b.repo]["files"], janus_1b.repo)
    weights = {name for _, name in taken(catalogue.BY_NAME["Janus-Pro-1B"]) if ".bin" in name}
    assert weights == {"pytorch_model.bin"}
    weights = {name for _, name in taken(catalogue.BY_NAME["Janus-Pro-7B"]) if ".bin" in name}
    assert weights == {
        "pytorch_model.bin.index.json",
        "pytorch_model-00001-of-00002.bin",
        "pytorch_model-00002-of-00002.bin",
    }


def test_repositories_without_a_licence_say_so():
    """The Lumina-mGPT 1.0 repositories declare none: the catalogue says so instead of pointing
    at a card."""
    for entry in catalogue.ENTRIES:
        for src in entry.sources:
            if LISTINGS.get(src.repo, {}).get("licence", "") is None:
                assert "declare no licence" in entry.licence and "Chameleon" in entry.licence, (
                    entry.name
                )
