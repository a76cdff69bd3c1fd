"""Check a model folder before (or instead of) a bug report: what family it is, which files are there
and readable, what the loader makes of them, the tokenizer's key ids, and one forward on a short
prompt with its time and memory. Exits 1 on any problem, so it also serves scripts.

    python -m sjdvp_core.check path/to/models/sjdvp/Janus-Pro-7B
    python -m sjdvp_core.check path/to/llamagen-c2i --no-forward      # files and loading only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time
import zipfile

import torch

from ..cli.mistakes import run_command
from ..engine.devices import default_device
from ..models.checkpoint import index_shards
from ..models.loading import PRECISIONS, load_model, resolve_dtype, usable_device
from ..models.registry import detect_family

PROG = "python -m sjdvp_core.check"
WEIGHT_FILES = (".safetensors", ".pt", ".pth", ".bin", ".ckpt")
GiB = 2**30


class Report:
    """Lines printed as they come; problems counted for the exit code."""

    def __init__(self, out=None):
        self.out, self.problems = out or sys.stdout, 0  # stdout as it is when the check runs

    def line(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def ok(self, what: str, detail: str = "") -> None:
        self.line(f"  ok       {what}{': ' + detail if detail else ''}")

    def problem(self, what: str, detail: str) -> None:
        self.problems += 1
        self.line(f"  PROBLEM  {what}: {detail}")


def environment(rep: Report) -> None:
    import transformers

    rep.line("environment")
    rep.ok("python", platform.python_version())
    rep.ok("torch", f"{torch.__version__} (cuda: {torch.cuda.is_available()})")
    rep.ok("transformers", transformers.__version__)
    try:
        import ftfy  # noqa: F401

        rep.ok("ftfy", "installed (LlamaGen t2i captions are cleaned exactly as upstream)")
    except ImportError:
        rep.ok(
            "ftfy",
            "not installed (captions cleaned without mojibake repair; typed prompts are unaffected)",
        )


def files(rep: Report, path: str) -> None:
    """Every file up to two levels down, with its size; weight files and JSON opened far enough to
    know they are whole; shards named by an index checked for presence."""
    rep.line("files")
    if os.path.isfile(path):
        listing = [path]
    else:
        listing = sorted(
            os.path.join(d, f)
            for d, _, fs in os.walk(path)
            for f in fs
            if os.path.relpath(d, path).count(os.sep) < 2
        )
    for p in listing:
        name = os.path.relpath(p, path) if p != path else os.path.basename(p)
        # a link whose target is gone (a Hugging Face cache folder's, moved)
        if not os.path.exists(p):
            rep.problem(name, f"a link to {os.path.realpath(p)}, which is missing; re-download it")
            continue
        size = os.path.getsize(p)
        try:
            detail = _open(p)
            shards = index_shards(p) if name.endswith(".index.json") else []
        except Exception as e:  # whatever the file is, the user needs to know it is not readable
            rep.problem(
                name,
                f"{size / GiB:.2f} GiB, cannot be read ({type(e).__name__}: {e}); re-download it",
            )
            continue
        rep.ok(name, f"{size / GiB:.2f} GiB" + (f", {detail}" if detail else ""))
        for shard in shards:
            if not os.path.isfile(os.path.join(os.path.dirname(p), shard)):
                rep.problem(shard, f"listed in {name} but missing; download it")


def _open(path: str) -> str:
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            return f"{len(list(f.keys()))} tensors"
    if path.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            json.load(f)
        return ""
    if path.endswith(WEIGHT_FILES):
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"
        if zipped and not zipfile.is_zipfile(path):
            raise ValueError("a zip checkpoint without its directory: the download stopped early")
        if zipped:
            with zipfile.ZipFile(path) as z:
                bad = z.testzip()  # CRC of every entry: catches truncated and corrupt downloads
            if bad is not None:
                raise ValueError(f"entry {bad} is corrupt")
            return "torch checkpoint (zip), intact"
        return "torch checkpoint (legacy format)"
    return ""


def key_ids(rep: Report, adapter) -> None:
    """The family's tokens and sizes that a wrong tokenizer file or config would silently change."""
    rep.line("tokens and layout")
    layout = adapter.layout
    h, w = layout.grid.shape
    rep.ok(
        "image grid",
        f"{h} x {w} codes, {layout.length} generated tokens, "
        f"{layout.image_tokens.numel()} image tokens in the vocabulary",
    )
    forced = sorted(set(layout.forced[layout.forced >= 0].tolist()))
    if forced:
        rep.ok(
            "forced tokens",
            f"{int((layout.forced >= 0).sum())} positions (row ends, end of image), ids {forced}",
        )
    for what, detail, as_expected in adapter.facts():
        (rep.ok if as_expected else rep.problem)(what, detail)


