"""Decode settings: frozen dataclasses, validated once at construction.

Every out-of-range value raises ValueError naming the setting, the value and the valid range, so the
ComfyUI nodes and the CLI can show the message as is. Defaults live here and nowhere else.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

MAX_WINDOW = 128
MAX_TREE_WIDTH, MAX_TREE_DEPTH = 8, 3
# VP strengths "auto" chooses among: boost, none, two shrinkages
AUTO_STRENGTHS = (
    1.0,
    0.0,
    -0.35,
    -0.7,
)
PAPER_STRENGTH = 1.0  # the paper's lambda: a fixed strength's default
DRAFT_INITS = ("random", "repeat_left", "repeat_above")
# the names of verify.VERIFIERS' rules (settings import no engine code)
VERIFIERS = (
    "sjd",
    "lantern",
    "gsd",
)


def _check(ok: bool, name: str, value, valid: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} is out of range: {name} must be {valid}")


def _check_int(name: str, value, lo: int, hi: int | None = None) -> None:
    ok = (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= lo
        and (hi is None or value <= hi)
    )
    _check(
        ok, name, value, f"an integer in [{lo}, {hi}]" if hi is not None else f"an integer >= {lo}"
    )


def _check_real(name: str, value) -> None:
    _check(
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
        name,
        value,
        "a finite number",
    )


@dataclass(frozen=True)
class SamplingSettings:
    """How the target distribution p is formed from the model's logits."""

    cfg_scale: float = (
        1.0  # 1 = no guidance (no unconditional rows are run); 0 = unconditional only
    )
    temperature: float = 1.0  # ignored when greedy
    top_k: int = 0  # 0 = keep the whole (image) vocabulary
    top_p: float = 1.0  # nucleus mass kept, in (0, 1]
    greedy: bool = False  # argmax decoding: SJD then returns the AR tokens token for token
    # a family whose edits run a third row, the text with the reference's understanding alone
    # (Janus-4o): that row's weight in the condition, (full + w part) / (1 + w); ignored elsewhere
    image_cfg_scale: float = 0.0

    def __post_init__(self):
        _check_real("cfg_scale", self.cfg_scale)
        _check(self.cfg_scale >= 0, "cfg_scale", self.cfg_scale, ">= 0")
        _check_real("temperature", self.temperature)
        _check(
            self.greedy or self.temperature > 0,
            "temperature",
            self.temperature,
            "> 0 (or set greedy=True for argmax decoding)",
        )
        _check_int("top_k", self.top_k, 0)
        _check_real("top_p", self.top_p)
        _check(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        _check(isinstance(self.greedy, bool), "greedy", self.greedy, "True or False")
        _check_real("image_cfg_scale", self.image_cfg_scale)
        _check(self.image_cfg_scale >= 0, "image_cfg_scale", self.image_cfg_scale, ">= 0")

    @property
    def uses_cfg(self) -> bool:
        return self.cfg_scale != 1.0


@dataclass(frozen=True)
class TreeSettings:
    """Draft trees (sjdvp_core.engine.tree): at the first `depth` undecided slots, `width`
    candidates instead of one draft, each alternative followed by the drafts after it, all scored
    in one forward pass. width 1 is the plain chain, and the default: trees take fewer passes but
    each scores about width times the tokens (docs/method.md, "Draft trees", and
    benchmarks/results/trees.md for the figures); they pay where wide forwards are cheap."""

    width: int = (
        1  # candidates per branching slot: the draft, then spatial guesses, then draws from q
    )
    depth: int = 1  # branching slots, counted from the first undecided one
    guesses: bool = True  # the committed left and above neighbours as one-hot candidates
    branch: int = 0  # drafts after an alternative; 0 = up to the window's end

    def __post_init__(self):
        _check_int("tree_width", self.width, 1, MAX_TREE_WIDTH)
        _check_int("tree_depth", self.depth, 1, MAX_TREE_DEPTH)
        _check(isinstance(self.guesses, bool), "tree_guesses", self.guesses, "True or False")
        _check_int("tree_branch", self.branch, 0, MAX_WINDOW)

    @property
    def on(self) -> bool:
        return self.width > 1


@dataclass(frozen=True)
class WindowSettings:
    """The Jacobi window: how many tokens one forward pass scores, how new drafts start, and the
    draft tree at its first slots. With auto, size is the most a pass may score: every iteration
    scores the number of tokens that maximises expected committed tokens per second
    (engine/auto.py)."""

    size: int  # W; 1 is plain AR through the same loop (no default: DEFAULT_WINDOW is the one)
    # repeat_above | repeat_left | random over the image vocabulary. A copy of the cell
    init: str = "repeat_above"
    # above: the most tokens per pass on the demo at every window tried (as the SJD
    # paper's Fig. 9 found on Lumina-mGPT; benchmarks/results/draft_init.md)
    tree: TreeSettings = field(default_factory=TreeSettings)
    auto: bool = (
        False  # choose the tokens per pass (up to size) from this decode's acceptance and the
    )
    # device's measured pass cost (engine/cost.py)
    auto_tree: bool = (
        False  # with auto: also weigh capped draft trees at the first slot (engine/auto.py)
    )

    def __post_init__(self):
        _check_int("window", self.size, 1, MAX_WINDOW)
        _check(self.init in DRAFT_INITS, "init", self.init, f"one of {DRAFT_INITS}")
        _check(isinstance(self.tree, TreeSettings), "tree", self.tree, "a TreeSettings")
        _check(isinstance(self.auto, bool), "window_auto", self.auto, "True or False")
        _check(isinstance(self.auto_tree, bool), "tree_auto", self.auto_tree, "True or False")


# The window a user gets without choosing one (new Jacobi Window nodes, Speculative Decode's method,
# the command lines, the shipped workflows, DecodeSettings()): the automatic plan, at most 64 tokens
# per pass, capped draft trees weighed where the device scores their extra tokens almost for free.
DEFAULT_WINDOW = WindowSettings(64, auto=True, auto_tree=True)


@dataclass(frozen=True)
class VPSettings:
    """Verification Prediction: fuse each carried draft's target with its probability history."""

    growth_steps: int = 2  # N: a token must have risen in each of the last N observations
    beta: float = 0.5  # EWA decay of the history pbar
    top_k: int = 50  # k_vp: fusion touches only the top-k_vp candidates of p
    strength: float | str = (
        "auto"  # lambda > 0: boost by log gain; < 0: shrink toward history by |lambda|;
    )
    # "auto": chosen from AUTO_STRENGTHS by this run's verifications
    max_score: float = math.log(4.0)  # s_max: the log-gain score is clipped to [0, s_max]
    lossless: bool = True  # False verifies against the unfused p (a biased ablation)

    def __post_init__(self):
        _check_int("vp_growth_steps", self.growth_steps, 1, 64)
        _check_real("vp_beta", self.beta)
        _check(0 <= self.beta < 1, "vp_beta", self.beta, "in [0, 1)")
        _check_int("vp_top_k", self.top_k, 1)
        real = isinstance(self.strength, (int, float)) and not isinstance(self.strength, bool)
        _check(
            self.strength == "auto" or (real and math.isfinite(self.strength)),
            "vp_strength",
            self.strength,
            "a finite number or 'auto'",
        )
        _check_real("vp_max_score", self.max_score)
        _check(self.max_score > 0, "vp_max_score", self.max_score, "> 0")
        _check(isinstance(self.lossless, bool), "vp_lossless", self.lossless, "True or False")

    @property
    def auto(self) -> bool:
        return self.strength == "auto"


@dataclass(frozen=True)
class DrafterSettings:
    """Which verifier judges the drafts, its knobs, and whether drafts use VP."""

    verifier: str = "sjd"  # sjd (exact) | lantern | gsd (both relaxed, lossy)
    lantern_k: int = 1000  # latent neighbours considered per token
    lantern_delta: float = 0.1  # cap on the neighbours' mass added to p(x); 0 = exact SJD
    gsd_group: int = 14  # G: tokens around the draft by target rank; 1 = exact SJD
    gsd_max_gap: float = 0.15  # cluster members differ from p(x) by less than this
    gsd_max_distance: float | None = None  # optional codebook L2 distance filter
    vp: VPSettings | None = None
    coupled: bool = True  # one persistent Gumbel noise per position: redrafts agree (exact;
    # docs/method.md, "Coupled drafting", for what it gains)
    continuation: bool = False  # re-drafts keep the old draft by maximal coupling (SJD-PAC's
    # adaptive continuation): P(same draft) = sum(min(p', q_old))

    def __post_init__(self):
        _check(self.verifier in VERIFIERS, "verifier", self.verifier, f"one of {VERIFIERS}")
        _check_int("lantern_k", self.lantern_k, 1)
        _check_real("lantern_delta", self.lantern_delta)
        _check(0 <= self.lantern_delta <= 1, "lantern_delta", self.lantern_delta, "in [0, 1]")
        _check_int("gsd_group", self.gsd_group, 1)
        _check_real("gsd_max_gap", self.gsd_max_gap)
        _check(0 < self.gsd_max_gap <= 1, "gsd_max_gap", self.gsd_max_gap, "in (0, 1]")
        if self.gsd_max_distance is not None:
            _check_real("gsd_max_distance", self.gsd_max_distance)
            _check(
                self.gsd_max_distance > 0, "gsd_max_distance", self.gsd_max_distance, "> 0 or None"
            )
        _check(
            self.vp is None or isinstance(self.vp, VPSettings),
            "vp",
            self.vp,
            "a VPSettings or None",
        )
        _check(isinstance(self.coupled, bool), "coupled", self.coupled, "True or False")
        _check(
            isinstance(self.continuation, bool), "continuation", self.continuation, "True or False"
        )

    @property
    def name(self) -> str:
        vp = "" if self.vp is None else "-VP" if self.vp.auto else f"-VP({self.vp.strength:+g})"
        return (
            self.verifier.upper()
            + vp
            + (" coupled" if self.coupled else "")
            + (" continued" if self.continuation else "")
        )


# engine/captured.py: recorded as CUDA graphs where it can, or not
PASS_MODES = (
    "auto",
    "captured",
    "eager",
)


@dataclass(frozen=True)
class DecodeSettings:
    window: WindowSettings = DEFAULT_WINDOW
    drafter: DrafterSettings = field(default_factory=DrafterSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    seed: int = 0
    batch_size: int = 1
    compile: bool = (
        False  # the engine's step through torch.compile (engine/compiled.py); never changes the law
    )
    # the model's pass: auto, captured or eager (engine/captured.py); never changes a token
    passes: str = "auto"

    def __post_init__(self):
        _check_int("seed", self.seed, 0, 2**63 - 1)
        _check_int("batch_size", self.batch_size, 1)
        _check(isinstance(self.compile, bool), "compile", self.compile, "true or false")
        _check(self.passes in PASS_MODES, "passes", self.passes, f"one of {list(PASS_MODES)}")
        for name, cls in (
            ("window", WindowSettings),
            ("drafter", DrafterSettings),
            ("sampling", SamplingSettings),
        ):
            _check(
                isinstance(getattr(self, name), cls), name, getattr(self, name), f"a {cls.__name__}"
            )


# Named decoding methods with their default knobs: "ar" (plain AR, window 1), then every verifier
# without and with VP ("sjd", "sjd-vp", "lantern", ...). DEFAULT_METHOD is what a new Speculative
# Decode node runs.
METHODS: dict[str, DrafterSettings | None] = {"ar": None} | {
    name + suffix: DrafterSettings(verifier=name, vp=vp)
    for name in VERIFIERS
    for suffix, vp in (("", None), ("-vp", VPSettings()))
}
DEFAULT_METHOD = "sjd-vp"


def decode_settings(
    drafter: DrafterSettings | None,
    window: WindowSettings | None,
    sampling: SamplingSettings,
    seed: int = 0,
    batch_size: int = 1,
    compile: bool = False,
    passes: str = "auto",
) -> DecodeSettings:
    """No drafter is plain AR: a window of 1 through the same loop (whatever window is given)."""
    if drafter is None:
        return DecodeSettings(
            window=WindowSettings(1),
            drafter=DrafterSettings(),
            sampling=sampling,
            seed=seed,
            batch_size=batch_size,
            compile=compile,
            passes=passes,
        )
    return DecodeSettings(
        window=window or DEFAULT_WINDOW,
        drafter=drafter,
        sampling=sampling,
        seed=seed,
        batch_size=batch_size,
        compile=compile,
        passes=passes,
    )


def method_settings(
    method: str,
    window: int,
    sampling: SamplingSettings,
    seed: int = 0,
    batch_size: int = 1,
    coupled: bool = True,
    tree: TreeSettings = TreeSettings(),
    auto: bool = False,
    auto_tree: bool = False,
    compile: bool = False,
    init: str = WindowSettings.init,
    passes: str = "auto",
) -> DecodeSettings:
    """DecodeSettings for a named method (see METHODS), with or without coupled drafting, a draft
    tree, the automatic window (up to `window`) and tree, and a draft init (none of them for AR),
    the compiled step or not, and how the model's pass runs (PASS_MODES)."""
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown: choose one of {list(METHODS)}")
    drafter = METHODS[method]
    return decode_settings(
        None if drafter is None else replace(drafter, coupled=coupled),
        WindowSettings(window, init=init, tree=tree, auto=auto, auto_tree=auto_tree),
        sampling,
        seed,
        batch_size,
        compile,
        passes,
    )
