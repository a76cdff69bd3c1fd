"""Pictures drawn with Pillow, outside the engine: the commit map with its legend (what the Speed-up
Report node outputs, so a shared screenshot carries the figure)."""

from __future__ import annotations

import torch
from torch import Tensor

from .engine.loop import DecodeResult
from .engine.report import colour_ramp, commit_map, report_data


def commit_figure(result: DecodeResult, method: str, min_width: int = 256) -> Tensor:
    """commit_map with what it shows written under it, so a shared screenshot carries the figure:
    the step compression, and the colour scale from the first forward pass to the last.
    -> [B, H, W, 3] in 0..1."""
    from PIL import Image, ImageDraw

    h, w = result.layout.grid.shape
    cell = max(1, -(-min_width // w))
    # iteration 0 = prefill = pass 1
    last = int(result.stats.commit_iter[:, result.layout.grid].max())
    maps = commit_map(result, cell=cell, last=last)  # [B, h*cell, w*cell, 3]
    width = maps.shape[2]
    data = report_data(result, method)
    pad, bar = 4, max(6, width // 40)
    caption = (
        f"{method}: {data['step_compression']:.2f}x fewer passes ({data['forward_passes']} vs AR "
        f"{data['ar_passes']})"
    )
    size = max(8, width // 22)
    font = _font(size)
    while size > 8 and font.getlength(caption) > width - 2 * pad:
        size -= 1
        font = _font(size)
    line = font.getbbox("Ag")[3] + 2
    band = Image.new("RGB", (width, 2 * line + bar + 3 * pad), (24, 24, 24))
    draw = ImageDraw.Draw(band)
    draw.text((pad, pad), caption, fill=(255, 255, 255), font=font)
    ramp = (colour_ramp(torch.linspace(0, 1, width - 2 * pad)) * 255).byte()  # [W', 3]
    strip = Image.fromarray(ramp[None].expand(bar, -1, -1).contiguous().numpy())
    y = pad + line + pad // 2
    band.paste(strip, (pad, y))
    y += bar + 1
    draw.text((pad, y), "committed in forward pass 1", fill=(200, 200, 200), font=font)
    right = str(last + 1)
    draw.text(
        (width - pad - draw.textlength(right, font=font), y), right, fill=(200, 200, 200), font=font
    )
    legend = (
        torch.frombuffer(bytearray(band.tobytes()), dtype=torch.uint8)
        .view(band.height, width, 3)
        .float()
        / 255
    )
    return torch.cat([maps, legend[None].expand(maps.shape[0], -1, -1, -1)], dim=1)


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1: one fixed bitmap size
        return ImageFont.load_default()
