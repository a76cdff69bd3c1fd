"""The speed-up report: a text summary and a picture of where and when tokens were accepted."""
from __future__ import annotations

import torch
from torch import Tensor

from .decode import DecodeResult

# a perceptually ordered ramp (dark blue -> teal -> yellow) for "committed at iteration t"
_RAMP = torch.tensor([[0.27, 0.00, 0.33], [0.23, 0.32, 0.55], [0.13, 0.57, 0.55], [0.37, 0.79, 0.38],
                      [0.99, 0.91, 0.14]])


def colour_ramp(x: Tensor) -> Tensor:
    """x in [0, 1], any shape -> RGB [..., 3]."""
    pos = x.clamp(0, 1) * (len(_RAMP) - 1)
    lo = pos.floor().long().clamp(max=len(_RAMP) - 2)
    frac = (pos - lo)[..., None]
    return _RAMP[lo] * (1 - frac) + _RAMP[lo + 1] * frac


def commit_map(result: DecodeResult, cell: int = 8) -> Tensor:
    """[B, h*cell, w*cell, 3]: each image cell coloured by the iteration that committed it (early =
    dark, late = yellow); runs of one colour are tokens accepted together."""
    it = result.stats.commit_iter[:, result.layout.grid].float()                  # [B, h, w]
    norm = it / it.amax(dim=(1, 2), keepdim=True).clamp_min(1)
    return colour_ramp(norm).repeat_interleave(cell, 1).repeat_interleave(cell, 2)


def report_text(result: DecodeResult, method: str, ar_passes: int | None = None) -> str:
    st = result.stats
    ar = ar_passes or st.length
    m = st.momentum()
    per_iter = torch.cat(st.committed_per_iter).float() if st.committed_per_iter else torch.zeros(1)
    lines = [
        f"{method}: {st.length} tokens per image in {st.forward_passes} forward passes "
        f"(AR needs {ar}): {ar / st.forward_passes:.2f}x fewer steps",
        f"tokens per pass: mean {st.mean_accepted:.2f}, max {int(per_iter.max())}; "
        f"drafts accepted {st.acceptance_rate:.1%}",
        f"time: {st.time_total:.2f} s (forward {st.time_forward:.2f}, verify {st.time_verify:.2f}, "
        f"draft {st.time_draft:.2f})",
        f"carried drafts accepted: {m['accept_if_rose']:.1%} when their probability had just risen, "
        f"{m['accept_if_not']:.1%} otherwise",
    ]
    if st.vp_gain is not None:
        lines.append(f"verification prediction: fused drafts expected to pass {st.vp_gain:.2f}x as often "
                     "as plain ones")
    if st.vp_auto is not None:
        rates = ", ".join(f"{float(c):+g}: {r:.1%}" for c, r in st.vp_auto["vp_auto_rates"].items())
        lines.append(f"VP auto settled on strength {st.vp_auto['vp_auto_strength']:+g} "
                     f"(drafts each would have had pass: {rates})")
    return "\n".join(lines)


def partial_image(adapter, codes: Tensor, grey: float = 0.5) -> Tensor:
    """codes [h, w] with -1 where undecided -> [H, W, 3] image, undecided cells grey (for previews)."""
    known = codes >= 0
    image = adapter.decode_image(codes.clamp_min(0)[None])[0]
    scale = image.shape[0] // codes.shape[0]
    mask = known.cpu().repeat_interleave(scale, 0).repeat_interleave(scale, 1)[..., None]
    return torch.where(mask, image, torch.full_like(image, grey))
