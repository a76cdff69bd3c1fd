"""Many images: prompts x seeds x methods, sharded over processes with torchrun, resumable.

    python -m sjdvp_core.batch --prompts prompts.txt --seeds 0 1 2 --methods ar sjd-vp --out runs/a
    torchrun --nproc_per_node 4 -m sjdvp_core.batch --prompts prompts.jsonl --seeds 0-9 --out runs/b

prompts: one per line (blank lines and # lines skipped) or JSONL ("prompt", optional "negative").
A run started again with the same arguments redoes only the images it had not finished. Job order,
file names and failed ranks: docs/cli.md, "Many images"."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from ..engine.adapter import PixelSettings
from ..engine.decode import decode
from ..engine.devices import default_device
from ..engine.settings import METHODS, DecodeSettings, TreeSettings, WindowSettings
from .generate import Decoding, chosen_sampling, decoding_arguments, enlargement, load, save_png
from .mistakes import output_folder, run_command

PROG = "python -m sjdvp_core.batch"
# how long the ranks' one exchange at the end may wait: for the slowest rank's share, or a failed
# rank for the others' (the collectives' defaults, 30 minutes on gloo and 10 on NCCL, end a run
# whose ranks finish further apart)
RUN_TIMEOUT = timedelta(days=7)


@dataclass(frozen=True)
class Job:
    index: int
    prompt: str
    negative: str | None
    seed: int
    method: str

    @property
    def name(self) -> str:
        return f"{self.index:06d}_{self.method}_seed{self.seed}"


def read_prompts(path: str) -> list[tuple[str, str | None]]:
    """(prompt, negative) pairs from a text or JSONL file; a ValueError names the line that is
    wrong."""
    if not os.path.isfile(path):
        raise ValueError(
            f"--prompts {path}: no such file; give a text file (one prompt per line) or a .jsonl file"
        )
    kind = os.path.splitext(path)[1].lower()
    if kind == ".json":  # read as text, each line of it would be drawn as a prompt
        raise ValueError(
            f'--prompts {path}: give a .jsonl file (one JSON object per line, with a "prompt") or a '
            "text file (one prompt per line), not a .json file"
        )
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if kind == ".jsonl":
                try:
                    item = json.loads(line)
                    prompt, negative = item["prompt"], item.get("negative")
                except (ValueError, KeyError, TypeError) as e:
                    raise ValueError(f'{path}:{n}: not a JSON object with a "prompt" ({e})') from e
                if not isinstance(prompt, str) or not isinstance(negative, (str, type(None))):
                    raise ValueError(
                        f'{path}:{n}: "prompt" (and "negative", if given) must be text'
                    )
                out.append((prompt, negative if negative and negative.strip() else None))
            else:
                out.append((line, None))
    if not out:
        raise ValueError(f"{path}: no prompts in it")
    return out


def parse_seeds(items: list[str]) -> list[int]:
    """'0 1 5' or ranges '0-99' (inclusive)."""
    seeds = []
    for item in items:
        first, dash, last = item.partition("-")
        if (
            not first.isdigit()
            or (dash and not last.isdigit())
            or (last and int(last) < int(first))
        ):
            raise ValueError(f"--seeds {item!r}: give numbers or ranges like 0-99 (first to last)")
        seeds += list(range(int(first), int(last or first) + 1))
    return seeds


def jobs(prompts: list[tuple[str, str | None]], seeds: list[int], methods: list[str]) -> list[Job]:
    combos = [(p, n, s, m) for p, n in prompts for s in seeds for m in methods]
    return [Job(i, p, n, s, m) for i, (p, n, s, m) in enumerate(combos)]


def device_kind(device: str) -> str:
    """What a run's images depend on of its device: a GPU's model ("cuda: NVIDIA H100 80GB HBM3"),
    or the kind of processor (not its thread count, nor which of several identical GPUs a rank
    took)."""
    d = torch.device(device)
    if d.type == "cuda" and torch.cuda.is_available():
        return f"cuda: {torch.cuda.get_device_name(d)}"
    return f"{d.type}: {platform.processor() or platform.machine()}" if d.type == "cpu" else d.type


def claim(out: str, made_by: dict, has_images: bool) -> None:
    """<out>/run.json: what makes this run's images (the model, every setting, the jobs, the kind of
    device: the same seed draws another image on another). A run resumed into out must match it:
    another model, setting or device would add images made otherwise beside the first ones, and
    another job list would replace images.jsonl's index of them. -> a ValueError naming what
    differs. A folder without images yet (a run that stopped at a mistake before its first) takes
    the new arguments. A run.json from before the device was kept is taken as this device's."""
    made_by = json.loads(json.dumps(made_by))  # as it reads back (tuples as lists)
    path = os.path.join(out, "run.json")
    first = None
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            first = json.load(f)
        first.setdefault("device", made_by.get("device"))
    if first is not None and has_images:
        changed = sorted(k for k in made_by.keys() | first.keys() if made_by.get(k) != first.get(k))
        if changed:
            raise ValueError(
                f"{out} holds another run's images, made with other {', '.join(changed)}: give a new "
                "--out, or the same arguments to resume that run"
            )
    if first == made_by:
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(made_by, f, indent=1)
    os.replace(tmp, path)