def forward(rep: Report, adapter, prompt) -> None:
    """Prefill (with CFG where the family's sampling has it) and one window of 4 drafts, timed;
    logits must be finite."""
    rep.line("forward")
    device = adapter.device
    with torch.inference_mode():
        t = time.perf_counter()
        layout, logits = adapter.start([prompt], None, adapter.default_sampling.uses_cfg)
        prefill_s = time.perf_counter() - t
        if not torch.isfinite(logits[:, layout.image_tokens.to(logits.device)]).all():
            rep.problem(
                "prefill",
                "image logits are not finite (wrong precision for these weights? try fp32)",
            )
        tokens = layout.image_tokens[torch.zeros(logits.shape[0], 4, dtype=torch.long)].to(device)
        t = time.perf_counter()
        window = adapter.forward(tokens, torch.arange(4, device=device).expand(logits.shape[0], 4))
        window_s = time.perf_counter() - t
        adapter.finish()
    if torch.isfinite(window).all():
        rep.ok(
            "prefill + a window of 4",
            f"{prefill_s:.2f} s + {window_s:.2f} s on {device}, logits finite",
        )
    else:
        rep.problem("window forward", "logits are not finite")


def memory(rep: Report, adapter) -> None:
    def size(module) -> float:
        return sum(t.numel() * t.element_size() for t in module.state_dict().values()) / GiB

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GiB  # KiB on Linux
    gpu = (
        f", GPU peak {torch.cuda.max_memory_allocated() / GiB:.2f} GiB"
        if torch.cuda.is_available()
        else ""
    )
    apart = (
        f" (+ {size(adapter.image_decoder):.2f} GiB of pixel model, used after the decode)"
        if adapter.pixels_apart
        else ""
    )
    rep.ok(
        "memory", f"weights {size(adapter.module):.2f} GiB{apart}, process peak {peak:.2f} GiB{gpu}"
    )


def check(
    path: str,
    device: str = "cpu",
    precision: str = "auto",
    run_forward: bool = True,
    prompt: str | None = None,
    out=None,
    **options,
) -> int:
    """The whole check; returns the number of problems found."""
    rep = Report(out)
    rep.line(f"sjdvp check of {path if path == 'demo' else os.path.abspath(path)}")
    environment(rep)
    try:
        family = detect_family(path)
    except (OSError, ValueError) as e:
        rep.line("family")
        rep.problem("detection", str(e))
        return rep.problems
    rep.line("family")
    rep.ok("detected", family)
    if family != "demo":
        files(rep, path)
    rep.line("loading")
    try:
        dtype = resolve_dtype(precision, usable_device(device))
        t = time.perf_counter()
        adapter = load_model(path, device=device, precision=precision, **options)
    except (OSError, ValueError, RuntimeError, ImportError) as e:
        rep.problem("load", str(e))
        return rep.problems
    rep.ok(
        "loaded",
        f"{adapter.family} in {time.perf_counter() - t:.1f} s, {dtype}, every "
        "tensor present with its expected shape",
    )
    rep.ok("sampling defaults", str(adapter.default_sampling))
    key_ids(rep, adapter)
    if run_forward:
        try:
            forward(rep, adapter, prompt if prompt is not None else adapter.example_condition)
        except (ValueError, RuntimeError) as e:
            rep.problem("forward", f"{type(e).__name__}: {e}")
    memory(rep, adapter)
    return rep.problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "path",
        help="a model folder (or LlamaGen GPT file) as it sits under models/sjdvp, or 'demo'",
    )
    ap.add_argument(
        "--device",
        default=default_device(),
        help="where to load and run the model (default: the GPU when there is one; "
        f"here {default_device()})",
    )
    ap.add_argument(
        "--precision",
        default="auto",
        choices=PRECISIONS,
        help="weight precision (auto: on a GPU bf16 if it fits, else int8, else nf4; fp32 on the CPU)",
    )
    ap.add_argument(
        "--no-forward",
        dest="run_forward",
        action="store_false",
        help="check files and loading only (a 7B model needs about 30 GB of RAM in fp32 on a CPU)",
    )
    ap.add_argument(
        "--prompt", help="the prompt of the test forward (default: a short caption, or class 0)"
    )
    ap.add_argument(
        "--trained-size",
        type=int,
        help="Lumina-mGPT: the size it was trained at, when the folder's "
        "name does not say (512, 768, 1024)",
    )
    args = ap.parse_args(argv)
    options = {"trained": args.trained_size} if args.trained_size is not None else {}

    def checked() -> int:
        problems = check(
            args.path, args.device, args.precision, args.run_forward, args.prompt, **options
        )
        print(
            f"\n{'no problems found' if not problems else f'{problems} problem(s) found'}. When you report a "
            "bug, paste this whole output."
        )
        return 1 if problems else 0

    return run_command(PROG, checked)


if __name__ == "__main__":
    sys.exit(main())
