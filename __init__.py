"""sjdvp for ComfyUI: Speculative Jacobi Decoding (SJD, LANTERN, GSD) with Verification Prediction
for autoregressive image models. The nodes live in nodes/, the engine in sjdvp_core/."""

WEB_DIRECTORY = "./web"


async def comfy_entrypoint():
    from .nodes import SJDVPExtension

    return SJDVPExtension()