def records(out: str) -> dict[str, dict]:
    """Image name -> its JSONL record, for the images whose PNG and line both exist."""
    found = {}
    for path in sorted(glob.glob(os.path.join(out, "images.rank*.jsonl"))):
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                    found[record["image"]] = record
                except (ValueError, KeyError, TypeError):
                    pass  # a line cut short by a kill: its image is redone
    return {name: r for name, r in found.items() if os.path.isfile(os.path.join(out, name))}


def finished(out: str, all_jobs: list[Job]) -> dict[str, dict]:
    """The jobs' images already done in out; a ValueError if out holds another run's images."""
    done = records(out)
    for job in all_jobs:
        r = done.get(job.name + ".png")
        if r is not None and (r.get("prompt"), r.get("seed"), r.get("method")) != (
            job.prompt,
            job.seed,
            job.method,
        ):
            raise ValueError(
                f"{out} holds another run's images ({r['image']} is {r.get('prompt')!r}, seed "
                f"{r.get('seed')}, not {job.prompt!r}, seed {job.seed}): give a new --out, or the "
                "same prompts, seeds and methods to resume that run"
            )
    return done


def merge(out: str, all_jobs: list[Job]) -> int:
    """<out>/images.jsonl: one line per finished image, in job order. -> lines written."""
    done = records(out)
    lines = [
        json.dumps(done[job.name + ".png"]) + "\n" for job in all_jobs if job.name + ".png" in done
    ]
    tmp = os.path.join(out, f"images.jsonl.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
    os.replace(tmp, os.path.join(out, "images.jsonl"))
    return len(lines)


def ranks() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) when run alone."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def run(
    prompts: str,
    seeds: list[str],
    methods: list[str],
    out: str,
    model: str = "demo",
    precision: str = "auto",
    window: str = "auto",
    cfg=None,
    top_k=None,
    top_p=None,
    temperature=None,
    device: str | None = None,
    width: int = 0,
    height: int = 0,
    tree_width: int = 1,
    tree_depth: int = 1,
    tree_branch: int = 0,
    coupled: bool = True,
    placement: str | None = None,
    auto_tree: bool = True,
    compile: bool = False,
    init: str = WindowSettings.init,
    trained_size: int | None = None,
    passes: str = DecodeSettings.passes,
) -> int:
    """Decode this rank's share of the jobs not done yet; -> images this rank wrote. placement: as
    load_model's (each rank places its own copy, e.g. "offload" onto its GPU). passes changes no
    token: a resumed run may change it."""
    rank, world, local = ranks()
    seed_list = parse_seeds(seeds)
    # a method named twice is one image per prompt and seed, as generate
    methods = list(dict.fromkeys(methods))
    all_jobs = jobs(read_prompts(prompts), seed_list, methods)
    how = Decoding(
        window,
        TreeSettings(width=tree_width, depth=tree_depth, branch=tree_branch),
        coupled,
        auto_tree,
        compile,
        init,
        passes,
    )
    sampling_args = dict(cfg=cfg, top_k=top_k, top_p=top_p, temperature=temperature)
    how.check(methods, {min(seed_list), max(seed_list)}, sampling_args)
    output_folder(out, "--out")
    distributed = world > 1
    if device is None or (distributed and device.startswith("cuda")):
        device = f"cuda:{local}" if torch.cuda.is_available() else default_device()
    listed = json.dumps([(j.prompt, j.negative, j.seed, j.method) for j in all_jobs]).encode()
    made_by = dict(
        model=os.path.realpath(model) if os.path.exists(model) else model,
        precision=precision,
        window=window,
        cfg=cfg,
        top_k=top_k,
        top_p=top_p,
        temperature=temperature,
        width=width,
        height=height,
        tree=(tree_width, tree_depth, tree_branch),
        coupled=coupled,
        auto_tree=auto_tree,
        compile=compile,
        init=init,
        trained_size=trained_size,
        jobs=hashlib.sha256(listed).hexdigest(),
        device=device_kind(device),
    )
    claim(out, made_by, bool(records(out)))
    done = finished(out, all_jobs)
    # one small exchange at the end (_failed_ranks), where every rank waits for the slowest
    if distributed:
        import torch.distributed as dist

        dist.init_process_group("gloo", timeout=RUN_TIMEOUT)
    mine = [j for j in all_jobs if j.index % world == rank and j.name + ".png" not in done]
    for job in mine:  # a kill's half-written PNGs of this rank's jobs
        for tmp in glob.glob(os.path.join(out, f".{job.name}.png.*.tmp.png")):
            os.remove(tmp)
    written, error = 0, None
    try:
        if mine:
            model_args = dict(
                model=model,
                device=device,
                precision=precision,
                placement=placement,
                width=width,
                height=height,
                trained_size=trained_size,
            )
            written = _decode_jobs(mine, all_jobs, out, rank, world, model_args, sampling_args, how)
    except KeyboardInterrupt:
        if rank == 0:  # what was finished is indexed, and the same command resumes
            raise KeyboardInterrupt(
                f"{out}/images.jsonl: {merge(out, all_jobs)} of {len(all_jobs)} images. Run the "
                "same command again to resume"
            ) from None
        raise
    except Exception as e:
        if not distributed:
            raise
        error = e
    failed = _failed_ranks(error is not None, rank, world) if distributed else []
    if rank == 0:
        lines = merge(out, all_jobs)
        print(
            f"{out}/images.jsonl: {lines} of {len(all_jobs)} images",
            file=sys.stderr if failed else sys.stdout,
        )
    if distributed:
        dist.destroy_process_group()
    if error is not None:
        raise error
    if failed:
        raise OtherRankFailed(
            f"rank {', '.join(map(str, failed))} of {world} stopped with an error (its message is in "
            "its output); this rank finished its images. Mend the cause and run the same command "
            "again: only what is missing is decoded"
        )
    return written


