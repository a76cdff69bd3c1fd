"""Just enough of ComfyUI (comfy, comfy_api.latest, folder_paths) for the node layer to import and
run in-process, as ComfyUI's own unit tests stub what they do not exercise: schemas are recorded
as plain namespaces, the memory manager records what it was asked to load, no interrupt is ever
pending. `load_pack()` imports this repository as the package ComfyUI would (its node files
import the engine relatively)."""

from __future__ import annotations

import enum
import importlib.util
import os
import sys
import tempfile
import types
from types import SimpleNamespace

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = "sjdvp_pack"


class _Socket:
    """io.Int, io.Custom("X"), ...: Input(name, **options) and Output(**options) as namespaces."""

    def __init__(self, kind: str):
        self.kind = kind

    def Input(self, name: str, **options):
        return SimpleNamespace(kind=self.kind, name=name, **options)

    def Output(self, **options):
        return SimpleNamespace(kind=self.kind, **options)


class NodeOutput:
    def __init__(self, *values, ui=None):
        self.values, self.ui = values, ui


class _PreviewText:
    def __init__(self, text: str):
        self.text = text

    def as_dict(self) -> dict:
        return {"text": [self.text]}


class _PreviewImage:
    """Core saves a temp PNG per image; the stub keeps the tensor where the file name would be."""

    def __init__(self, image, animated: bool = False, cls=None):
        assert image.ndim == 4 and image.shape[-1] == 3, image.shape
        self.image, self.animated = image, animated

    def as_dict(self) -> dict:
        return {
            "images": [
                {
                    "filename": "ComfyUI_temp_00001_.png",
                    "subfolder": "",
                    "type": "temp",
                    "tensor": self.image,
                }
            ],
            "animated": (self.animated,),
        }


class MemoryManager(types.ModuleType):
    """comfy.model_management: records every load_models_gpu call."""

    OOM_EXCEPTION = type("OutOfMemoryError", (RuntimeError,), {})

    def __init__(self):
        super().__init__("comfy.model_management")
        self.loads: list[tuple[list, dict]] = []
        self.frees: list[tuple[int, object]] = []
        self.current_loaded_models: list = []

    def load_models_gpu(self, patchers, **kwargs):
        self.loads.append((list(patchers), kwargs))

    def soft_empty_cache(self):
        pass

    def free_memory(self, memory_required, device, keep_loaded=()):
        self.frees.append((memory_required, device))
        self.kept = list(keep_loaded)

    def get_torch_device(self):
        import torch

        return torch.device("cpu")

    unet_offload_device = get_torch_device

    def should_use_bf16(self, device):
        return False

    total_memory = 24 << 30

    def get_total_memory(self, dev=None, torch_total_too=False):
        return self.total_memory

    def minimum_inference_memory(self):
        return 1 << 30

    def processing_interrupted(self):
        return False

    def interrupt_current_processing(self, value=True):
        pass

    def throw_exception_if_processing_interrupted(self):
        pass


class PreviewMethod(enum.Enum):  # ComfyUI's LatentPreviewMethod, the values the pack reads
    NONE = "none"
    AUTO = "auto"


class ModelPatcher:
    def __init__(self, model, load_device, offload_device, size=0):
        self.model, self.load_device, self.offload_device, self.size = (
            model,
            load_device,
            offload_device,
            size,
        )

    def get_ram_usage(self):  # ComfyUI's: the size it was given
        return self.size


class ProgressBar:
    def __init__(self, total):
        self.total, self.updates = total, []

    def update_absolute(self, value, total=None, preview=None):
        self.updates.append((value, total, preview is not None))


STUBBED = (
    "comfy",
    "comfy.cli_args",
    "comfy.model_management",
    "comfy.model_patcher",
    "comfy.utils",
    "folder_paths",
    "comfy_api",
    "comfy_api.latest",
    "comfy_api.latest.io",
    "comfy_api.latest.ui",
)


def uninstall() -> None:
    """Take the stubs and the pack imported over them out of sys.modules."""
    for name in [
        n for n in sys.modules if n in STUBBED or n == PACKAGE or n.startswith(PACKAGE + ".")
    ]:
        del sys.modules[name]


def install(models_root: str | None = None) -> MemoryManager:
    """Put the stubs in sys.modules (replacing earlier ones); returns the memory manager stub."""
    mm = MemoryManager()
    comfy = types.ModuleType("comfy")
    patcher = types.ModuleType("comfy.model_patcher")
    patcher.ModelPatcher = ModelPatcher
    utils = types.ModuleType("comfy.utils")
    utils.ProgressBar = ProgressBar
    cli_args = types.ModuleType("comfy.cli_args")
    cli_args.args = SimpleNamespace(preview_method=PreviewMethod.AUTO)  # as the test server starts
    comfy.cli_args, comfy.model_management, comfy.model_patcher, comfy.utils = (
        cli_args,
        mm,
        patcher,
        utils,
    )
    paths = types.ModuleType("folder_paths")
    paths.models_dir = models_root or tempfile.mkdtemp(prefix="sjdvp-models-")
    paths.roots = {}
    paths.add_model_folder_path = lambda name, path: paths.roots.setdefault(name, []).append(path)
    paths.get_folder_paths = lambda name: paths.roots.get(name, [])
    io = types.ModuleType("comfy_api.latest.io")
    for kind in ("Boolean", "Combo", "Float", "Int", "String", "Image"):
        setattr(io, kind, _Socket(kind))
    io.Custom, io.Schema, io.NodeOutput = _Socket, (lambda **kw: SimpleNamespace(**kw)), NodeOutput
    io.ComfyNode = type("ComfyNode", (), {})
    ui = types.ModuleType("comfy_api.latest.ui")
    ui.PreviewText, ui.PreviewImage = _PreviewText, _PreviewImage
    latest = types.ModuleType("comfy_api.latest")
    latest.io, latest.ui, latest.ComfyExtension = io, ui, type("ComfyExtension", (), {})
    api = types.ModuleType("comfy_api")
    api.latest = latest
    sys.modules.update(
        dict(zip(STUBBED, (comfy, cli_args, mm, patcher, utils, paths, api, latest, io, ui)))
    )
    return mm


def load_pack():
    """Import this repository as ComfyUI does (a package named after its folder), with the stubs
    in place."""
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(REPO, "__init__.py"), submodule_search_locations=[REPO]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{PACKAGE}.nodes")
