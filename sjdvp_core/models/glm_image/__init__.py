"""GLM-Image (Z.ai): the token stage's adapter over transformers' classes (adapter.py), and the
pixel stage through diffusers (dit.py). What both, and the family's detection, read of the
release:"""

import json
import os

REPO = "zai-org/GLM-Image"
GRID = 32  # pixels per token of the image grid (the processor's factor)
PIPELINE = "GlmImagePipeline"  # model_index.json's _class_name for the release's folder
ENCODER = "vision_language_encoder"  # the token stage's folder in it (model_type glm_image)


def is_glm_image(folder: str) -> bool:
    """A diffusers-format folder whose model_index.json names GlmImagePipeline (read without
    transformers)."""
    path = os.path.join(folder, "model_index.json")
    if not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("_class_name") == PIPELINE
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(
            f"{path}: cannot be read ({e}); re-download the model's model_index.json"
        ) from e
