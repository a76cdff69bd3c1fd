"""Command line: generate images with several decoding methods from the same prompt and seed, save
them, and print the speed-up report side by side.

    python -m sjdvp_core --prompt "a red circle on grass" --methods ar sjd sjd-vp --out out
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time
from dataclasses import dataclass

import torch

from ..engine.adapter import KEEP_SIZE, PixelSettings, at_size
from ..engine.calibration import calibration, warm_up
from ..engine.decode import decode
from ..engine.devices import default_device
from ..engine.settings import (
    DEFAULT_WINDOW,
    DRAFT_INITS,
    METHODS,
    PASS_MODES,
    DecodeSettings,
    DrafterSettings,
    SamplingSettings,
    TreeSettings,
    WindowSettings,
    method_settings,
)
from ..models.loading import PRECISIONS, load_model
from ..models.placement import PLACEMENTS
from ..timing import interleaved
from .mistakes import output_folder, run_command

PROG = "python -m sjdvp_core"


DEMO_ENLARGE = (
    4  # the demo model's images are 64 px: written 4x larger (nearest), and the PNG says so
)


def save_png(image: torch.Tensor, path: str, enlarge: int = 1) -> None:
    """image [H, W, 3] in 0..1, at the model's own size; enlarge > 1 scales it up (nearest) and
    records that in the PNG's Comment text."""
    from PIL import Image, PngImagePlugin

    arr = (image.clamp(0, 1) * 255).round().byte().numpy()
    picture, info = Image.fromarray(arr), PngImagePlugin.PngInfo()
    if enlarge > 1:
        picture = picture.resize((arr.shape[1] * enlarge, arr.shape[0] * enlarge), Image.NEAREST)
        info.add_text(
            "Comment",
            f"generated at {arr.shape[1]}x{arr.shape[0]} px, enlarged {enlarge}x (nearest)",
        )
    picture.save(path, pnginfo=info)


def enlargement(model: str) -> int:
    return DEMO_ENLARGE if model == "demo" else 1


def window_arg(text: str) -> tuple[int, bool]:
    """--window: 'auto' (the default window), 'auto:N' (at most N tokens per pass) or N (a fixed
    window)."""
    if text == "auto":
        return DEFAULT_WINDOW.size, True
    most = text[5:] if text.startswith("auto:") else text
    if not most.isdigit():
        raise ValueError(f"window={text!r}: give 'auto', 'auto:N' or a number N of tokens per pass")
    return int(most), text.startswith("auto:")


@dataclass(frozen=True)
class Decoding:
    """How the command lines decode (decoding_arguments), the same for every method, prompt and
    seed."""

    window: int | str = "auto"
    tree: TreeSettings = TreeSettings()
    coupled: bool = DrafterSettings().coupled
    auto_tree: bool = True
    compile: bool = False
    init: str = WindowSettings.init
    passes: str = DecodeSettings.passes

    @property
    def size(self) -> tuple[int, bool]:
        """(the window's tokens, or the most an automatic one may take; whether it is automatic)."""
        return window_arg(self.window) if isinstance(self.window, str) else (self.window, False)

    def settings(self, method: str, sampling: SamplingSettings, seed: int) -> DecodeSettings:
        size, auto = self.size
        return method_settings(
            method,
            size,
            sampling,
            seed,
            coupled=self.coupled,
            auto=auto,
            auto_tree=auto and self.auto_tree and not self.tree.on,
            tree=self.tree,
            compile=self.compile,
            init=self.init,
            passes=self.passes,
        )

    def check(self, methods, seeds, sampling_given: dict) -> None:
        """Every method's settings built with the sampling values given, before the model loads: a
        window, tree, seed or sampling value out of range is said at once, not after minutes of
        loading (the model's own defaults fill in the values not given, once it has loaded)."""
        sampling = chosen_sampling(SamplingSettings(), **sampling_given)
        for method in methods:
            for seed in seeds:
                self.settings(method, sampling, seed)


