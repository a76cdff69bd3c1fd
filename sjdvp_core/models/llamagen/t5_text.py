"""The caption encoder of LlamaGen's text-to-image models: FLAN-T5-XL's encoder, loaded from a local
folder with transformers (no hub access, no remote code). Captions are cleaned as upstream's
T5Embedder cleans them (`captions.py`), padded to 120 tokens and then left-padded (valid tokens
moved to the end, padding zeroed and masked), as LlamaGen's t2i models saw them in training. The
encoder runs in the GPT's precision (bf16 on GPUs, as upstream samples)."""

from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

from ..placement import weights_device
from .captions import cjk_characters, clean_caption

log = logging.getLogger(__name__)

T5_FILES = "config.json, model weights (*.safetensors or pytorch_model*.bin) and tokenizer files"


class T5CaptionEncoder:
    def __init__(self, folder: str, max_length: int = 120, device="cpu", dtype=torch.float32):
        if not os.path.isfile(os.path.join(folder, "config.json")):
            raise FileNotFoundError(
                f"{folder}: no FLAN-T5-XL text encoder here; download google/flan-t5-xl "
                f"({T5_FILES}) into this folder"
            )
        from transformers import AutoTokenizer, T5EncoderModel

        from ..hf_adapter import dtype_kwarg

        self.tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
        self.model = T5EncoderModel.from_pretrained(
            folder, local_files_only=True, **dtype_kwarg(dtype)
        )
        self.model = self.model.to(device).eval()
        self.max_length = max_length
        # prompts whose losses were said: once, not per image and decode
        self.told: set[str] = set()

    @property
    def device(self) -> torch.device:
        """Where the encoder is now (it moves with the adapter's module)."""
        return weights_device(self.model.get_input_embeddings())

    @torch.no_grad()
    def __call__(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """prompts -> (features [B, T, D] left-padded with zeros, mask [B, T] bool)."""
        tok = self.tokenizer(
            self.captions(prompts),
            max_length=self.max_length,
            padding="max_length",
            truncation=True,
            return_tensors="pt",
        ).to(self.device)
        feats = self.model(
            input_ids=tok.input_ids, attention_mask=tok.attention_mask
        ).last_hidden_state
        return left_pad(feats.float(), tok.attention_mask.bool())

    def captions(self, prompts: list[str]) -> list[str]:
        """The prompts cleaned as upstream cleans them; what the encoder will not read is named in a
        warning (upstream drops it silently): Chinese characters the cleaning deletes, and the
        words past max_length tokens, which truncation cuts."""
        captions = [clean_caption(p) for p in prompts]
        for prompt, caption in zip(prompts, captions):
            if prompt in self.told:
                continue
            self.told.add(prompt)
            if cjk := cjk_characters(prompt):
                log.warning(
                    "sjdvp: LlamaGen's text-to-image models were trained on English captions, and their "
                    "caption cleaning deletes Chinese characters (%s); the prompt reads %r",
                    cjk,
                    caption,
                )
            ids = self.tokenizer(caption, verbose=False).input_ids  # the words, then </s>
            if len(ids) > self.max_length:
                cut = self.tokenizer.decode(ids[self.max_length - 1 :], skip_special_tokens=True)
                log.warning(
                    "sjdvp: LlamaGen's text-to-image models read the first %d T5 tokens of a prompt; this one "
                    "has %d, so the end is not read: %r. Shorten the prompt to use all of it.",
                    self.max_length - 1,
                    len(ids) - 1,
                    cut,
                )
        return captions


def left_pad(features: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Right-padded [B, T, D] with mask [B, T] -> the same tokens moved to the end of each row."""
    T = mask.shape[1]
    valid = mask.sum(1, keepdim=True)  # [B, 1]
    src = (torch.arange(T, device=mask.device) - (T - valid)) % T  # new slot t <- old slot src
    out_mask = torch.arange(T, device=mask.device) >= T - valid
    out = features.gather(1, src[..., None].expand_as(features)) * out_mask[..., None]
    return out, out_mask
