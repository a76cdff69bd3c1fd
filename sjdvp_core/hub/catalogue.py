"""The releases the loader can download, as data: repositories, files, folder, size and licence.

Each entry names the Hub repositories and files a release needs, the folder it lands in under
models/sjdvp, its size and its licence; `sjdvp_core.download` fetches an entry and the ComfyUI
loader lists those not on disk yet ("Janus-Pro-1B (download, ~4.2 GB)"). The sizes are summed from
the Hub's listings kept in tests/data/hub_listings.json and serve that list only: downloads are
verified by the Hub's own hashes. Where each number comes from: docs/models.md, "One click: the
catalogue"."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

GB = 10**9
MB = 10**6
DOWNLOAD = re.compile(r"^(?P<name>.+?) \(download(?:, [^)]*)?\)$")


@dataclass(frozen=True)
class Source:
    """Files of one Hub repository: `files` are allow patterns (fnmatch, as huggingface_hub's), each
    of which must match at least one file; they land under `into` (a subfolder of the entry's
    folder, "" for the folder itself) keeping their path in the repository unless `strip` is a
    leading folder to drop. `md5` pins files by a checksum published elsewhere (e.g. Meta's
    checklist.chk), on top of the Hub's own hashes. `optional` patterns are taken where the
    repository has them and never required (side files that what `files` takes already covers)."""

    repo: str
    files: tuple[str, ...]
    optional: tuple[str, ...] = ()
    into: str = ""
    strip: str = ""
    revision: str = "main"
    md5: tuple[tuple[str, str], ...] = ()
    licence: str = ""

    def local(self, remote: str) -> str:
        """Where a repository file lands, relative to the entry's folder."""
        rel = (
            remote[len(self.strip) :].lstrip("/")
            if self.strip and remote.startswith(self.strip)
            else remote
        )
        return (
            os.path.normpath(os.path.join(self.into, rel)) if self.into else os.path.normpath(rel)
        )


@dataclass(frozen=True)
class Entry:
    """One downloadable release. `folder` is its place under models/sjdvp; `model` the file inside
    it that the loader is given, when the folder can hold several models (LlamaGen GPTs beside
    their tokenizer)."""

    name: str
    family: str
    folder: str
    sources: tuple[Source, ...]
    size: int
    licence: str
    approx: bool = False
    model: str = ""
    note: str = ""
    # for a release whose file listing no stored Hub page shows: what its (approximate) size rests
    # on; its sources then require only files every release of its code saves
    estimate: str = ""

    @property
    def path(self) -> str:
        """The model's path relative to models/sjdvp: what the loader loads once it is
        downloaded."""
        return os.path.join(self.folder, self.model) if self.model else self.folder

    @property
    def choice(self) -> str:
        """The loader's combo value for this entry while it is not on disk."""
        return f"{self.name} (download, {size_text(self.size, self.approx)})"


def size_text(size: int, approx: bool = False) -> str:
    text = f"{size / GB:.1f} GB" if size >= GB else f"{size / MB:.0f} MB"
    return ("~" if approx else "") + text


LLAMAGEN_C2I = "FoundationVision/LlamaGen"
LLAMAGEN_T2I = "peizesun/llamagen_t2i"
MIT, APACHE = "MIT", "Apache-2.0"
CHAMELEON_LICENCE = (
    "Meta's Chameleon Research License (non-commercial research use; "
    "https://ai.meta.com/resources/models-and-libraries/chameleon-license/)"
)
CHAMELEON_MANUAL = (
    "Meta's own copy: request it at https://ai.meta.com/resources/models-and-libraries/"
    "chameleon-downloads/ and put tokenizer/vqgan.yaml and tokenizer/vqgan.ckpt of that "
    "release in the model folder's tokenizer/ subfolder"
)
# Meta's Chameleon tokenizer (VQGAN) as GAIR redistributes it with Anole-7b-v0.1 (same Chameleon
# licence): checked against the MD5s of Meta's own checklist.chk shipped beside them
# (tokenizer/checklist.chk).
CHAMELEON_TOKENIZER = Source(
    "GAIR/Anole-7b-v0.1",
    ("tokenizer/vqgan.yaml", "tokenizer/vqgan.ckpt"),
    md5=(
        ("tokenizer/vqgan.ckpt", "1a559fb5dab4d351d19496ae89da1db1"),
        ("tokenizer/vqgan.yaml", "25724c8110d6adabc9130a123b4b922e"),
    ),
    licence=CHAMELEON_LICENCE,
)
# Meta's vqgan.ckpt (281,270,377 bytes by its LFS pointer; Anole's copy has the same MD5) and
# vqgan.yaml
CHAMELEON_BYTES = 281_270_377 + 1_490
LUMINA_LICENCE = (
    "its repositories declare no licence; as a fine-tune of Chameleon, Chameleon's likely applies"
)
LUMINA_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "model-*.safetensors",
)
LUMINA_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
# tokenizer.json alone defines T5's tokenizer (its special tokens are T5TokenizerFast's defaults)
FLAN_T5_XL = Source(
    "google/flan-t5-xl",
    ("config.json", "model.safetensors.index.json", "model-*.safetensors", "tokenizer.json"),
    optional=("tokenizer_config.json", "special_tokens_map.json", "spiece.model"),
    into="flan-t5-xl",
    licence=APACHE,
)
# sums of the Hub's listings (tests/data/hub_listings.json), the rounded figures it displays
FLAN_T5_XL_BYTES = 11_402 * MB
JANUS_1B_BYTES = 4_185 * MB
JANUS_7B_BYTES = 14_845 * MB
JANUS_1_3B_BYTES = 4_185 * MB
EMU3_BYTES = 35_053 * MB  # BAAI/Emu3-Gen and BAAI/Emu3-VisionTokenizer
LUMINA_BYTES = 14_040 * MB  # the model's files and the text tokenizer's (768 repository)
# model.safetensors (4.78 GB) and its config and tokenizer files
LUMINA_4BIT_BYTES = 4_780 * MB + 10_260_000
LUMINA2_BYTES = 15_777 * MB  # Alpha-VLLM/Lumina-mGPT-2.0's files (below)
# movqgan_270M.ckpt: no stored page showed its size; the 270M architecture's 270,669,103 parameters
# in float32
MOVQGAN_270M_BYTES = 1_082_676_412
LUMINA2_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "model-*.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
MOVQGAN_LICENCE = (
    "no licence file in github.com/ai-forever/MoVQGAN; see the Hub page of ai-forever/MoVQGAN"
)
MOVQGAN_270M = Source(
    "ai-forever/MoVQGAN", ("movqgan_270M.ckpt",), into="movqgan", licence=MOVQGAN_LICENCE
)
# what a repository no stored page lists may hold besides config.json and tokenizer.json
ANY_WEIGHTS = (
    "model.safetensors",
    "model.safetensors.index.json",
    "model-*.safetensors",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "pytorch_model-*.bin",
)
JANUS_FILES = (
    "config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
)
VQ_DS16_BYTES = (
    287_920_306  # vq_ds16_c2i.pt and vq_ds16_t2i.pt (the same size in both repositories)
)
# the whole diffusers folder but its README and .gitattributes: token stage, DiT, VAE, glyph
# encoder, processors. No Hub page was reachable: the sum of the listing's estimates (parameters
# counted on the meta device)
GLM_IMAGE_FILES = (
    "model_index.json",
    "processor/*",
    "scheduler/*",
    "text_encoder/*",
    "tokenizer/*",
    "transformer/*",
    "vae/*",
    "vision_language_encoder/*",
)
GLM_IMAGE_BYTES = 35_308_435_956