def load(
    model: str,
    device: str,
    precision: str,
    placement: str | None,
    width: int,
    height: int,
    trained_size: int | None = None,
):
    """The command lines' model, at the size asked for."""
    options = {"trained": trained_size} if trained_size is not None else {}
    return at_size(
        load_model(model, device=device, precision=precision, placement=placement, **options),
        width,
        height,
    )


def main(
    prompt: str,
    methods=("ar", "sjd-vp"),
    model: str = "demo",
    window: int | str = "auto",
    seed: int = DecodeSettings().seed,
    cfg: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float | None = None,
    out: str = "out",
    device: str = "cpu",
    coupled: bool = DrafterSettings().coupled,
    width: int = KEEP_SIZE,
    height: int = KEEP_SIZE,
    tree_width: int = TreeSettings().width,
    tree_depth: int = TreeSettings().depth,
    tree_branch: int = TreeSettings().branch,
    precision: str = "auto",
    placement: str | None = None,
    auto_tree: bool = True,
    compile: bool = False,
    repeats: int = 3,
    init: str = WindowSettings.init,
    trained_size: int | None = None,
    passes: str = DecodeSettings.passes,
) -> list[dict]:
    if repeats < 1:  # before the model loads, as every other mistake
        raise ValueError(f"repeats={repeats}: time each method at least once")
    how = Decoding(
        window,
        TreeSettings(width=tree_width, depth=tree_depth, branch=tree_branch),
        coupled,
        auto_tree,
        compile,
        init,
        passes,
    )
    given = dict(cfg=cfg, top_k=top_k, top_p=top_p, temperature=temperature)
    how.check(methods, [seed], given)
    output_folder(out, "--out")
    adapter = load(model, device, precision, placement, width, height, trained_size)
    sampling = chosen_sampling(adapter.default_sampling, **given)
    rows, chosen = [], {}
    for (
        name
    ) in methods:  # calibrations and warm-ups first: the timed decodes below run in a warm process
        settings = how.settings(name, sampling, seed)
        t = time.perf_counter()
        auto_window = settings.window.auto and settings.window.size > 1
        with Measuring(name) as shown:
            calibrated = (
                calibration(adapter, settings, progress=shown) if auto_window else (None, None)
            )
        measuring = time.perf_counter() - t
        if measuring > 1.0:  # read from the cache it takes milliseconds
            print(
                f"{name}: measured this device's pass cost and the automatic window's acceptance in "
                f"{measuring:.1f} s (once per model and device; cached)"
            )
        warm_up(adapter, settings, calibrated[1].plans if calibrated[1] is not None else ())
        chosen[name] = settings, calibrated
    timed = interleaved(
        {
            name: functools.partial(decode, adapter, prompt, settings, cost=cost, profile=profile)
            for name, (settings, (cost, profile)) in chosen.items()
        },
        repeats,
        warmup=0,
        device=device,
    )
    for name, t in timed.items():
        result, decode_s = t.result, t.median  # the same tokens each time
        image = adapter.decode_image(result.codes, PixelSettings((prompt,), seed=seed))[0]
        path = unused_path(out, f"{name}_seed{seed}")
        save_png(image, path, enlargement(model))
        st = result.stats
        rows.append(
            dict(
                method=name,
                nfe=st.forward_passes,
                accepted=st.mean_accepted,
                scored=st.tokens_per_forward,
                acceptance=st.acceptance_rate,
                seconds=decode_s,
                path=path,
                stats=st,
            )
        )
    base = rows[0]
    tree = f"  draft tree {tree_width}x{tree_depth}" if tree_width > 1 else ""
    size, auto = how.size
    shown = f"auto (at most {size})" if auto else size
    print(
        f'prompt: "{prompt}"  seed {seed}  window {shown}{tree}  {"coupled" if coupled else "independent"} drafts  '
        f"{sampling}  ({adapter.layout.length} tokens)"
    )
    print(
        f"{'method':<12}{'forward passes':>16}{'step compression':>18}{'tokens/pass':>13}{'scored/pass':>13}"
        f"{'acceptance':>12}{'decode s':>10}{'speed-up':>10}  image"
    )
    for r in rows:
        print(
            f"{r['method']:<12}{r['nfe']:>16}{base['nfe'] / r['nfe']:>17.2f}x{r['accepted']:>13.2f}"
            f"{r['scored']:>13.1f}{r['acceptance']:>12.3f}{r['seconds']:>10.2f}"
            f"{base['seconds'] / r['seconds']:>9.2f}x  {r['path']}"
        )
    timed = (
        f"the median of {repeats} decodes, methods taking turns" if repeats > 1 else "one decode"
    )
    print(
        f"speed-up: wall-clock against the first method, {timed}, after a warm-up (calibration not included); "
        "tokens/pass: committed, scored/pass: fed to the model"
    )
    return rows


