"""The Jacobi window, the verifiers (SJD, LANTERN, GSD) and Verification Prediction: the knobs that a
connected node sets by hand instead of Speculative Decode's method."""
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
from .legacy import LEGACY

DRAFTER_DEFAULTS, VP_DEFAULTS = DrafterSettings(), VPSettings()
TREE_DEFAULTS = DEFAULT_WINDOW.tree
NO_LIMIT = 0.0   # GSD's max_distance widget: 0 stands for None (no codebook distance filter)

WINDOW = io.Custom("SJDVP_WINDOW")
DRAFTER = io.Custom("SJDVP_DRAFTER")


def coupled_input():
    """Every verifier node's last widget: coupled drafting (exact, on by default).
    Optional, like every widget added after the first release, so prompts saved before it still
    validate; a prompt without it keeps its old meaning (independent drafts: legacy.py)."""
    return io.Boolean.Input("coupled", default=DRAFTER_DEFAULTS.coupled, optional=True,
                            tooltip="Draw every draft at a position with that position's fixed random noise, "
                                    "so successive drafts agree unless their distribution really moved. "
                                    "Exact, and many more drafts pass verification.")


class JacobiWindow(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_JacobiWindow", display_name="Jacobi Window", category="sjdvp",
            description="How many tokens one forward pass drafts and verifies, and how new drafts start.",
            inputs=[
                io.Int.Input("window", default=DEFAULT_WINDOW.size, min=1, max=MAX_WINDOW,
                             tooltip="Tokens scored per forward pass; with window_auto on, the most a pass may "
                                     "score. 1 is plain AR. Fixed: 16-64 suit GPUs; on a CPU a wide window is not "
                                     "free, prefer 4-8."),
                io.Combo.Input("init", options=list(DRAFT_INITS), default=DEFAULT_WINDOW.init,
                               tooltip="How fresh drafts start: a copy of the known cell above (the default, as "
                                       "the SJD paper recommends), to the left, or random image tokens. All are "
                                       "exact."),
                io.Int.Input("tree_width", default=TREE_DEFAULTS.width, min=1, max=MAX_TREE_WIDTH, optional=True,
                             tooltip="Draft tree: candidates at each of the first undecided slots (the draft, the "
                                     "cells left of and above it, further draws). 1 = a plain chain. Exact; fewer "
                                     "passes but about width x the tokens per pass: for large GPUs, slower on a "
                                     "CPU (docs/speed.md)."),
                io.Int.Input("tree_depth", default=TREE_DEFAULTS.depth, min=1, max=MAX_TREE_DEPTH, optional=True,
                             tooltip="How many of the first undecided slots get tree candidates."),
                io.Boolean.Input("window_auto", default=DEFAULT_WINDOW.auto, optional=True,
                                 tooltip="Choose the tokens per pass (up to window) that commit the most tokens per "
                                         "second on this device: its pass cost and the model's acceptance are "
                                         "measured on the first run (a bar shows it; then cached), and this run's "
                                         "acceptance decides. Exact. The same seed gives the same image on the "
                                         "same device; for the same image on any device, turn it off."),
                io.Boolean.Input("tree_auto", default=DEFAULT_WINDOW.auto_tree, optional=True,
                                 tooltip="With window_auto: also weigh a capped draft tree at the first undecided "
                                         "slot, used where this device scores the extra tokens almost for free "
                                         "(large GPUs). Exact. Ignored when tree_width is above 1 (your tree is "
                                         "kept)."),
            ],
            outputs=[WINDOW.Output(display_name="window")],
        )

    @classmethod
    def execute(cls, window, init, tree_width=LEGACY["SJDVP_JacobiWindow"]["tree_width"],
                tree_depth=LEGACY["SJDVP_JacobiWindow"]["tree_depth"],
                window_auto=LEGACY["SJDVP_JacobiWindow"]["window_auto"],
                tree_auto=LEGACY["SJDVP_JacobiWindow"]["tree_auto"]) -> io.NodeOutput:
        return io.NodeOutput(WindowSettings(size=window, init=init, auto=window_auto,
                                            auto_tree=window_auto and tree_auto and tree_width == 1,
                                            tree=TreeSettings(width=tree_width, depth=tree_depth)))


class DrafterSJD(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DrafterSJD", display_name="Verifier: SJD (exact)", category="sjdvp",
            description="Speculative Jacobi Decoding with the exact verifier: the images are distributed "
                        "exactly as plain AR sampling's (not the same pixels for a seed).",
            inputs=[coupled_input()], outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, coupled=LEGACY["SJDVP_DrafterSJD"]["coupled"]) -> io.NodeOutput:
        return io.NodeOutput(DrafterSettings(verifier="sjd", coupled=coupled))


