"""The pack's one HTTP route, read by its web extension (web/js/sjdvp.js): which model choices draw
their pixels with a DiT, so Tokens to Image greys out the DiT's widgets for every other family."""

from aiohttp import web
from server import PromptServer

from . import runtime

PIXELS = "/sjdvp/pixels"


def register() -> None:
    """Once per server (ComfyUI adds its routes table to the app after loading the custom nodes)."""
    routes = PromptServer.instance.routes
    if any(getattr(r, "path", None) == PIXELS for r in routes):
        return

    @routes.get(PIXELS)
    async def pixels(request: web.Request) -> web.Response:
        return web.json_response(runtime.pixel_sources())