def _c2i(size: str, px: int, gpt_bytes: int, approx: bool = False) -> Entry:
    gpt = f"c2i_{size}_{px}.pt"
    return Entry(
        f"LlamaGen-c2i-{size}-{px}",
        "llamagen",
        "llamagen-c2i",
        (Source(LLAMAGEN_C2I, (gpt, "vq_ds16_c2i.pt"), licence=MIT),),
        gpt_bytes + VQ_DS16_BYTES,
        MIT,
        approx=approx,
        model=gpt,
        note="class-conditional ImageNet; GPTs share the llamagen-c2i folder and its tokenizer",
    )


def _t2i(stage: str, px: int) -> Entry:
    """FLAN-T5-XL's files are known to the Hub's rounding only."""
    gpt = f"t2i_XL_{stage}_{px}.pt"
    return Entry(
        f"LlamaGen-t2i-XL-{px}",
        "llamagen",
        "llamagen-t2i",
        (Source(LLAMAGEN_T2I, (gpt, "vq_ds16_t2i.pt"), licence=MIT), FLAN_T5_XL),
        3_111_800_170 + VQ_DS16_BYTES + FLAN_T5_XL_BYTES,
        f"{MIT} (LlamaGen), {APACHE} (FLAN-T5)",
        approx=True,
        model=gpt,
        note="text-to-image with google/flan-t5-xl in flan-t5-xl/; both sizes share the folder",
    )