def unused_path(folder: str, stem: str) -> str:
    """<folder>/<stem>.png, or <stem>_2.png, _3, ... where an earlier run left one: a run never
    replaces the images of another (another prompt, say, with the same method and seed)."""
    path, n = os.path.join(folder, f"{stem}.png"), 1
    while os.path.exists(path):
        n += 1
        path = os.path.join(folder, f"{stem}_{n}.png")
    return path


class Measuring:
    """A calibration's progress (decode.MeasureFn) on a terminal: one line, rewritten in place and
    cleared when it ends; nothing where stderr is not a terminal (logs, CI)."""

    def __init__(self, name: str, stream=None):
        self.name, self.stream, self.width = name, stream or sys.stderr, 0

    def __call__(self, what: str, done: int, total: int) -> None:
        if self.stream.isatty():
            line = f"{self.name}: measuring this device for the automatic window: {what} {100 * done // total}%"
            self.stream.write("\r" + line.ljust(self.width))
            self.stream.flush()
            self.width = len(line)

    def __enter__(self) -> "Measuring":
        return self

    def __exit__(self, *exc) -> None:
        if self.width:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()


def chosen_sampling(
    defaults: SamplingSettings, cfg=None, top_k=None, top_p=None, temperature=None
) -> SamplingSettings:
    """The model's sampling defaults with what the command line gave instead."""
    given = dict(cfg_scale=cfg, top_k=top_k, top_p=top_p, temperature=temperature)
    return dataclasses.replace(defaults, **{k: v for k, v in given.items() if v is not None})