class DrafterLANTERN(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DrafterLANTERN", display_name="Verifier: LANTERN (relaxed)", category="sjdvp",
            description="LANTERN's relaxed verifier: a draft also passes on the probability of its nearest "
                        "codebook neighbours, up to delta of extra mass. Faster, lossy.",
            inputs=[
                io.Int.Input("neighbours", default=DRAFTER_DEFAULTS.lantern_k, min=1, max=65536,
                             tooltip="Latent neighbours considered per token (k)."),
                io.Float.Input("delta", default=DRAFTER_DEFAULTS.lantern_delta, min=0.0, max=1.0, step=0.01,
                               tooltip="Most probability mass of a draft's neighbours added to its own when "
                                       "it is verified. 0 is exact SJD; larger is faster and drifts further "
                                       "from the model's distribution (the drift is not bounded by delta)."),
                coupled_input(),
            ],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, neighbours, delta, coupled=LEGACY["SJDVP_DrafterLANTERN"]["coupled"]) -> io.NodeOutput:
        return io.NodeOutput(DrafterSettings(verifier="lantern", lantern_k=neighbours, lantern_delta=delta,
                                             coupled=coupled))


class DrafterGSD(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_DrafterGSD", display_name="Verifier: GSD (grouped)", category="sjdvp",
            description="Grouped Speculative Decoding: a draft passes on the mass of a cluster of tokens "
                        "around it by target rank. Faster, lossy.",
            inputs=[
                io.Int.Input("group", default=DRAFTER_DEFAULTS.gsd_group, min=1, max=512,
                             tooltip="Cluster size G around the draft by target rank. 1 is exact SJD."),
                io.Float.Input("max_gap", default=DRAFTER_DEFAULTS.gsd_max_gap, min=0.001, max=1.0, step=0.01,
                               tooltip="Cluster members differ from the draft's probability by less than this."),
                io.Float.Input("max_distance", default=DRAFTER_DEFAULTS.gsd_max_distance or NO_LIMIT, min=0.0,
                               max=1000.0, step=0.1,
                               tooltip="Optional codebook distance limit for cluster members; 0 turns it off."),
                coupled_input(),
            ],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, group, max_gap, max_distance, coupled=LEGACY["SJDVP_DrafterGSD"]["coupled"]) -> io.NodeOutput:
        return io.NodeOutput(DrafterSettings(verifier="gsd", gsd_group=group, gsd_max_gap=max_gap,
                                             gsd_max_distance=None if max_distance == NO_LIMIT else max_distance,
                                             coupled=coupled))


class VerificationPrediction(io.ComfyNode):
    @classmethod
    def define_schema(cls):
        return io.Schema(
            node_id="SJDVP_VerificationPrediction", display_name="Verification Prediction", category="sjdvp",
            description="Adds Verification Prediction to a drafter: drafts are sampled from each position's "
                        "target fused with its probability history across Jacobi iterations, so more of them "
                        "pass verification. The verifier is unchanged (SJD-VP stays exact).",
            inputs=[
                DRAFTER.Input("drafter", tooltip="SJD, LANTERN or GSD drafter to enhance."),
                io.Int.Input("growth_steps", default=VP_DEFAULTS.growth_steps, min=1, max=64,
                             tooltip="N: a token is boosted only after rising in N consecutive iterations."),
                io.Float.Input("beta", default=VP_DEFAULTS.beta, min=0.0, max=0.99, step=0.01,
                               tooltip="Decay of the probability history (exponentially weighted average)."),
                io.Int.Input("top_k", default=VP_DEFAULTS.top_k, min=1, max=65536,
                             tooltip="Only the k most likely candidates of each position are fused."),
                io.Float.Input("strength", default=PAPER_STRENGTH, min=-8.0, max=8.0, step=0.05,
                               tooltip="Used when strength_mode is 'fixed'. lambda > 0: boost tokens that kept "
                                       "rising (the paper). lambda < 0: shrink drafts toward their history by "
                                       "|lambda| (helps where probabilities mean-revert). 0 turns VP off."),
                io.Float.Input("max_score", default=round(VP_DEFAULTS.max_score, 4), min=0.01, max=20.0, step=0.01,
                               tooltip="Cap of the log-gain score per token."),
                io.Combo.Input("strength_mode", options=["auto", "fixed"],
                               default="auto" if VP_DEFAULTS.auto else "fixed",
                               optional=True,
                               tooltip="auto: the strength is chosen during decoding by which candidate's "
                                       "drafts pass verification most on this model and prompt (exact either "
                                       "way). fixed: use the strength above."),
            ],
            outputs=[DRAFTER.Output(display_name="drafter")],
        )

    @classmethod
    def execute(cls, drafter, growth_steps, beta, top_k, strength, max_score,
                strength_mode=LEGACY["SJDVP_VerificationPrediction"]["strength_mode"]) -> io.NodeOutput:
        vp = VPSettings(growth_steps=growth_steps, beta=beta, top_k=top_k, max_score=max_score,
                        strength="auto" if strength_mode == "auto" else strength)
        return io.NodeOutput(replace(drafter, vp=vp))
