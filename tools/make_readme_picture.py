"""The README's picture: AR and SJD-VP from one prompt and seed on the built-in demo model, side by
side, each captioned with the time it took (the median of the timed decodes, methods taking turns,
as `python -m sjdvp_core` times them). Writes docs/ar_vs_sjd_vp.png and
benchmarks/results/readme_picture.md (what ran, on which CPU, the table the command printed).

    python tools/make_readme_picture.py [--repeats 5]

Run it alone on the machine: another process on the same cores moves the times.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import os
import platform
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from sjdvp_core.cli.generate import main as generate  # noqa: E402

PICTURE = os.path.join(REPO, "docs", "ar_vs_sjd_vp.png")
RECORD = os.path.join(REPO, "benchmarks", "results", "readme_picture.md")
PROMPT, SEED = "a red circle on grass", 0
NAMES = {"ar": "AR", "sjd-vp": "SJD-VP"}


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(
                line.split(":", 1)[1].strip() for line in f if line.startswith("model name")
            )
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def compose(rows: list[dict]) -> "Image.Image":  # noqa: F821
    """The images in a row, a caption band under each: method, seconds, passes (and the
    speed-up)."""
    from PIL import Image, ImageDraw, ImageFont

    tiles = [Image.open(r["path"]).convert("RGB") for r in rows]
    w, h = tiles[0].size
    pad, band = 8, 46
    out = Image.new("RGB", (len(tiles) * (w + pad) + pad, h + band + pad), (24, 24, 24))
    draw = ImageDraw.Draw(out)
    try:
        font = ImageFont.truetype("DejaVuSans.ttf", 15)
    except OSError:
        font = ImageFont.load_default()
    base = rows[0]["seconds"]
    for i, (tile, r) in enumerate(zip(tiles, rows)):
        x = pad + i * (w + pad)
        out.paste(tile, (x, pad))
        faster = f" ({base / r['seconds']:.2f}x)" if i else ""
        draw.text(
            (x, h + pad + 4),
            f"{NAMES[r['method']]}: {r['seconds']:.2f} s{faster}",
            fill=(255, 255, 255),
            font=font,
        )
        draw.text((x, h + pad + 24), f"{r['nfe']} forward passes", fill=(190, 190, 190), font=font)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--repeats", type=int, default=5, help="timed decodes per method (the median is shown)"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as out:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            rows = generate(
                PROMPT, methods=("ar", "sjd-vp"), seed=SEED, out=out, repeats=args.repeats
            )
        compose(rows).save(PICTURE)
        # as `--out out` would print it
        table = printed.getvalue().strip().replace(out + os.sep, "out/")
    command = f"python tools/make_readme_picture.py --repeats {args.repeats}"
    with open(RECORD, "w", encoding="utf-8") as f:
        f.write(
            f"# The README's picture\n\n`{command}` on {datetime.date.today()}, {cpu_name()}, "
            f'{os.cpu_count()} cores, torch {__import__("torch").__version__}: the demo model, "{PROMPT}", '
            f"seed {SEED}, the command line's defaults (automatic window, coupled drafts, VP auto). It ran "
            f'`python -m sjdvp_core --prompt "{PROMPT}" --methods ar sjd-vp --repeats {args.repeats}` and '
            f"printed:\n\n```\n{table}\n```\n"
        )
    print(table)
    print(f"wrote {os.path.relpath(PICTURE, REPO)} and {os.path.relpath(RECORD, REPO)}")


if __name__ == "__main__":
    main()