def command(argv=None) -> int:
    """`python -m sjdvp_core`: a mistake (bad size, unknown model folder) is one line on stderr
    and exit 2."""
    args = parser().parse_args(argv)
    return run_command(PROG, lambda: main(**vars(args)) and 0)


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--prompt",
        default="a red circle on grass",
        help="what to draw (demo: colour, shape, background)",
    )
    ap.add_argument(
        "--methods",
        nargs="+",
        default=["ar", "sjd-vp"],
        choices=list(METHODS),
        help="decoding methods, the first is the baseline of the speed-up columns",
    )
    ap.add_argument(
        "--seed",
        type=int,
        default=DecodeSettings().seed,
        help="the seed of the decode's randomness",
    )
    ap.add_argument(
        "--out",
        default="out",
        help="folder for the PNGs (<method>_seed<seed>.png; an image already "
        "there is kept, and the new one numbered)",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed decodes per method, the methods taking turns; the report gives the median (a "
        "decode's time drifts from run to run with the machine's load)",
    )
    decoding_arguments(ap)
    return ap


def decoding_arguments(ap: argparse.ArgumentParser) -> None:
    """The model, its precision and device, and how to decode: shared with python -m
    sjdvp_core.batch."""
    ap.add_argument(
        "--model",
        default="demo",
        help="'demo', or a model folder / GPT file (e.g. a LlamaGen folder)",
    )
    ap.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="weights: auto (on a GPU bf16 if the model fits its free memory, else int8, else nf4; fp32 "
        "on the CPU), bf16, fp16, fp32, int8 (weight-only) or nf4 (bitsandbytes)",
    )
    ap.add_argument(
        "--placement",
        choices=PLACEMENTS,
        help="beyond one card (needs accelerate): 'split' the model over every GPU, or 'offload' what "
        "does not fit --device to CPU memory (streamed once per pass); default: all on --device",
    )
    ap.add_argument(
        "--window",
        default="auto",
        help="Jacobi window: 'auto' (tokens per pass chosen for this device, at most "
        f"{DEFAULT_WINDOW.size}), 'auto:N' (at most N) or N (fixed)",
    )
    ap.add_argument(
        "--cfg", type=float, help="classifier-free guidance scale (default: the model's)"
    )
    ap.add_argument("--top-k", dest="top_k", type=int, help="top-k (default: the model's)")
    ap.add_argument("--top-p", dest="top_p", type=float, help="top-p (default: the model's)")
    ap.add_argument("--temperature", type=float, help="temperature (default: the model's)")
    ap.add_argument(
        "--device",
        default=default_device(),
        help=f"where to decode (default: the GPU when there is one; here {default_device()})",
    )
    ap.add_argument(
        "--width",
        type=int,
        default=KEEP_SIZE,
        help="image width in pixels (Lumina-mGPT 1.0 and 2.0, Emu3, GLM-Image); 0: default",
    )
    ap.add_argument(
        "--height", type=int, default=KEEP_SIZE, help="image height in pixels; 0: default"
    )
    ap.add_argument(
        "--tree-width",
        dest="tree_width",
        type=int,
        default=TreeSettings().width,
        help="draft tree: candidates at each of the first undecided slots (1 = a chain)",
    )
    ap.add_argument(
        "--tree-depth",
        dest="tree_depth",
        type=int,
        default=TreeSettings().depth,
        help="draft tree: how many of the first undecided slots branch",
    )
    ap.add_argument(
        "--tree-branch",
        dest="tree_branch",
        type=int,
        default=TreeSettings().branch,
        help="draft tree: drafts after each alternative (0 = to the window's end; fewer tokens per pass)",
    )
    ap.add_argument(
        "--no-auto-tree",
        dest="auto_tree",
        action="store_false",
        help="with --window auto: never weigh a capped draft tree (by default one is used where this "
        "device scores its extra tokens almost for free; never with --tree-width above 1)",
    )
    ap.add_argument(
        "--compile",
        action="store_true",
        help="run the engine's own step (verification, drafting) through torch.compile: it compiles "
        "once per setting (seconds; the command compiles before it times), then each iteration's "
        "work is a few fused kernels instead of hundreds (for GPUs; same images' law)",
    )
    ap.add_argument(
        "--passes",
        default=DecodeSettings.passes,
        choices=PASS_MODES,
        help="the model's forward pass: auto (replayed as a CUDA graph on a GPU, each shape recorded on "
        "its second use and checked against the plain pass; plain elsewhere), captured (also tries "
        "NF4 weights) or eager; never changes a token",
    )
    ap.add_argument(
        "--init",
        default=WindowSettings.init,
        choices=DRAFT_INITS,
        help="how fresh drafts start: a copy of the known cell above (default), to the left, or random "
        "image tokens (exact, all of them)",
    )
    ap.add_argument(
        "--trained-size",
        dest="trained_size",
        type=int,
        help="Lumina-mGPT 1.0: the size it was trained at (512, 768, 1024), where the folder's name "
        "does not say",
    )
    ap.add_argument(
        "--no-coupling",
        dest="coupled",
        action="store_false",
        help="draw each draft with fresh randomness (classic SJD) instead of coupled drafting",
    )


if __name__ == "__main__":
    sys.exit(command())