class OtherRankFailed(Exception):
    """Another process of a torchrun batch raised: this one finished its share, but the run is
    not complete."""


def _failed_ranks(failed: bool, rank: int, world: int) -> list[int]:
    """Every rank says whether it failed, in one all-reduce (gloo, on the CPU) that replaces the
    end-of-run barrier: a rank that raised still takes part, so the others finish, index their
    images and name it, rather than end in a collective with a lost peer or be stopped by
    torchrun's agent when the failed process exits."""
    import torch.distributed as dist

    flags = torch.zeros(world)
    flags[rank] = float(failed)
    dist.all_reduce(flags)
    return [r for r in range(world) if flags[r]]


def _decode_jobs(
    mine: list[Job],
    all_jobs: list[Job],
    out: str,
    rank: int,
    world: int,
    model_args: dict,
    sampling_args: dict,
    how: Decoding,
) -> int:
    """model_args: generate.load's."""
    from tqdm import tqdm

    model = model_args["model"]
    adapter = load(**model_args)
    sampling = chosen_sampling(adapter.default_sampling, **sampling_args)
    # every rank, before its first
    for prompt, negative in dict.fromkeys((j.prompt, j.negative) for j in all_jobs):
        try:
            adapter.prompt_length(
                [prompt], None if negative is None else [negative], sampling.uses_cfg
            )
        except ValueError as e:
            if repr(prompt) in str(e):
                raise
            raise ValueError(f"prompt {prompt!r}: {e}") from e
    log = os.path.join(out, f"images.rank{rank}.jsonl")
    _end_cut_line(log)
    bar = tqdm(mine, desc=f"rank {rank}/{world}", position=rank, unit="image", dynamic_ncols=True)
    for job in bar:
        settings = how.settings(job.method, sampling, job.seed)
        t = time.perf_counter()
        result = decode(adapter, job.prompt, settings, negatives=job.negative)
        seconds = time.perf_counter() - t
        image = job.name + ".png"
        tmp = os.path.join(out, f".{image}.{os.getpid()}.tmp.png")
        save_png(
            adapter.decode_image(result.codes, PixelSettings((job.prompt,), seed=job.seed))[0],
            tmp,
            enlargement(model),
        )
        os.replace(tmp, os.path.join(out, image))
        st = result.stats
        record = dict(
            image=image,
            index=job.index,
            prompt=job.prompt,
            negative=job.negative,
            seed=job.seed,
            method=job.method,
            model=model,
            precision=adapter.precision or model_args["precision"],
            settings=dict(
                window=settings.window.size,
                window_auto=settings.window.auto,
                tree_auto=settings.window.auto_tree,
                init=settings.window.init,
                tree=dataclasses.asdict(settings.window.tree),
                coupled=how.coupled,
                sampling=dataclasses.asdict(sampling),
            ),
            stats=dict(
                tokens=st.length,
                forward_passes=st.forward_passes,
                ar_passes=st.ar_passes,
                step_compression=st.step_compression,
                tokens_per_pass=st.mean_accepted,
                scored_per_pass=st.tokens_per_forward,
                seconds=seconds,
            ),
        )
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return len(mine)


def _end_cut_line(log: str) -> None:
    """A line a kill cut short stays alone on its line (skipped when read), not glued to the next
    record."""
    if os.path.isfile(log) and os.path.getsize(log):
        with open(log, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--prompts", required=True, help="a text file (one prompt per line) or a .jsonl file"
    )
    ap.add_argument("--seeds", nargs="+", default=["0"], help="seeds: numbers and ranges like 0-99")
    ap.add_argument("--methods", nargs="+", default=["sjd-vp"], choices=list(METHODS))
    ap.add_argument(
        "--out", required=True, help="folder for the PNGs and images.jsonl (resumed if it exists)"
    )
    decoding_arguments(ap)
    ap.set_defaults(device=None)  # each rank its own GPU (cuda:LOCAL_RANK), else the CPU
    return ap


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    try:
        return run_command(PROG, lambda: run(**vars(args)) and 0)
    except OtherRankFailed as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
