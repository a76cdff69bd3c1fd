"""The speed-up report: a text summary, its figures as data, and a map of where and when tokens were
accepted (as a tensor; sjdvp_core/figures.py draws its legend)."""

from __future__ import annotations

import torch
from torch import Tensor

from .loop import DecodeResult

# a perceptually ordered ramp (dark blue -> teal -> yellow) for "committed at iteration t"
_RAMP = torch.tensor(
    [
        [0.27, 0.00, 0.33],
        [0.23, 0.32, 0.55],
        [0.13, 0.57, 0.55],
        [0.37, 0.79, 0.38],
        [0.99, 0.91, 0.14],
    ]
)


def colour_ramp(x: Tensor) -> Tensor:
    """x in [0, 1], any shape -> RGB [..., 3]."""
    pos = x.clamp(0, 1) * (len(_RAMP) - 1)
    lo = pos.floor().long().clamp(max=len(_RAMP) - 2)
    frac = (pos - lo)[..., None]
    return _RAMP[lo] * (1 - frac) + _RAMP[lo + 1] * frac


def commit_map(result: DecodeResult, cell: int = 8, last: int | None = None) -> Tensor:
    """[B, h*cell, w*cell, 3]: each image cell coloured by the iteration that committed it (early =
    dark, late = yellow; yellow = each image's last iteration, or `last` for all); runs of one
    colour are tokens accepted together."""
    it = result.stats.commit_iter[:, result.layout.grid].float()  # [B, h, w]
    norm = it / (
        it.amax(dim=(1, 2), keepdim=True) if last is None else torch.tensor(float(last))
    ).clamp_min(1)
    return colour_ramp(norm).repeat_interleave(cell, 1).repeat_interleave(cell, 2)


def report_data(result: DecodeResult, method: str) -> dict:
    """The report's figures as plain numbers (what the node pack sends to the UI for its badge);
    step_compression (AR's forward passes / this run's) is the figure report_text prints."""
    st = result.stats
    per_iter = torch.cat(st.committed_per_iter) if st.committed_per_iter else torch.zeros(1)
    return (
        {
            "method": method,
            "tokens": int(st.length),
            "forward_passes": int(st.forward_passes),
            "ar_passes": int(st.ar_passes),
            "step_compression": round(st.step_compression, 4),
            "tokens_per_pass": round(st.mean_accepted, 4),
            "max_tokens_per_pass": int(per_iter.max()),
            "acceptance": round(st.acceptance_rate, 4) if st.drafts_verified else None,
            "seconds": round(st.time_total, 3),
            "tokens_scored_per_pass": round(st.tokens_per_forward, 2),
        }
        | ({"passes": st.passes.split(":")[0].split(",")[0]} if st.passes else {})
        | (
            {
                "estimated_speedup": round(speedup, 4),
                "estimated_seconds_saved": round(st.time_total * (speedup - 1), 3),
            }
            if (speedup := _estimate(st)) is not None
            else {}
        )
    )


def _estimate(st) -> float | None:
    """The wall-clock speed-up over AR on this device (stats.estimated_speedup), where the decode
    was priced; to 4 places, so that the text and the badge (from report_data) say faster or
    slower alike."""
    return (
        round(st.estimated_speedup(), 4)
        if st.pass_cost is not None and st.scored_per_iter
        else None
    )


def _versus_ar(speedup: float, seconds: float) -> str:
    """The estimate in words: faster and the seconds saved, or slower (a window too wide for this
    device's pass cost) and the seconds lost; never "0.8x faster"."""
    if speedup >= 1:
        return f"about {speedup:.2f}x faster than AR on this device, {seconds * (speedup - 1):.1f} s saved"
    return f"about {1 / speedup:.2f}x slower than AR on this device, {seconds * (1 - speedup):.1f} s lost"


