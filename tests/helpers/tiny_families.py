"""Every family's tiny model by name, for the tests that run one check across all of them
(quantisation, the memory estimator): FAMILIES[name](folder) writes the model into the existing
folder (the built-in demo needs none) and returns (what load_model takes, its options, the prompts
or classes to decode)."""

from __future__ import annotations

from safetensors.torch import save_file

from tests.helpers.tiny_emu3 import SIZE as EMU3_SIZE
from tests.helpers.tiny_emu3 import write_converted as write_emu3
from tests.helpers.tiny_hf import PROMPTS
from tests.helpers.tiny_janus import write_converted as write_janus
from tests.helpers.tiny_llamagen import random_gpt, random_t2i_gpt, random_vq, write_t5
from tests.helpers.tiny_lumina import write_lumina
from tests.helpers.tiny_lumina2 import write_lumina2


def llamagen_c2i(d):
    """The class-conditional release's files as safetensors in d; decodes classes 1 and 7."""
    save_file(
        {k: v.contiguous() for k, v in random_gpt().state_dict().items()},
        str(d / "c2i_B_256.safetensors"),
    )
    save_file(random_vq().state_dict(), str(d / "vq_ds16_c2i.safetensors"))
    return str(d), {}, [1, 7]


def llamagen_t2i(d):
    """A text-to-image GPT (120 caption tokens from a 32-wide T5), its VQ and flan-t5-xl/ in d."""
    gpt = random_t2i_gpt()
    save_file(
        {k: v.contiguous() for k, v in gpt.state_dict().items()},
        str(d / "t2i_XL_stage1_256.safetensors"),
    )
    save_file(random_vq().state_dict(), str(d / "vq_ds16_t2i.safetensors"))
    (d / "flan-t5-xl").mkdir()
    write_t5(d / "flan-t5-xl")
    return str(d / "t2i_XL_stage1_256.safetensors"), {}, PROMPTS


FAMILIES = {
    "demo": lambda d: ("demo", {}, ["a red circle on grass", "a blue square on snow"]),
    "llamagen-c2i": lambda d: llamagen_c2i(d),
    "llamagen-t2i": llamagen_t2i,
    "janus": lambda d: (write_janus(d), {}, PROMPTS),
    "emu3": lambda d: (write_emu3(d), EMU3_SIZE, PROMPTS),
    "lumina": lambda d: (
        write_lumina(str(d / "Lumina-mGPT-tiny-64")),
        dict(width=64, height=32),
        PROMPTS,
    ),
    "lumina2": lambda d: (
        write_lumina2(str(d / "Lumina-mGPT-2.0")),
        dict(width=64, height=32),
        PROMPTS,
    ),
}
