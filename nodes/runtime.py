"""The node layer's contact with ComfyUI's services: the model folder, memory management, progress,
previews and interrupts. Node files stay declarative; the engine never sees any of this."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import comfy.cli_args
import comfy.model_management as mm
import comfy.model_patcher
import comfy.utils
import folder_paths
import torch

from ..sjdvp_core.engine.adapter import ModelAdapter
from ..sjdvp_core.hub import catalogue
from ..sjdvp_core.hub.download import download, on_disk
from ..sjdvp_core.models.folders import unfinished_marker
from ..sjdvp_core.models.loading import PRECISIONS, load_model
from ..sjdvp_core.models.registry import DEMO, DIT_FAMILIES, list_models, pixels_source

FOLDER = "sjdvp"
folder_paths.add_model_folder_path(FOLDER, os.path.join(folder_paths.models_dir, FOLDER))


def model_choices() -> list[str]:
    """'demo', the models on disk, then the catalogue's releases not on disk yet, with their
    size."""
    roots = folder_paths.get_folder_paths(FOLDER)
    return list_models(roots) + [e.choice for e in catalogue.ENTRIES if on_disk(e, roots) is None]


def pixel_sources() -> dict[str, str]:
    """{model choice: "dit" or "vq"}: whether its pixels come from a DiT (GLM-Image) or a VQ
    decoder, which the web extension greys Tokens to Image's DiT widgets by. Releases are keyed
    by their choice and by their name (a saved workflow's choice may carry another size); on-disk
    models by their listed name."""
    roots = folder_paths.get_folder_paths(FOLDER)
    out = {
        key: "dit" if e.family in DIT_FAMILIES else "vq"
        for e in catalogue.ENTRIES
        for key in (e.choice, e.name)
    }
    for name in list_models(roots):
        paths = [os.path.join(root, name) for root in roots]
        out[name] = (
            "dit" if name != DEMO and any(pixels_source(p) == "dit" for p in paths) else "vq"
        )
    return out


def model_path(name: str) -> str:
    """The path of the model a combo value names; a catalogue entry ("Janus-Pro-1B (download, ~4.2
    GB)", as listed or as saved in a workflow) is downloaded into the first models/sjdvp folder
    on first use and found there afterwards."""
    if name == DEMO:
        return DEMO
    roots = folder_paths.get_folder_paths(FOLDER)
    entry = catalogue.DOWNLOAD.match(name) and catalogue.find(name)
    # into the first root this user can write (a read-only one from extra_model_paths.yaml is
    # passed)
    if entry:
        return on_disk(entry, roots) or download(
            entry, next((r for r in roots if _writable(r)), roots[0]), BarProgress()
        )
    found = [p for p in (os.path.join(root, name) for root in roots) if os.path.exists(p)]
    if found:  # an unfinished download in one root does not hide the whole model in another
        return next((p for p in found if unfinished_marker(p) is None), found[0])
    offer = next((e for e in catalogue.ENTRIES if name in (e.name, e.folder, e.path)), None)
    hint = f" or choose '{offer.choice}' in the model list to download it," if offer else ""
    raise FileNotFoundError(
        f"model '{name}' is not in {' or '.join(roots)}: create that folder and put the "
        f"model's files in it (see the pack's docs/models.md),{hint} or pick 'demo'"
    )


def _writable(root: str) -> bool:
    """Whether a models root can take a download: it exists and this user may write there, or its
    nearest existing parent does (the download creates it)."""
    while not os.path.isdir(root) and os.path.dirname(root) != root:
        root = os.path.dirname(root)
    return os.access(root, os.W_OK | os.X_OK)


class BarProgress:
    """A (done, total) progress call -> ComfyUI's bar, at most one update every `every` seconds (and
    the last), and ComfyUI's interrupt raised at each call: a download's bytes (it stops at the
    next chunk, the part downloaded kept for the next run) or a pixel model's steps (every=0: a
    bar per step, stopped between steps)."""

    def __init__(self, every: float = 0.25):
        self.pbar, self.every, self.last = None, every, 0.0

    def __call__(self, done: int, total: int) -> None:
        mm.throw_exception_if_processing_interrupted()
        if self.pbar is None:
            self.pbar = comfy.utils.ProgressBar(total)
        now = time.monotonic()
        if done >= total or now - self.last >= self.every:
            self.last = now
            self.pbar.update_absolute(done, total)


@dataclass
class LoadedModel:
    """What flows through an SJDVP_MODEL socket: the engine adapter and ComfyUI's handles on it, one
    for the token generator and one for the image decoder, so decoding pixels after an eviction
    does not reload the transformer."""

    name: str
    adapter: ModelAdapter
    patcher: comfy.model_patcher.ModelPatcher  # everything but the image decoder
    decoder_patcher: comfy.model_patcher.ModelPatcher  # the VQ decoder
    placed: bool = False  # by a device map (PLACED): never moved by ComfyUI

    def get_ram_usage(self) -> int:
        """The weights' bytes in CPU memory, as ComfyUI's CLIP and VAE say theirs: its cache under
        RAM pressure (--cache-ram) weighs what an output holds by it, and would otherwise drop
        images before a model of gigabytes. A placed model's: the blocks its device map offloads
        to CPU memory."""
        if not self.placed:
            return self.patcher.get_ram_usage() + self.decoder_patcher.get_ram_usage()
        modules = dict(self.adapter.module.named_modules())
        in_ram = [
            modules[name] for name, where in self.adapter.device_map.items() if str(where) == "cpu"
        ]
        return sum(t.numel() * t.element_size() for m in in_ram for t in m.state_dict().values())


# the Load Model node's device options that place a model with a device map -> load_model's
# placement
PLACED = {"split over GPUs": "split", "offload to CPU": "offload"}


def load(name: str, precision: str, device: str) -> LoadedModel:
    """Loaded on the CPU (ComfyUI moves it), or placed by a device map (device: a PLACED option).
    Quantised precisions compute in auto's dtype for the device; auto on a GPU keeps that dtype
    where a default decode fits the card (its memory less ComfyUI's inference reserve: other
    models can be evicted), else int8, else NF4, and says why (log and report)."""
    if device not in ("auto", "cpu", *PLACED):
        raise ValueError(f"device={device!r}: choose one of {['auto', 'cpu', *PLACED]}")
    if precision not in PRECISIONS:  # before model_path, which may start a download
        raise ValueError(f"precision={precision!r}: choose one of {list(PRECISIONS)}")
    load_device = torch.device("cpu") if device == "cpu" else mm.get_torch_device()
    # accelerate puts it on the GPU(s) now; ComfyUI gets patchers it never loads
    if device in PLACED:
        path = model_path(name)
        gpus = (
            range(torch.cuda.device_count())
            if PLACED[device] == "split"
            else [load_device.index or 0]
        )
        # the map follows the memory free now
        for gpu in gpus if load_device.type == "cuda" else ():
            mm.free_memory(1e30, torch.device("cuda", gpu))
        adapter = load_model(
            path,
            device=load_device,
            precision=precision,
            compute=_compute(load_device),
            placement=PLACED[device],
        )
        return LoadedModel(
            name,
            adapter,
            _patcher(adapter.module, load_device),
            _patcher(adapter.image_decoder, load_device),
            placed=True,
        )
    budget = None
    if precision == "auto" and load_device.type != "cpu":
        budget = mm.get_total_memory(load_device) - mm.minimum_inference_memory()
    adapter = load_model(
        model_path(name),
        device="cpu",
        precision=precision,
        compute=_compute(load_device),
        memory=budget,
    )
    generator, decoder = without(adapter.module, adapter.image_decoder), adapter.image_decoder
    return LoadedModel(
        name, adapter, _patcher(generator, load_device), _patcher(decoder, load_device)
    )


def _patcher(
    module: torch.nn.Module, load_device: torch.device
) -> comfy.model_patcher.ModelPatcher:
    """ComfyUI's handle on module, which moves it between devices. The module goes in a ModuleDict:
    ComfyUI's patcher sets .device on the model it moves, which a transformers model (a
    generator, or Janus's and Emu3's VQ decoders) refuses."""
    size = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    return comfy.model_patcher.ModelPatcher(
        torch.nn.ModuleDict({"model": module}),
        load_device=load_device,
        offload_device=mm.unet_offload_device(),
        size=size,
    )


def without(module: torch.nn.Module, part: torch.nn.Module) -> torch.nn.Module:
    """The weights of module other than part's: its largest submodules that do not contain part (a
    ModuleDict of them, which moves those weights and nothing of part's); a module apart from
    part, whole."""
    if module is part:
        return torch.nn.ModuleDict()
    if not any(m is part for m in module.modules()):
        return module
    kept = torch.nn.ModuleDict()
    for name, child in module.named_children():
        rest = without(child, part)
        if len(list(rest.parameters())) + len(list(rest.buffers())):
            kept[name.replace(".", "_")] = rest
    own = [p for p in module.parameters(recurse=False)]
    if own:
        raise ValueError(
            f"{type(module).__name__} holds weights of its own beside its image decoder; "
            "it cannot be loaded apart from it"
        )
    return kept


def _compute(device: torch.device) -> str:
    """The dtype auto and the quantised precisions compute in on device, as ComfyUI judges it."""
    if device.type != "cpu" and mm.should_use_bf16(device):
        return "bf16"
    return "fp32"


def prepare(model: LoadedModel, memory_required: int) -> None:
    """Before decoding tokens: ask ComfyUI to put the generator and the image decoder (for the live
    preview; not a pixel model apart, such as GLM-Image's DiT) wholly on its device (plain
    modules cannot be partly loaded), with `memory_required` bytes left for the decode
    (sjdvp_core.engine.budget.decode_bytes), evicting other models if needed. A placed model is
    not moved: other models are evicted until `memory_required` is free on its device."""
    if model.placed:
        mm.free_memory(memory_required, model.adapter.device)
        return
    decoder = [] if model.adapter.pixels_apart else [model.decoder_patcher]
    mm.load_models_gpu(
        [model.patcher, *decoder], memory_required=memory_required, force_full_load=True
    )


def prepare_decoder(model: LoadedModel) -> None:
    """Before decoding pixels: only the image decoder needs the device (a placed model's own decoder
    is where it was put). A pixel model apart (GLM-Image's DiT and VAE) runs alone on its card:
    the other models there leave first, the token stage too. ComfyUI would keep them wherever the
    DiT's weights fit beside them, but its activations and its VAE's at full size are not counted
    anywhere (two NF4 stages on a 16 GB card, say)."""
    if model.placed and not model.adapter.pixels_apart:
        return
    device = model.decoder_patcher.load_device
    if model.adapter.pixels_apart and device.type != "cpu":
        # loaded already: stays
        kept = [m for m in mm.current_loaded_models if m.model is model.decoder_patcher]
        mm.free_memory(1e30, device, keep_loaded=kept)
    mm.load_models_gpu([model.decoder_patcher], force_full_load=True)


def previews_on() -> bool:
    """ComfyUI's live-preview setting, read as its samplers read it: the server's --preview-method,
    which newer servers set for each prompt from the frontend's "Live preview method" ("default"
    keeps the server's)."""
    method = comfy.cli_args.args.preview_method
    return str(getattr(method, "value", method)) != "none"


class Progress:
    """Engine progress -> ComfyUI's bar (counted in image tokens, and the interrupt point), with a
    throttled preview of the partly decoded image. The last preview is the finished image, or,
    when the run is interrupted, the image as far as it got; `final` keeps the finished one ([H,
    W, 3], 0..1). With ComfyUI's previews off, no partial image is decoded and none is sent
    (`final` stays None)."""

    def __init__(self, adapter, preview_every: float = 1.0):
        self.adapter, self.pbar, self.final = adapter, None, None
        self.preview_every, self.last = preview_every, time.monotonic()
        self.previews = previews_on()

    def __call__(self, done: int, total: int, partial: torch.Tensor) -> None:
        if self.pbar is None:
            self.pbar = comfy.utils.ProgressBar(total)
        if mm.processing_interrupted() and self.previews:
            # ComfyUI's progress hook raises before it sends a preview: send where decoding stopped
            # with the flag lowered for that one call, then raise as the hook would have.
            mm.interrupt_current_processing(False)
            try:
                self.pbar.update_absolute(done, total, ("JPEG", self._preview(partial), 512))
            finally:
                mm.interrupt_current_processing(True)
            mm.throw_exception_if_processing_interrupted()
        preview = None
        now = time.monotonic()
        if self.previews and (done >= total or now - self.last >= self.preview_every):
            preview = ("JPEG", self._preview(partial, keep=done >= total), 512)
            self.last = time.monotonic()  # from the preview's end: its own time is not the decode's
        self.pbar.update_absolute(done, total, preview)

    def _preview(self, partial: torch.Tensor, keep: bool = False):
        from PIL import Image

        from ..sjdvp_core.engine.report import partial_image

        image = partial_image(self.adapter, partial[0]).float().cpu()
        if keep:
            self.final = image
        return Image.fromarray((image * 255).byte().numpy())


class Measuring:
    """A calibration's progress (the engine's calibration.MeasureFn) -> ComfyUI's bar and a line of
    text on the node; ComfyUI's interrupt stops it (nothing is cached). The first run of a
    speculative method on a model measures the device (and, for an automatic window, how many
    drafts each window wins) before its first token: seconds on the demo, about a thousand of its
    passes for a large model on a GPU, which the node says rather than sitting at 0%."""

    def __init__(self):
        self.pbar, self.what, self.started, self.last = None, None, None, None

    def __call__(self, what: str, done: int, total: int) -> None:
        mm.throw_exception_if_processing_interrupted()
        if self.pbar is None:
            self.pbar, self.started = comfy.utils.ProgressBar(total), time.monotonic()
        if what != self.what:
            self.what = what
            say(
                f"sjdvp: measuring the {what} on this model and device (a first run; kept for later runs)"
            )
        self.pbar.update_absolute(done, total)
        self.last = time.monotonic()

    def then(self, progress: Callable) -> Callable:
        """The decode's progress, whose first call says how long measuring took (the measurement has
        ended when the first token is in), so the line comes before the decode's bar."""

        def first_then(*args) -> None:
            if self.started is not None:
                say(
                    f"sjdvp: measured this device in {self.last - self.started:.0f} s; later runs reuse it"
                )
                self.started = None
            progress(*args)

        return first_then


def say(text: str) -> None:
    """A line of text on the executing node (ComfyUI's progress text); nothing where ComfyUI has
    none."""
    try:
        from comfy_execution.utils import get_executing_context
        from server import PromptServer
    except ImportError:
        return
    context, server = get_executing_context(), getattr(PromptServer, "instance", None)
    if context is not None and server is not None:
        server.send_progress_text(text, context.node_id)


def oom_message(error: Exception, window: int, tree_width: int = 1) -> Exception:
    """What to change, as ComfyUI's own out-of-memory error, whose handling unloads every model
    for the next run."""
    tree = f" or tree width (now {tree_width})" if tree_width > 1 else ""
    return OOM(
        f"out of memory while decoding ({error}). Try a smaller Jacobi window (now {window}){tree}, a lower "
        "precision in the loader (bf16 / fp16, int8, or nf4, the smallest), a smaller batch, or free other "
        "models"
    )


def pixels(adapter: ModelAdapter, codes: torch.Tensor, settings) -> torch.Tensor:
    """adapter.decode_image, and where a VQ decoder runs out of memory on the whole batch, one image
    at a time, as ComfyUI's VAE decode splits its batch (the same images to float rounding: a VQ
    decoder draws each alone). A pixel model apart (a DiT) draws its batch's noise together, so
    it says what to change instead."""
    try:
        return adapter.decode_image(codes, settings)
    except OOM as e:
        if adapter.pixels_apart or len(codes) == 1:
            raise OOM(
                f"out of memory while turning tokens into pixels ({e}). Decode fewer images at once (batch "
                "size), a smaller image, or free other models"
            ) from e
    mm.soft_empty_cache()
    return torch.cat([adapter.decode_image(c[None], settings) for c in codes])


OOM = mm.OOM_EXCEPTION