def _janus(size: str, weights: tuple[str, ...], size_bytes: int) -> Entry:
    """Janus-Pro-1B holds one pytorch_model.bin; Janus-Pro-7B an index and two shards."""
    repo = f"deepseek-ai/Janus-Pro-{size}"
    return Entry(
        f"Janus-Pro-{size}",
        "janus",
        f"Janus-Pro-{size}",
        (Source(repo, JANUS_FILES + weights, licence=MIT),),
        size_bytes,
        f"{MIT} (code), DeepSeek Model License (weights)",
        approx=True,
    )


def _janus_1_3b() -> Entry:
    """The original Janus, on Janus-Pro's code path: one model.safetensors."""
    return Entry(
        "Janus-1.3B",
        "janus",
        "Janus-1.3B",
        (Source("deepseek-ai/Janus-1.3B", JANUS_FILES + ("model.safetensors",), licence=MIT),),
        JANUS_1_3B_BYTES,
        f"{MIT} (code), DeepSeek Model License (weights)",
        approx=True,
    )


def _janus_4o() -> Entry:
    """Janus-4o-7B (ShareGPT-4o-Image): Janus-Pro-7B fine-tuned to edit, saved by its train_janus.py
    (save_pretrained of the original classes, and its processor). No stored Hub page lists its
    files, so its weights are taken in whichever form the repository holds and its size is
    Janus-Pro-7B's."""
    return Entry(
        "Janus-4o-7B",
        "janus",
        "Janus-4o-7B",
        (
            Source(
                "FreedomIntelligence/Janus-4o-7B",
                ("config.json", "tokenizer.json"),
                optional=JANUS_FILES + ANY_WEIGHTS,
            ),
        ),
        JANUS_7B_BYTES,
        "not declared on a page we could read (its base, Janus-Pro-7B: MIT code, DeepSeek Model "
        "License weights)",
        approx=True,
        note="edits images: text and a reference image to image",
        estimate="Janus-Pro-7B's download: the same architecture and parameters, fine-tuned",
    )


def _lumina2_omni() -> Entry:
    """Lumina-mGPT 2.0 Omni: 2.0 fine-tuned for dual panels (depth, canny, subject), the same
    architecture and MoVQGAN (its code loads both alike). No stored page lists its files: its
    weights are taken in whichever form it holds them, its size is 2.0's."""
    return Entry(
        "Lumina-mGPT-2.0-Omni",
        "lumina2",
        "Lumina-mGPT-2.0-Omni",
        (
            Source(
                "Alpha-VLLM/Lumina-mGPT-2.0-Omni",
                ("config.json", "tokenizer.json"),
                optional=LUMINA2_FILES + ANY_WEIGHTS,
                licence=APACHE,
            ),
            MOVQGAN_270M,
        ),
        LUMINA2_BYTES + MOVQGAN_270M_BYTES,
        f"{APACHE} (github.com/Alpha-VLLM/Lumina-mGPT-2.0's; its Hub page not read here); "
        f"MoVQGAN: {MOVQGAN_LICENCE}",
        approx=True,
        note="edits: a depth map, canny edge map or subject to a picture; MoVQGAN in movqgan/",
        estimate="Lumina-mGPT-2.0's download: the same architecture, fine-tuned",
    )


def _lumina(px: int) -> Entry:
    repo = f"Alpha-VLLM/Lumina-mGPT-7B-{px}"
    sources = [Source(repo, LUMINA_FILES, licence=LUMINA_LICENCE)]
    if px != 768:  # only the 768 repository carries the (shared) Chameleon text tokenizer files
        sources.append(Source("Alpha-VLLM/Lumina-mGPT-7B-768", LUMINA_TOKENIZER_FILES))
    else:
        sources[0] = Source(repo, LUMINA_FILES + LUMINA_TOKENIZER_FILES)
    sources.append(CHAMELEON_TOKENIZER)
    return Entry(
        f"Lumina-mGPT-7B-{px}",
        "lumina",
        f"Lumina-mGPT-7B-{px}",
        tuple(sources),
        LUMINA_BYTES + CHAMELEON_BYTES,
        approx=True,
        licence=f"Lumina-mGPT: {LUMINA_LICENCE}; VQGAN: {CHAMELEON_LICENCE}",
        note=f"the VQGAN in tokenizer/ comes from GAIR/Anole-7b-v0.1, checked against Meta's MD5s; "
        f"or use {CHAMELEON_MANUAL}",
    )


