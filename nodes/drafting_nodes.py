"""The Jacobi window, the verifiers (SJD, LANTERN, GSD) and Verification Prediction: the knobs that
a connected node sets by hand instead of Speculative Decode's method."""

from __future__ import annotations

from dataclasses import replace

from comfy_api.latest import io

from ..sjdvp_core.engine.settings import (
    DEFAULT_WINDOW,
    DRAFT_INITS,
    MAX_TREE_DEPTH,
    MAX_TREE_WIDTH,
    MAX_WINDOW,
    PAPER_STRENGTH,
    DrafterSettings,
    TreeSettings,
    VPSettings,
    WindowSettings,
)

DRAFTER_DEFAULTS, VP_DEFAULTS = DrafterSettings(), VPSettings()
TREE_DEFAULTS = DEFAULT_WINDOW.tree
NO_LIMIT = 0.0  # GSD's max_distance widget: 0 stands for None (no codebook distance filter)

WINDOW = io.Custom("SJDVP_WINDOW")
DRAFTER = io.Custom("SJDVP_DRAFTER")


def coupled_input():
    """Every verifier node's last widget: coupled drafting (exact, on by default)."""
    return io.Boolean.Input(
        "coupled",
        default=DRAFTER_DEFAULTS.coupled,
        tooltip="Draw each position's drafts with one fixed noise, so more of them pass (exact).",
    )


class JacobiWindow(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_JacobiWindow",
            display_name="Jacobi Window",
            category="sjdvp",
            description="How many tokens one forward pass drafts and verifies, and how new drafts start.",
            inputs=[
                io.Int.Input(
                    "window",
                    default=DEFAULT_WINDOW.size,
                    min=1,
                    max=MAX_WINDOW,
                    tooltip="Tokens scored per forward pass (with window_auto, the most); 1 is plain "
                    "AR.",
                ),
                io.Boolean.Input(
                    "window_auto",
                    default=DEFAULT_WINDOW.auto,
                    tooltip="Choose the tokens per pass, up to window, that are fastest on this "
                    "device (measured on the first run).",
                ),
                io.Boolean.Input(
                    "tree_auto",
                    default=DEFAULT_WINDOW.auto_tree,
                    tooltip="With window_auto: also weigh a capped draft tree where this device "
                    "scores it almost for free.",
                ),
                io.Int.Input(
                    "tree_width",
                    default=TREE_DEFAULTS.width,
                    min=1,
                    max=MAX_TREE_WIDTH,
                    tooltip="Candidates at each of the first undecided slots; 1 is a plain chain.",
                ),
                io.Int.Input(
                    "tree_depth",
                    default=TREE_DEFAULTS.depth,
                    min=1,
                    max=MAX_TREE_DEPTH,
                    tooltip="How many of the first undecided slots get tree candidates.",
                ),
                io.Combo.Input(
                    "init",
                    options=list(DRAFT_INITS),
                    default=DEFAULT_WINDOW.init,
                    tooltip="How fresh drafts start: a copy of the cell above, to the left, or "
                    "random (all exact).",
                ),
            ],
            outputs=[WINDOW.Output(display_name="window")],
        )

    @classmethod
    def execute(cls, window, window_auto, tree_auto, tree_width, tree_depth, init) -> io.NodeOutput:
        return io.NodeOutput(
            WindowSettings(
                size=window,
                init=init,
                auto=window_auto,
                auto_tree=window_auto and tree_auto and tree_width == 1,
                tree=TreeSettings(width=tree_width, depth=tree_depth),
            )
        )


class DrafterSJD(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DrafterSJD",
            display_name="Verifier: SJD (exact)",
            category="sjdvp",
            description="Speculative Jacobi Decoding with the exact verifier: the images are distributed "
            "exactly as plain AR sampling's (not the same pixels for a seed).",
            inputs=[coupled_input()],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, coupled) -> io.NodeOutput:
        return io.NodeOutput(DrafterSettings(verifier="sjd", coupled=coupled))


