"""The releases the loader can download, as data: for each, the Hub repositories and files it needs, the
folder it lands in under models/sjdvp, its size and its licence. `sjdvp_core.download` fetches an entry;
the ComfyUI loader lists the entries that are not on disk yet ("Janus-Pro-1B (download, 4.2 GB)").

Where the numbers come from: file sizes as the Hub's file pages show them (decimal GB, three significant
figures, or exact bytes from the LFS pointers), summed; sizes we could not see are marked approximate
(`approx=True`, shown with a "~"). Downloads are verified against the Hub's own sha256 / git hashes
whatever this table says; the sizes here are only for the list.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

GB = 10 ** 9
MB = 10 ** 6
DOWNLOAD = re.compile(r"^(?P<name>.+?) \(download(?:, [^)]*)?\)$")


@dataclass(frozen=True)
class Source:
    """Files of one Hub repository: `files` are allow patterns (fnmatch, as huggingface_hub's), each of
    which must match at least one file; they land under `into` (a subfolder of the entry's folder, "" for
    the folder itself) keeping their path in the repository unless `strip` is a leading folder to drop.
    `md5` pins files by a checksum published elsewhere (e.g. Meta's checklist.chk), on top of the Hub's
    own hashes."""
    repo: str
    files: tuple[str, ...]
    into: str = ""
    strip: str = ""
    revision: str = "main"
    md5: tuple[tuple[str, str], ...] = ()
    licence: str = ""

    def local(self, remote: str) -> str:
        """Where a repository file lands, relative to the entry's folder."""
        rel = remote[len(self.strip):].lstrip("/") if self.strip and remote.startswith(self.strip) else remote
        return os.path.normpath(os.path.join(self.into, rel)) if self.into else os.path.normpath(rel)


@dataclass(frozen=True)
class Entry:
    """One downloadable release. `folder` is its place under models/sjdvp; `model` the file inside it that
    the loader is given, when the folder can hold several models (LlamaGen GPTs beside their tokenizer)."""
    name: str
    family: str
    folder: str
    sources: tuple[Source, ...]
    size: int
    licence: str
    approx: bool = False
    model: str = ""
    note: str = ""

    @property
    def path(self) -> str:
        """The model's path relative to models/sjdvp: what the loader loads once it is downloaded."""
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
CHAMELEON_LICENCE = ("Meta's Chameleon Research License (non-commercial research use; "
                     "https://ai.meta.com/resources/models-and-libraries/chameleon-license/)")
CHAMELEON_MANUAL = ("Meta's own copy: request it at https://ai.meta.com/resources/models-and-libraries/"
                    "chameleon-downloads/ and put tokenizer/vqgan.yaml and tokenizer/vqgan.ckpt of that "
                    "release in the model folder's tokenizer/ subfolder")
# Meta's Chameleon tokenizer (VQGAN) as GAIR redistributes it with Anole-7b-v0.1 (same Chameleon licence):
# checked against the MD5s of Meta's own checklist.chk shipped beside them (tokenizer/checklist.chk).
CHAMELEON_TOKENIZER = Source(
    "GAIR/Anole-7b-v0.1", ("tokenizer/vqgan.yaml", "tokenizer/vqgan.ckpt"),
    md5=(("tokenizer/vqgan.ckpt", "1a559fb5dab4d351d19496ae89da1db1"),
         ("tokenizer/vqgan.yaml", "25724c8110d6adabc9130a123b4b922e")),
    licence=CHAMELEON_LICENCE)
CHAMELEON_CKPT = 281_270_377          # bytes, LFS pointer of Meta's vqgan.ckpt
LUMINA_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "model-*.safetensors")
LUMINA_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
FLAN_T5_XL = Source("google/flan-t5-xl", ("config.json", "model.safetensors.index.json", "model-*.safetensors",
                                          "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                          "spiece.model"), into="flan-t5-xl", licence=APACHE)
JANUS_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", "special_tokens_map.json",
               "tokenizer.json", "tokenizer_config.json", "pytorch_model*.bin", "pytorch_model.bin.index.json")


def _c2i(size: str, px: int, gpt_bytes: int) -> Entry:
    """Approximate: vq_ds16_c2i.pt's size was not seen (its t2i twin's, 288 MB, is used)."""
    gpt = f"c2i_{size}_{px}.pt"
    return Entry(f"LlamaGen-c2i-{size}-{px}", "llamagen", "llamagen-c2i",
                 (Source(LLAMAGEN_C2I, (gpt, "vq_ds16_c2i.pt"), licence=MIT),),
                 gpt_bytes + 288 * MB, MIT, approx=True, model=gpt,
                 note="class-conditional ImageNet; GPTs share the llamagen-c2i folder and its tokenizer")


def _t2i(stage: str, px: int) -> Entry:
    gpt = f"t2i_XL_{stage}_{px}.pt"
    return Entry(f"LlamaGen-t2i-XL-{px}", "llamagen", "llamagen-t2i",
                 (Source(LLAMAGEN_T2I, (gpt, "vq_ds16_t2i.pt"), licence=MIT), FLAN_T5_XL),
                 3_111_800_170 + 287_920_306 + 11_400 * MB, f"{MIT} (LlamaGen), {APACHE} (FLAN-T5)", model=gpt,
                 note="text-to-image with google/flan-t5-xl in flan-t5-xl/; both sizes share the folder")


def _lumina(px: int) -> Entry:
    repo = f"Alpha-VLLM/Lumina-mGPT-7B-{px}"
    sources = [Source(repo, LUMINA_FILES, licence="see the model card")]
    if px != 768:   # only the 768 repository carries the (shared) Chameleon text tokenizer files
        sources.append(Source("Alpha-VLLM/Lumina-mGPT-7B-768", LUMINA_TOKENIZER_FILES))
    else:
        sources[0] = Source(repo, LUMINA_FILES + LUMINA_TOKENIZER_FILES)
    sources.append(CHAMELEON_TOKENIZER)
    return Entry(f"Lumina-mGPT-7B-{px}", "lumina", f"Lumina-mGPT-7B-{px}", tuple(sources),
                 14_030 * MB + 10 * MB + CHAMELEON_CKPT, f"Lumina-mGPT: see {repo}; VQGAN: {CHAMELEON_LICENCE}",
                 note=f"the VQGAN in tokenizer/ comes from GAIR/Anole-7b-v0.1, checked against Meta's MD5s; "
                      f"or use {CHAMELEON_MANUAL}")


ENTRIES: tuple[Entry, ...] = (
    _c2i("B", 256, 444 * MB), _c2i("B", 384, 444 * MB), _c2i("L", 256, 1_370 * MB), _c2i("L", 384, 1_370 * MB),
    _c2i("XL", 384, 3_100 * MB),
    _t2i("stage1", 256), _t2i("stage2", 512),
    Entry("Janus-Pro-1B", "janus", "Janus-Pro-1B", (Source("deepseek-ai/Janus-Pro-1B", JANUS_FILES, licence=MIT),),
          4_180 * MB + 5 * MB, f"{MIT} (code), DeepSeek Model License (weights)"),
    Entry("Janus-Pro-7B", "janus", "Janus-Pro-7B", (Source("deepseek-ai/Janus-Pro-7B", JANUS_FILES, licence=MIT),),
          14_840 * MB + 5 * MB, f"{MIT} (code), DeepSeek Model License (weights)"),
    Entry("Emu3-Gen", "emu3", "Emu3-Gen",
          (Source("BAAI/Emu3-Gen", ("config.json", "generation_config.json", "emu3.tiktoken", "emu3_vision_tokens.txt",
                                    "tokenizer_config.json", "model.safetensors.index.json", "model-*.safetensors")),
           Source("BAAI/Emu3-VisionTokenizer", ("config.json", "preprocessor_config.json", "model.safetensors"),
                  into="vision_tokenizer")),
          34 * GB + 1_080 * MB, APACHE, approx=True,
          note="BAAI/Emu3-VisionTokenizer lands in vision_tokenizer/"),
    _lumina(512), _lumina(768), _lumina(1024),
)
BY_NAME = {e.name: e for e in ENTRIES}


def find(value: str) -> Entry | None:
    """The entry a combo value or CLI name names: "Janus-Pro-1B", or "Janus-Pro-1B (download, 4.2 GB)" as
    saved in a workflow (whatever size it shows: sizes may be corrected between versions)."""
    m = DOWNLOAD.match(value)
    return BY_NAME.get(m.group("name") if m else value)


def on_disk(entry: Entry, roots: list[str]) -> str | None:
    """The entry's full path under the first root that holds it complete, else None."""
    from .download import incomplete
    for root in roots:
        path = os.path.join(root, entry.path)
        if os.path.exists(path) and not incomplete(os.path.join(root, entry.folder)):
            return path
    return None


def describe() -> str:
    """The catalogue as text (the CLI's --list)."""
    lines = []
    for e in ENTRIES:
        repos = ", ".join(s.repo + (f" -> {s.into}/" if s.into else "") for s in e.sources)
        lines.append(f"{e.name:24} {size_text(e.size, e.approx):>9}  {e.family:8} -> {e.path}\n"
                     f"{'':24} from {repos}\n{'':24} licence: {e.licence}" + (f"\n{'':24} {e.note}" if e.note else ""))
    return "\n".join(lines)