def _lumina_4bit() -> Entry:
    """Alpha-VLLM's own 4-bit copy of the 768 model (bitsandbytes, quantization_config in its
    config.json)."""
    repo = "Alpha-VLLM/Lumina-mGPT-7B-768-bnb-int4"
    return Entry(
        "Lumina-mGPT-7B-768-bnb-int4",
        "lumina",
        "Lumina-mGPT-7B-768-bnb-int4",
        (
            Source(
                repo,
                ("config.json", "generation_config.json", "model.safetensors")
                + LUMINA_TOKENIZER_FILES,
                licence=APACHE,
            ),
            CHAMELEON_TOKENIZER,
        ),
        LUMINA_4BIT_BYTES + CHAMELEON_BYTES,
        approx=True,
        licence=f"Lumina-mGPT int4: {APACHE}; VQGAN: {CHAMELEON_LICENCE}",
        note="4-bit weights as released (needs bitsandbytes); the VQGAN as for Lumina-mGPT-7B-768",
    )


ENTRIES: tuple[Entry, ...] = (
    _c2i("B", 256, 444 * MB, approx=True),
    _c2i("B", 384, 443_736_709),
    _c2i("L", 256, 1_371_712_314),
    _c2i("L", 384, 1_371_860_346),
    _c2i("XL", 384, 3_099_048_319),
    _t2i("stage1", 256),
    _t2i("stage2", 512),
    _janus("1B", ("pytorch_model.bin",), JANUS_1B_BYTES),
    _janus("7B", ("pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"), JANUS_7B_BYTES),
    _janus_4o(),
    Entry(
        "Emu3-Gen",
        "emu3",
        "Emu3-Gen",
        (
            Source(
                "BAAI/Emu3-Gen",
                (
                    "config.json",
                    "generation_config.json",
                    "emu3.tiktoken",
                    "emu3_vision_tokens.txt",
                    "tokenizer_config.json",
                    "model.safetensors.index.json",
                    "model-*.safetensors",
                ),
            ),
            Source(
                "BAAI/Emu3-VisionTokenizer",
                ("config.json", "preprocessor_config.json", "model.safetensors"),
                into="vision_tokenizer",
            ),
        ),
        EMU3_BYTES,
        APACHE,
        approx=True,
        note="BAAI/Emu3-VisionTokenizer lands in vision_tokenizer/",
    ),
    _lumina(512),
    _lumina(768),
    _lumina(1024),
    _lumina_4bit(),
    Entry(
        "Lumina-mGPT-2.0",
        "lumina2",
        "Lumina-mGPT-2.0",
        (Source("Alpha-VLLM/Lumina-mGPT-2.0", LUMINA2_FILES, licence=APACHE), MOVQGAN_270M),
        LUMINA2_BYTES + MOVQGAN_270M_BYTES,
        f"Lumina-mGPT 2.0: {APACHE}; MoVQGAN: {MOVQGAN_LICENCE}",
        approx=True,
        note="ai-forever/MoVQGAN's movqgan_270M.ckpt (the image decoder) lands in movqgan/",
    ),
    _lumina2_omni(),
    _janus_1_3b(),
    Entry(
        "GLM-Image",
        "glm_image",
        "GLM-Image",
        (Source("zai-org/GLM-Image", GLM_IMAGE_FILES, licence=MIT),),
        GLM_IMAGE_BYTES,
        MIT,
        approx=True,
        note="the diffusers folder: the 9B token stage in vision_language_encoder/, the DiT, VAE and glyph encoder "
        "beside it; the loader takes the folder",
    ),
)
BY_NAME = {e.name: e for e in ENTRIES}


def find(value: str) -> Entry | None:
    """The entry a combo value or CLI name names: "Janus-Pro-1B", or "Janus-Pro-1B (download, ~4.2
    GB)" as saved in a workflow (whatever size it shows: sizes may be corrected between
    versions)."""
    m = DOWNLOAD.match(value)
    return BY_NAME.get(m.group("name") if m else value)


def describe() -> str:
    """The catalogue as text (the CLI's --list)."""
    lines = []
    for e in ENTRIES:
        repos = ", ".join(s.repo + (f" -> {s.into}/" if s.into else "") for s in e.sources)
        lines.append(
            f"{e.name:24} {size_text(e.size, e.approx):>9}  {e.family:8} -> {e.path}\n"
            f"{'':24} from {repos}\n{'':24} licence: {e.licence}"
            + (f"\n{'':24} {e.note}" if e.note else "")
        )
    return "\n".join(lines)