class DrafterLANTERN(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DrafterLANTERN",
            display_name="Verifier: LANTERN (relaxed)",
            category="sjdvp",
            description="LANTERN's relaxed verifier: a draft also passes on the probability of its nearest "
            "codebook neighbours, up to delta of extra mass. Faster, lossy.",
            inputs=[
                io.Int.Input(
                    "neighbours",
                    default=DRAFTER_DEFAULTS.lantern_k,
                    min=1,
                    max=65536,
                    tooltip="Codebook neighbours considered per token (k).",
                ),
                io.Float.Input(
                    "delta",
                    default=DRAFTER_DEFAULTS.lantern_delta,
                    min=0.0,
                    max=1.0,
                    step=0.01,
                    tooltip="Most mass of a draft's neighbours added to its own; 0 is exact SJD, "
                    "larger is faster and drifts further.",
                ),
                coupled_input(),
            ],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, neighbours, delta, coupled) -> io.NodeOutput:
        return io.NodeOutput(
            DrafterSettings(
                verifier="lantern", lantern_k=neighbours, lantern_delta=delta, coupled=coupled
            )
        )


class DrafterGSD(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DrafterGSD",
            display_name="Verifier: GSD (grouped)",
            category="sjdvp",
            description="Grouped Speculative Decoding: a draft passes on the mass of a cluster of tokens "
            "around it by target rank. Faster, lossy.",
            inputs=[
                io.Int.Input(
                    "group",
                    default=DRAFTER_DEFAULTS.gsd_group,
                    min=1,
                    max=512,
                    tooltip="Cluster size G around the draft by target rank. 1 is exact SJD.",
                ),
                io.Float.Input(
                    "max_gap",
                    default=DRAFTER_DEFAULTS.gsd_max_gap,
                    min=0.001,
                    max=1.0,
                    step=0.01,
                    tooltip="Cluster members differ from the draft's probability by less than this.",
                ),
                io.Float.Input(
                    "max_distance",
                    default=DRAFTER_DEFAULTS.gsd_max_distance or NO_LIMIT,
                    min=0.0,
                    max=1000.0,
                    step=0.1,
                    tooltip="Codebook distance limit for cluster members; 0 turns it off.",
                ),
                coupled_input(),
            ],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, group, max_gap, max_distance, coupled) -> io.NodeOutput:
        return io.NodeOutput(
            DrafterSettings(
                verifier="gsd",
                gsd_group=group,
                gsd_max_gap=max_gap,
                gsd_max_distance=None if max_distance == NO_LIMIT else max_distance,
                coupled=coupled,
            )
        )


class VerificationPrediction(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_VerificationPrediction",
            display_name="Verification Prediction",
            category="sjdvp",
            description="Adds Verification Prediction to a drafter: drafts are sampled from each position's "
            "target fused with its probability history across Jacobi iterations, so more of them "
            "pass verification. The verifier is unchanged (SJD-VP stays exact).",
            inputs=[
                DRAFTER.Input(
                    "drafter", tooltip="The SJD, LANTERN or GSD verifier node to add VP to."
                ),
                io.Combo.Input(
                    "strength_mode",
                    options=["auto", "fixed"],
                    default="auto" if VP_DEFAULTS.auto else "fixed",
                    tooltip="auto: the strength is chosen while decoding; fixed: the strength "
                    "below.",
                ),
                io.Float.Input(
                    "strength",
                    default=PAPER_STRENGTH,
                    min=-8.0,
                    max=8.0,
                    step=0.05,
                    tooltip="lambda: above 0 boosts rising tokens (the paper), below 0 shrinks "
                    "toward the history, 0 is off.",
                ),
                io.Int.Input(
                    "growth_steps",
                    default=VP_DEFAULTS.growth_steps,
                    min=1,
                    max=64,
                    tooltip="N: a token is boosted only after rising in N consecutive iterations.",
                ),
                io.Float.Input(
                    "beta",
                    default=VP_DEFAULTS.beta,
                    min=0.0,
                    max=0.99,
                    step=0.01,
                    tooltip="Decay of the probability history (exponentially weighted average).",
                ),
                io.Int.Input(
                    "top_k",
                    default=VP_DEFAULTS.top_k,
                    min=1,
                    max=65536,
                    tooltip="Only the k most likely candidates of each position are fused.",
                ),
                io.Float.Input(
                    "max_score",
                    default=round(VP_DEFAULTS.max_score, 4),
                    min=0.01,
                    max=20.0,
                    step=0.01,
                    tooltip="Cap of the log-gain score per token.",
                ),
            ],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(
        cls, drafter, strength_mode, strength, growth_steps, beta, top_k, max_score
    ) -> io.NodeOutput:
        vp = VPSettings(
            growth_steps=growth_steps,
            beta=beta,
            top_k=top_k,
            max_score=max_score,
            strength="auto" if strength_mode == "auto" else strength,
        )
        return io.NodeOutput(replace(drafter, vp=vp))