def report_text(result: DecodeResult, method: str, brief: bool = False) -> str:
    """The report: the time saved against AR (where the run was priced) and the passes, then, unless
    brief, the research lines (tokens per pass, acceptance, precision, passes, VP, trees)."""
    st = result.stats
    m = st.momentum()
    per_iter = torch.cat(st.committed_per_iter).float() if st.committed_per_iter else torch.zeros(1)
    phases = [
        f"forward {st.time_forward:.2f}",
        f"verify {st.time_verify:.2f}",
        f"draft {st.time_draft:.2f}",
    ]
    phases += [f"compiled step {st.time_step:.2f}"] if st.time_step else []
    split = st.time_forward + st.time_verify + st.time_draft + st.time_step
    verified = st.drafts_verified
    speedup = _estimate(st)
    time = f"{st.time_total:.2f} s" + (f" ({', '.join(phases)})" if split else "")
    lines = [
        f"{method}: {_versus_ar(speedup, st.time_total)} (estimated); decoded in {time}"
        if speedup is not None
        else f"{method}: decoded in {time}",
        f"{st.length} tokens per image in {st.forward_passes} forward passes (AR needs {st.ar_passes})"
        + (f": {st.step_compression:.2f}x fewer steps" if st.forward_passes < st.ar_passes else ""),
        f"tokens per pass: mean {st.mean_accepted:.2f}, max {int(per_iter.max())}, {st.tokens_per_forward:.1f} "
        "scored" + (f"; drafts accepted {st.acceptance_rate:.1%}" if verified else ""),
    ]
    if brief:
        return "\n".join(lines[:2])
    if speedup is not None:
        lines.append(
            f"the estimate prices this run's passes at what each scored by the pass cost "
            f"{st.pass_cost.source}"
        )
    if st.precision:
        lines.append(f"weights: {st.precision}")
    if st.passes:
        lines.append(f"model passes: {st.passes}")
    if st.rose_verified and st.flat_verified:  # carried drafts are verified (never under AR)
        lines.append(
            f"carried drafts accepted: {m['accept_if_rose']:.1%} when their probability had just risen, "
            f"{m['accept_if_not']:.1%} otherwise"
        )
    elif st.rose_verified or st.flat_verified:
        rate, which = (
            (m["accept_if_rose"], "every") if st.rose_verified else (m["accept_if_not"], "no")
        )
        lines.append(
            f"carried drafts accepted: {rate:.1%} ({which} carried draft's probability had just risen)"
        )
    if st.tree_tried:
        rescued = st.tree_guess_accepted + st.tree_draw_accepted
        lines.append(
            f"draft tree: {st.tokens_per_forward:.0f} tokens scored per pass; where a draft was rejected "
            f"an alternative passed {rescued / st.tree_tried:.1%} of the time "
            f"({st.tree_guess_accepted} spatial guesses, {st.tree_draw_accepted} draws)"
        )
    if st.vp_gain is not None:
        lines.append(
            f"verification prediction: fused drafts expected to pass {st.vp_gain:.2f}x as often "
            "as plain ones"
        )
    if st.vp_auto is not None and not st.vp_auto["vp_auto_judged"]:
        lines.append(
            "VP auto drafted plainly: no draft was carried to a second look, so there was nothing to "
            "choose a strength by (a window of 3 or more carries drafts)"
        )
    elif st.vp_auto is not None:
        rates = ", ".join(f"{float(c):+g}: {r:.1%}" for c, r in st.vp_auto["vp_auto_rates"].items())
        lines.append(
            f"VP auto settled on strength {st.vp_auto['vp_auto_strength']:+g} "
            f"(the drafts that would have passed with each: {rates})"
        )
    return "\n".join(lines)


def partial_image(adapter, codes: Tensor, grey: float = 0.5) -> Tensor:
    """codes [h, w] with -1 where undecided -> [H, W, 3] image, undecided cells grey (for
    previews)."""
    known = codes >= 0
    image = adapter.preview_image(codes.clamp_min(0)[None])[0]
    scale = image.shape[0] // codes.shape[0]
    mask = known.cpu().repeat_interleave(scale, 0).repeat_interleave(scale, 1)[..., None]
    return torch.where(mask, image, torch.full_like(image, grey))
