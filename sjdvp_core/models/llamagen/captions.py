"""Caption cleaning for LlamaGen's text-to-image models, as upstream cleans them before FLAN-T5.

Our reimplementation of the `clean_caption` that LlamaGen's language/t5.py takes from DeepFloyd IF
and PixArt-alpha, applied twice as upstream does: LlamaGen's T5 features were extracted from
cleaned captions, and FLAN-T5 is case sensitive. ftfy is used when installed, else a
standard-library subset stands in. What goes, where the two differ and how equality with upstream
is pinned: docs/families.md, "LlamaGen"."""

from __future__ import annotations

import html
import re
import unicodedata
import urllib.parse
from html.parser import HTMLParser

_SITE = r"[a-zA-Z0-9.\-]+[.](?:com|co|ru|net|org|edu|gov|it)[\w/-]*\b\/?(?!@)"
_DASHES = (
    "\u002d\u058a\u05be\u1400\u1806\u2010-\u2015\u2e17\u2e1a\u2e3a\u2e3b\u2e40\u301c\u3030\u30a0"
    "\ufe31\ufe32\ufe58\ufe63\uff0d"
)
_CJK_BLOCKS = (
    "\u31c0-\u31ef",
    "\u31f0-\u31ff",
    "\u3200-\u32ff",
    "\u3300-\u33ff",
    "\u3400-\u4dbf",
    "\u4dc0-\u4dff",
    "\u4e00-\u9fff",
)
_BAD_PUNCT = r"[#®•©™&@·º½¾¿¡§~\)\(\]\[\}\{\|\\/\*]{1,}"
_FILE_TYPES = "png|jpg|jpeg|bmp|webp|eps|pdf|apk|mp4"


def _steps(pairs):
    return [(re.compile(p), r) for p, r in pairs]


# before the HTML is stripped
_LINKS = _steps(
    [
        (r"<person>", "person"),
        (rf"\b((?:https?:(?:\/{{1,3}}|[a-zA-Z0-9%])|{_SITE}))", ""),
        (rf"\b((?:www:(?:\/{{1,3}}|[a-zA-Z0-9%])|{_SITE}))", ""),
    ]
)
# between the HTML and the dash folding
_SYMBOLS = _steps(
    [
        (r"@[\w\d]+\b", ""),
        *((f"[{block}]+", "") for block in _CJK_BLOCKS),
        (f"[{_DASHES}]+", "-"),
        (r"[`´«»“”¨]", '"'),
        (r"[‘’]", "'"),
        (r"&quot;?", ""),
        (r"&amp", ""),
        (r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}", " "),  # IP addresses
        (r"\d:\d\d\s+$", ""),  # article ids
        (r"\\n", " "),
        (r"#\d{1,3}\b", ""),
        (r"#\d{5,}\b", ""),
        (r"\b\d{6,}\b", ""),
        (rf"[\S]+\.(?:{_FILE_TYPES})", ""),
        (r"[\"\']{2,}", '"'),
        (r"[\.]{2,}", " "),
        (_BAD_PUNCT, " "),
        (r"\s+\.\s+", " "),
    ]
)
_SEPARATORS = re.compile(r"(?:\-|\_)")
# after ftfy
_BOILERPLATE = _steps(
    [
        (r"\b[a-zA-Z]{1,3}\d{3,15}\b", ""),
        (r"\b[a-zA-Z]+\d+[a-zA-Z]+\b", ""),
        (r"\b\d+[a-zA-Z]+\d+\b", ""),
        (r"(worldwide\s+)?(free\s+)?shipping", ""),
        (r"(free\s)?download(\sfree)?", ""),
        (r"\bclick\b\s(?:for|on)\s\w+", ""),
        (rf"\b(?:{_FILE_TYPES})(\simage[s]?)?", ""),
        (r"\bpage\s+\d+\b", ""),
        (r"\b\d*[a-zA-Z]+\d+[a-zA-Z]+\d+[a-zA-Z\d]*\b", " "),
        (r"\b\d+\.?\d*[xх×]\d+\.?\d*\b", ""),  # sizes like 1920x1080
        (r"\b\s+\:\s+", ": "),
        (r"(\D[,\./])\b", r"\1 "),
        (r"\s+", " "),
        (r"^[\"\']([\w\W]+)[\"\']$", r"\1"),
        (r"^[\'\_,\-\:;]", ""),
        (r"[\'\_,\-\:\-\+]$", ""),
        (r"^\.\S+$", ""),
    ]
)


class _Text(HTMLParser):
    """The text of an HTML fragment, entities decoded (what BeautifulSoup's .text gives
    upstream)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)


def _html_text(text: str) -> str:
    parser = _Text()
    parser.feed(text)
    parser.close()
    return "".join(parser.parts)


def _fix_text(text: str) -> str:
    try:
        import ftfy
    except ImportError:
        return _fix_text_stdlib(text)
    return ftfy.fix_text(text)


_LIGATURES = str.maketrans(
    {
        "Ĳ": "IJ",
        "ĳ": "ij",
        "ŉ": "ʼn",
        "Ǳ": "DZ",
        "ǲ": "Dz",
        "ǳ": "dz",
        "Ǆ": "DŽ",
        "ǅ": "Dž",
        "ǆ": "dž",
        "Ǉ": "LJ",
        "ǈ": "Lj",
        "ǉ": "lj",
        "Ǌ": "NJ",
        "ǋ": "Nj",
        "ǌ": "nj",
        "ﬀ": "ff",
        "ﬁ": "fi",
        "ﬂ": "fl",
        "ﬃ": "ffi",
        "ﬄ": "ffl",
        "ﬅ": "ſt",
        "ﬆ": "st",
    }
)
_CURLY = str.maketrans(
    {"‘": "'", "’": "'", "‚": "'", "‛": "'", "“": '"', "”": '"', "„": '"', "‟": '"'}
)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f\u200b\ufeff\ufff9-\ufffc]")


def _fix_text_stdlib(text: str) -> str:
    """ftfy.fix_text's steps that apply to well-formed text: full/half-width forms, Latin ligatures,
    curly quotes, line breaks, control characters, NFC."""
    text = "".join(
        unicodedata.normalize("NFKC", c)
        if unicodedata.east_asian_width(c) in "FH"
        and unicodedata.decomposition(c).startswith(("<wide>", "<narrow>"))
        else c
        for c in text
    )
    text = text.translate(_LIGATURES).translate(_CURLY)
    text = re.sub(r"\r\n|\r|\u2028|\u2029|\u0085", "\n", text)
    return unicodedata.normalize("NFC", _CONTROL.sub("", text))


def _apply(steps, text: str) -> str:
    for pattern, replacement in steps:
        text = pattern.sub(replacement, text)
    return text


def clean_once(caption: str) -> str:
    text = urllib.parse.unquote_plus(str(caption)).strip().lower()
    text = _html_text(_apply(_LINKS, text))
    text = _apply(_SYMBOLS, text)
    if len(_SEPARATORS.findall(text)) > 3:  # this-is-my-cute-cat
        text = _SEPARATORS.sub(" ", text)
    text = html.unescape(html.unescape(_fix_text(text))).strip()
    return _apply(_BOILERPLATE, text).strip()


def clean_caption(caption: str) -> str:
    """A prompt as LlamaGen's text-to-image models saw their captions (upstream cleans twice)."""
    return clean_once(clean_once(caption))


def cjk_characters(caption: str) -> str:
    """The Chinese characters the cleaning deletes from this caption (upstream deletes them without
    a word; the models' captions were English)."""
    return "".join(re.findall("[" + "".join(_CJK_BLOCKS) + "]", str(caption)))
