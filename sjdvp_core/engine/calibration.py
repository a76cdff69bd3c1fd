"""What an automatic window chooses by and a report prices by, measured on the device at hand and
cached: the pass cost t(k) (real iterations of the loop at fixed windows, timed) and the
acceptance profile (committed tokens per pass of each candidate plan, counted). `decode` calls
`calibration` when an automatic window is given neither; a caller that times decodes calls it
(and `warm_up`) first."""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import logging
import os
import platform
import statistics
import time
from dataclasses import replace
from typing import Callable, Iterable, Iterator, Sequence

import torch

from .adapter import ModelAdapter
from .auto import MOST_FACTOR, Plan, Profile, candidate_plans, contenders, most_tokens, warmed
from .captured import pass_kind
from .cost import GRID, PassCost, monotone
from .loop import Clock, JacobiDecoder, Loop
from .settings import DecodeSettings
from .stats import DecodeStats
from .tree import scratch_nodes

log = logging.getLogger(__name__)

MeasureFn = Callable[[str, int, int], None]
"""Calibration progress: (what is measured, steps done, steps in all), after every iteration; it may raise to
abort (then nothing is cached). The first automatic run on a model measures the device (tens of the demo's decodes,
about a thousand of the model's passes for a large one); a caller shows this, and lets the user stop it."""


def calibration(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    cost: PassCost | None = None,
    profile: Profile | None = None,
    progress: MeasureFn | None = None,
) -> tuple[PassCost, Profile | None]:
    """What an automatic window chooses by and a report prices by: the pass cost (pass_cost unless
    given) and, for an automatic window, the acceptance profile of the plans that can win at that
    cost (acceptance_profile unless given, then `contenders`; None for a fixed window). Measured
    once per model and device and cached (progress: MeasureFn); a caller that times decodes calls
    this first, so that the first decode's time does not include it."""
    cost = cost or pass_cost(adapter, settings, progress)
    if not (settings.window.auto and settings.window.size > 1):
        return cost, None
    plans = auto_plans(adapter, settings, cost)
    return cost, contenders(profile or acceptance_profile(adapter, settings, plans, progress), cost)


def warm_up(
    adapter: ModelAdapter, settings: DecodeSettings, plans: Sequence[Plan] = (), iterations: int = 4
) -> None:
    """A few untimed iterations with these settings at each plan (default: the settings' window and
    tree; give an automatic window's contenders, `calibration`): the process's one-time costs
    (the allocator's first blocks, libraries' first calls, compiling the step for each shape)
    land here rather than in whichever decode is timed first."""
    with torch.inference_mode():
        for plan in plans or [Plan(settings.window.size, settings.window.tree)]:
            for done, (decoder, loop) in enumerate(
                _fixed_decodes(adapter, settings, plan, [settings.seed])
            ):
                if done == iterations:
                    break
                decoder.iterate(loop)


