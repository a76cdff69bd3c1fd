"""The ComfyUI node layer (V3 API). Thin: every algorithm lives in sjdvp_core. Node ids and widget
order are a contract with saved workflows: never rename, never reorder, append new widgets last."""

from comfy_api.latest import ComfyExtension, io

from .decode_nodes import DecodeImage, Report, SpeculativeDecode
from .drafting_nodes import (
    DrafterGSD,
    DrafterLANTERN,
    DrafterSJD,
    JacobiWindow,
    VerificationPrediction,
)
from .model_nodes import LoadModel

NODES = [
    LoadModel,
    JacobiWindow,
    DrafterSJD,
    DrafterLANTERN,
    DrafterGSD,
    VerificationPrediction,
    SpeculativeDecode,
    DecodeImage,
    Report,
]


class SJDVPExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        # here, not in on_load, which ComfyUI 0.3.75 never calls; imported here: it needs ComfyUI's
        # server
        from . import routes

        routes.register()
        return NODES