def measure_cost(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    grid: Sequence[int] = GRID,
    iterations: int = 30,
    rounds: int = 3,
    progress: MeasureFn | None = None,
    clock: Clock | None = None,
) -> PassCost:
    """t(k) on the adapter's device: the median wall time of real iterations (the forward and the
    engine's step) of decodes with these settings at a fixed window of k tokens, for every k of
    grid up to the settings' window and that window itself, stopping past the widest window auto
    would allocate (auto.MOST_FACTOR x t(1), confirmed by timing t(1) and t(k) again); the
    engine's share beside it. The k take turns in `rounds` rounds (two iterations to warm up in
    each), so a drift of the machine's speed moves every k alike, and the medians are fitted
    non-decreasing in k (a pass never costs less for scoring more; `monotone`): auto compares
    plans by these ratios, and one noisy median below its neighbour would send it to that window.
    A few seconds; progress counts iterations."""
    # up to the cap itself
    ks = sorted({k for k in grid if k <= settings.window.size} | {1, settings.window.size})
    walls: dict[int, list[float]] = {k: [] for k in ks}
    shares: dict[int, list[float]] = {k: [] for k in ks}
    per_round = max(1, -(-iterations // rounds))
    done, extra = 0, 0

    def measure(k: int) -> float:
        """per_round timed iterations at window k (after two to warm up) -> their median, kept in
        walls[k]."""
        nonlocal done
        timed, these = 0, []
        for decoder, loop in _fixed_decodes(
            adapter, settings, Plan(k), itertools.count(), timing=True, clock=clock
        ):
            if timed == per_round + 2:
                break
            before, t = sum(loop.rec.times[1:]), decoder.clock.now()
            decoder.iterate(loop)
            if timed >= 2:
                these.append(decoder.clock.now() - t)
                shares[k].append(sum(loop.rec.times[1:]) - before)
            timed, done = timed + 1, done + 1
            if progress is not None:
                progress("pass cost", done, (len(ks) * rounds + extra) * (per_round + 2))
        walls[k] += these
        return statistics.median(these)

    with torch.inference_mode():
        for r in range(rounds):
            for k in list(ks):
                measure(k)
                if r == 0 and statistics.median(walls[k]) > MOST_FACTOR * statistics.median(
                    walls[ks[0]]
                ):
                    # confirmed against t(1) timed again beside it before the grid is cut for good:
                    # the machine's speed drifts, and a grid cut by a slow stretch would price wider
                    # windows from the flat segment before it
                    # (test_a_slow_stretch_does_not_cut_the_measured_grid)
                    extra += 2
                    one = measure(ks[0])
                    if measure(k) > MOST_FACTOR * one:
                        ks = ks[: ks.index(k) + 1]
                        break
    seconds = monotone([max(statistics.median(walls[k]), 1e-9) for k in ks])
    ks = ks[: next((i + 1 for i, t in enumerate(seconds) if t > MOST_FACTOR * seconds[0]), len(ks))]
    return PassCost(
        tuple(ks),
        tuple(seconds[: len(ks)]),
        f"measured on {device_name(adapter.device)}",
        tuple(statistics.median(shares[k]) for k in ks),
    )


def _fixed_decodes(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    plan: Plan,
    seeds: Iterable[int],
    timing: bool = False,
    clock: Clock | None = None,
) -> Iterator[tuple[JacobiDecoder, Loop]]:
    """Decodes of the adapter's example condition at one fixed plan, seed after seed, for the
    calibrations: yields (decoder, loop) before each iteration, which the caller runs (timing or
    counting it) before it asks for the next; it stops asking when it has enough. clock: what
    times them (default: the device's)."""
    conditions = [adapter.example_condition] * settings.batch_size
    for seed in seeds:
        fixed = replace(_fixed(settings, plan), seed=seed)
        try:
            layout, first_logits = adapter.start(
                conditions, None, fixed.sampling.uses_cfg, scratch_nodes(plan.window, plan.tree)
            )
            decoder = JacobiDecoder(adapter, fixed, layout, timing, clock=clock)
            loop = decoder.begin(first_logits)
            while not decoder.done(loop):
                yield decoder, loop
        finally:
            adapter.finish()


def _fixed(settings: DecodeSettings, plan: Plan) -> DecodeSettings:
    """The settings with this plan for every iteration (what the calibrations time and count)."""
    return replace(
        settings,
        window=replace(
            settings.window, size=plan.window, tree=plan.tree, auto=False, auto_tree=False
        ),
    )


# how calibrations are measured, or what they measure changed (6: a cheaper engine step): a change
CALIBRATION = 6
# re-measures what older versions cached


def cost_key(adapter: ModelAdapter, settings: DecodeSettings) -> dict:
    """What the pass cost is cached under (the acceptance profile's key starts from it)."""
    weights = weights_key(adapter.module)
    return {
        "family": adapter.family,
        "weights": weights["weights"],
        "device": device_name(adapter.device),
        "placement": weights["placement"],
        "dtype": weights["dtype"],
        "torch": torch.__version__,
        "batch": settings.batch_size,
        "cfg": settings.sampling.uses_cfg,
        "method": settings.drafter.name,
        "window": settings.window.size,
        "length": adapter.layout.length,
        "compile": settings.compile,
        "passes": pass_kind(adapter, settings.passes),
        "calibration": CALIBRATION,
    } | ({} if settings.window.auto else {"grid": "fixed"})


def pass_cost(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    progress: MeasureFn | None = None,
    clock: Clock | None = None,
) -> PassCost:
    """measure_cost, cached on disk per (weights, device, placement, dtype, torch version, rows,
    method, window, compile, captured or eager passes). A fixed window's is t(1), t(W / 2) and
    t(W), what its report prices it by (a tree's wider passes from the last segment; half the
    measuring at W = 16); an automatic window's, the grid up to W, which it chooses by."""
    grid = GRID if settings.window.auto else (1, max(1, settings.window.size // 2))
    return cached(
        cost_key(adapter, settings),
        PassCost,
        lambda: measure_cost(adapter, settings, grid, progress=progress, clock=clock),
        f"the pass cost of {settings.drafter.name}",
    )


# a decode's passes this many times slower or faster than the cached pass cost: measure it again
DRIFT = 2.0


def forget_stale_cost(
    adapter: ModelAdapter, settings: DecodeSettings, cost: PassCost, stats: DecodeStats
) -> bool:
    """After a decode that chose by the pass cost cached for these settings: forget that cost (the
    next automatic run measures it again) when the decode's iterations took more than DRIFT times
    what it says, or less than 1 / DRIFT (DecodeStats.pass_cost_drift). A calibration measured
    while the device was busy with other work would otherwise price every later run: it is slower
    at every window, and not evenly, so the automatic window chooses from a distorted curve. A
    cost the caller brought (a device's roofline, a benchmark's measurement) is not the cached
    one, and stays. -> whether it was forgotten."""
    drift = stats.pass_cost_drift
    if drift is None or 1 / DRIFT <= drift <= DRIFT:
        return False
    # past the drift only: its weights' fingerprint reads every parameter
    key = cost_key(adapter, settings)
    if load_cached(key, PassCost) != cost:
        return False
    forget_cached(key)
    log.warning(
        "sjdvp: this decode's passes took %.2fx the time the cached pass cost of %s says (%s); the automatic "
        "window chooses by it, so it is measured again on the next automatic run",
        drift,
        settings.drafter.name,
        "measured while the device was busier than now"
        if drift < 1
        else "the device is busier now than when it was measured",
    )
    return True


def auto_plans(adapter: ModelAdapter, settings: DecodeSettings, cost: PassCost) -> list[Plan]:
    """What an automatic window may choose from on a device with this cost
    (auto.candidate_plans)."""
    w = settings.window
    return candidate_plans(cost, most_tokens(cost, w.size), w.tree, w.auto_tree and adapter.trees)


def measure_profile(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    plans: Sequence[Plan],
    samples: int = 4,
    span: int = 128,
    progress: MeasureFn | None = None,
) -> Profile:
    """Committed tokens per pass per image with each plan: decodes of the adapter's example
    condition with these settings at that fixed plan (seeds 0 .. samples - 1), counted over span
    image tokens after the warm-up (auto.warmed; the same stretch for every plan, less where the
    image is shorter), as the decode counts its own; fitted non-decreasing in the window
    (Profile.fitted). About samples x plans x 50 passes; cached by acceptance_profile. progress
    counts the tokens the decodes have to commit."""
    start = warmed(adapter.layout.jacobi_span)
    stop = min(start + span, adapter.layout.jacobi_span[1])
    committed = []
    with torch.inference_mode():
        for i, plan in enumerate(plans):
            won = passes = 0
            for seed in range(samples):
                begun = None  # tokens committed when the counted stretch began
                for decoder, loop in _fixed_decodes(adapter, settings, plan, [seed]):
                    if min(loop.n_host) >= stop:
                        break
                    if begun is None and min(loop.n_host) >= start:
                        begun = sum(min(c, stop) for c in loop.n_host)
                    decoder.iterate(loop)
                    passes += begun is not None
                    if progress is not None:
                        progress(
                            "acceptance profile",
                            (i * samples + seed) * stop + min(min(loop.n_host), stop),
                            len(plans) * samples * stop,
                        )
                end = sum(min(c, stop) for c in loop.n_host)
                won += (end - (end if begun is None else begun)) / settings.batch_size
            committed.append(max(1.0, won / max(passes, 1)))
    return Profile(
        tuple(plans),
        tuple(committed),
        f"measured on the example image, {samples} seeds, tokens {start}-{stop}",
    ).fitted()


def profile_key(adapter: ModelAdapter, settings: DecodeSettings, plans: Sequence[Plan]) -> dict:
    """What the acceptance profile is cached under: the pass cost's key without what changes only
    the time."""
    key = cost_key(adapter, settings) | {
        "greedy": settings.sampling.greedy,
        "drafter": repr(settings.drafter),
        "init": settings.window.init,
        "plans": [p.to_json() for p in plans],
        "kind": "profile",
    }
    del key["device"], key["placement"], key["compile"], key["passes"]
    return key


def acceptance_profile(
    adapter: ModelAdapter,
    settings: DecodeSettings,
    plans: Sequence[Plan],
    progress: MeasureFn | None = None,
) -> Profile:
    """measure_profile, cached on disk per (weights, drafter, draft init, rows, plans, greedy or
    sampled): steps, not seconds, so it holds on any device, compiled or not. Not per CFG scale,
    temperature, top-k or top-p: a profile measured at one of them serves the others (each decode
    scales it to its own acceptance, g), and a new value would otherwise mean another measurement
    (benchmarks/results/profile_reuse.md measures what that costs auto's choices)."""
    # counted, not timed: compiling, recording cost time
    eager = replace(settings, compile=False, passes="eager")
    return cached(
        profile_key(adapter, settings, plans),
        Profile,
        lambda: measure_profile(adapter, eager, plans, progress=progress),
        f"the acceptance of {len(plans)} windows and trees for the automatic window",
    )


# --- the disk cache: what a calibration measured, per model, device and settings ------------------
def device_name(device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def weights_key(module: torch.nn.Module) -> dict:
    """The weights, for a cache key, in one walk over them: which they are ("weights": every
    parameter's and buffer's name, shape and dtype, and a few values where the module holds them:
    an offloaded block's are on the meta device between passes, models.placement), the first
    parameter's dtype, and where they sit ("placement": the devices holding them, "meta" for
    offloaded blocks; a pass's cost depends on it, its acceptance does not)."""
    params = list(module.named_parameters())
    h, devices = hashlib.sha256(), set()
    for name, t in params + list(module.named_buffers()):
        h.update(f"{name}{tuple(t.shape)}{t.dtype}".encode())
        if t.numel() and not t.is_meta:
            h.update(t.detach().flatten()[:16].float().cpu().numpy().tobytes())
        devices.add(str(t.device))
    return {
        "weights": h.hexdigest()[:16],
        "placement": ",".join(sorted(devices)),
        "dtype": str(params[0][1].dtype) if params else "none",
    }


def cache_dir() -> str:
    return os.environ.get("SJDVP_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sjdvp")


def cache_path(key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), "calibration", f"{digest}.json")


def load_cached(key: dict, kind=PassCost):
    """What save_cached stored under key (a PassCost, or another kind with from_json), or None."""
    try:
        with open(cache_path(key)) as f:
            data = json.load(f)
        return kind.from_json(data["value"]) if data.get("key") == key else None
    except (OSError, ValueError, KeyError, TypeError):
        return None  # none yet, or unreadable: measured again and rewritten


def cached(key: dict, kind, measure, what: str):
    """The value stored under key, else measure() stored there: how calibrations are reused across
    runs. A measurement is logged (what: what is measured), so the first automatic run's extra
    seconds say why."""
    value = load_cached(key, kind)
    if value is None:
        log.info(
            "sjdvp: measuring %s once for this model and device (cached in %s)", what, cache_dir()
        )
        start = time.perf_counter()
        value = measure()
        log.info("sjdvp: measured %s in %.1f s", what, time.perf_counter() - start)
        save_cached(key, value)
    return value


def forget_cached(key: dict) -> None:
    """What save_cached stored under key is measured again when next asked for."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(cache_path(key))


def save_cached(key: dict, value) -> None:
    """value: anything with to_json (the pass cost, auto's acceptance profile)."""
    path = cache_path(key)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(tmp, "w") as f:
            json.dump({"key": key, "value": value.to_json()}, f, indent=1)
        os.replace(tmp, path)
    except OSError:  # a read-only home or a full disk: measured again next time
        with contextlib.suppress(OSError):
            os.remove(tmp)
