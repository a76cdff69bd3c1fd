"""Verifiers: the probability of accepting each draft, the first rejection, and the accept step
(`accept`).

Each rule is one small frozen class in the VERIFIERS table: SJD (Teng et al. 2024, exact), LANTERN
(Jang et al. 2024) and GSD (So et al. 2025), both relaxed. p is the target, q what the draft was
really drawn from; a draft x is accepted iff u < a(x). Tensors are [B, S, V] for p and q, [B, S] for
drafts, in the engine's local vocabulary (image token c is codebook entry c). docs/method.md gives
each rule."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor

from .target import draw, residual, uniform
from .window import gather_slot

if TYPE_CHECKING:
    from .settings import DrafterSettings

# LANTERN's neighbour table per model: keyed by the adapter's weights module, so it lives as long as
# the model (and is shared by the same model at other sizes), whatever tensor codebook() returns
_NEIGHBOURS: "weakref.WeakKeyDictionary[torch.nn.Module, Tensor]" = weakref.WeakKeyDictionary()


def latent_neighbours(codebook: Tensor, k: int, chunk: int = 1024) -> Tensor:
    """[K, d] codebook -> [K, k] indices of each code's k nearest other codes (L2), nearest first;
    in chunks to bound memory, stored in the smallest integer type that holds K - 1 (int16 for
    every codebook we load: a quarter of int64, which at the widget's largest k would take 8.6 GB
    on Emu3's 32768 codes)."""
    k = min(k, codebook.shape[0] - 1)
    emb = codebook.float()
    dtype = torch.int16 if codebook.shape[0] <= 1 << 15 else torch.int32
    rows = []
    for start in range(0, emb.shape[0], chunk):
        d = torch.cdist(emb[start : start + chunk], emb)
        d[torch.arange(d.shape[0]), torch.arange(start, start + d.shape[0])] = float("inf")
        rows.append(d.topk(k, dim=-1, largest=False).indices.to(dtype))
    return torch.cat(rows)


def neighbour_bytes(codes: int, k: int, chunk: int = 1024) -> int:
    """The most latent_neighbours holds at once for a codebook of this many codes, for memory
    estimates: the table twice (its chunks, then their concatenation) and one chunk's distances
    and top-k."""
    k = min(k, codes - 1)
    table = codes * k * (2 if codes <= 1 << 15 else 4)
    chunk = min(chunk, codes)
    return 2 * table + chunk * codes * 4 + chunk * k * (8 + 4)


def neighbours_built(model: torch.nn.Module, k: int) -> bool:
    """Whether model_neighbours holds a table of k or more neighbours for this model already (it
    is kept with it)."""
    table = _NEIGHBOURS.get(model)
    return table is not None and table.shape[1] >= min(k, table.shape[0] - 1)


def model_neighbours(model: torch.nn.Module, codebook: Tensor, k: int) -> Tensor:
    """latent_neighbours, computed once per model (and device) and reused for any smaller k."""
    k = min(k, codebook.shape[0] - 1)
    table = _NEIGHBOURS.get(model)
    if table is None or table.shape[1] < k or table.device != codebook.device:
        table = _NEIGHBOURS[model] = latent_neighbours(codebook, k)
    return table[:, :k]


def first_rejection(accept: Tensor) -> Tensor:
    """accept [B, S] bool -> [B] number of leading accepted drafts (one cumulative op, no host
    sync)."""
    return accept.long().cumprod(dim=-1).sum(dim=-1)


def _gather(t: Tensor, x: Tensor) -> Tensor:
    return t.gather(-1, x[..., None]).squeeze(-1)


# --- the verification rules: one small frozen class each, with its knobs. A rule is made from the
# decode's DrafterSettings (`of`), which hold every knob's default and validate it: the knobs' one
# source of defaults, and the flat fields that the verifier nodes' widgets and the command lines set
# ---
@dataclass(frozen=True)
class SJD:
    """Exact: a = min(1, p(x) / q(x)). The relaxed rules extend it and fall back to it at their zero
    setting (LANTERN's delta 0, GSD's group 1)."""

    name: ClassVar[str] = "sjd"
    needs_codebook: ClassVar[bool] = False

    @classmethod
    def of(cls, s: DrafterSettings) -> "SJD":
        return cls()

    def prepare(self, codebook: Tensor | None, model: torch.nn.Module | None) -> Tensor | None:
        """What the rule precomputes from the model's codebook (kept by the bound Verifier as
        `table`)."""
        return None

    def target_mass(
        self, p: Tensor, q: Tensor, x: Tensor, bound: "Verifier"
    ) -> tuple[Tensor, Tensor]:
        """(the target's mass and the draft's mass that the acceptance ratio compares), [B, S]
        each."""
        return _gather(p, x), _gather(q, x)


@dataclass(frozen=True)
class LANTERN(SJD):
    """p(x) raised by the mass of x's nearest codebook neighbours, as many as fit in delta."""

    k: int  # latent neighbours considered per token
    delta: float  # cap on the neighbours' mass added to p(x); 0 is SJD
    name: ClassVar[str] = "lantern"

    @classmethod
    def of(cls, s: DrafterSettings) -> "LANTERN":
        return cls(s.lantern_k, s.lantern_delta)

    @property
    def needs_codebook(self) -> bool:
        return self.delta > 0

    def prepare(self, codebook: Tensor | None, model: torch.nn.Module | None) -> Tensor | None:
        """The neighbour table (cached with the model's weights when given)."""
        if not self.needs_codebook:
            return None
        return (
            latent_neighbours(codebook, self.k)
            if model is None
            else model_neighbours(model, codebook, self.k)
        )

    def target_mass(
        self, p: Tensor, q: Tensor, x: Tensor, bound: "Verifier"
    ) -> tuple[Tensor, Tensor]:
        px, qx = super().target_mass(p, q, x, bound)
        if bound.table is None:
            return px, qx
        is_image = x < bound.num_image  # the largest prefix mass of x's neighbours within delta
        # [B, S, k]
        mass = p.gather(-1, bound.table[x.clamp(max=bound.num_image - 1)].long()).cumsum(-1)
        bonus = (mass * (mass <= self.delta)).amax(-1)
        return px + torch.where(is_image, bonus, torch.zeros_like(bonus)), qx


@dataclass(frozen=True)
class GSD(SJD):
    """a = min(1, p(C) / q(C)) over a cluster C of about `group` tokens around x by target rank,
    filtered by probability gap (and optionally codebook distance)."""

    group: int  # G: tokens around the draft by target rank; 1 is SJD
    max_gap: float  # cluster members differ from p(x) by less than this
    max_distance: float | None  # optional codebook L2 distance filter
    name: ClassVar[str] = "gsd"

    @classmethod
    def of(cls, s: DrafterSettings) -> "GSD":
        return cls(s.gsd_group, s.gsd_max_gap, s.gsd_max_distance)

    @property
    def needs_codebook(self) -> bool:
        return self.max_distance is not None

    def target_mass(
        self, p: Tensor, q: Tensor, x: Tensor, bound: "Verifier"
    ) -> tuple[Tensor, Tensor]:
        if self.group == 1:
            return super().target_mass(p, q, x, bound)
        V, G = p.shape[-1], self.group
        order = p.argsort(dim=-1, descending=True, stable=True)  # [B, S, V]
        rank = torch.empty_like(order).scatter_(
            -1, order, torch.arange(V, device=p.device).expand_as(order)
        )
        offsets = torch.arange(G, device=p.device) - (G - 1) // 2
        ranks = _gather(rank, x)[..., None] + offsets  # [B, S, G]
        valid = (ranks >= 0) & (ranks < V)
        members = order.gather(-1, ranks.clamp(0, V - 1))  # [B, S, G]
        pm, qm, px = p.gather(-1, members), q.gather(-1, members), _gather(p, x)
        # out-of-range ranks are clamped onto real tokens (often x itself): drop them before
        # anything else
        keep = valid & (((pm - px[..., None]).abs() < self.max_gap) | (members == x[..., None]))
        if self.max_distance is not None:
            keep &= self._close(members, x, bound) | (members == x[..., None])
        return (pm * keep).sum(-1), (qm * keep).sum(-1)

    def _close(self, members: Tensor, x: Tensor, bound: "Verifier") -> Tensor:
        emb, K = bound.codebook.float(), bound.num_image
        image = (members < K) & (x[..., None] < K)
        em, ex = emb[members.clamp(max=K - 1)], emb[x.clamp(max=K - 1)][..., None, :]
        return image & ((em - ex).norm(dim=-1) < self.max_distance)


VERIFIERS = {rule.name: rule for rule in (SJD, LANTERN, GSD)}


class Verifier:
    """A verification rule (VERIFIERS[settings.verifier]) bound to one decode's model: the codebook
    (on the decoding device), the image vocabulary size, and what the rule precomputes from them
    (`table`)."""

    def __init__(
        self,
        settings: DrafterSettings,
        codebook: Tensor | None,
        num_image: int,
        model: torch.nn.Module | None = None,
    ):
        """model: the weights the codebook belongs to, which a rule's table is cached with."""
        self.rule = VERIFIERS[settings.verifier].of(settings)
        if self.rule.needs_codebook and codebook is None:
            raise ValueError(
                f"verifier={settings.verifier!r} with these settings needs the model's "
                "VQ codebook, and this model adapter has none; use verifier='sjd'"
            )
        self.codebook, self.num_image = codebook, num_image
        self.table = self.rule.prepare(codebook, model)

    def accept_prob(self, p: Tensor, q: Tensor, x: Tensor) -> Tensor:
        """[B, S] probability of accepting each draft."""
        target, draft = self.rule.target_mass(p, q, x, self)
        return (target / draft.clamp_min(1e-30)).clamp(max=1.0)


def accept_uniforms(batch: int, drafts: int, gen: torch.Generator, device) -> tuple[Tensor, Tensor]:
    """`accept`'s randomness, through the run's generator: one uniform per draft's test, one for
    the next token."""
    return torch.rand(batch, drafts, generator=gen, device=device), uniform(batch, gen, device)


def accept(
    x: Tensor, q: Tensor, p: Tensor, limit: Tensor, verifier: Verifier, u: Tensor, u_next: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """The accept step. Drafts x [B, d] drawn from q [B, d, V], targets p [B, d + 1, V] (p[:, i]
    judges draft i; p[:, d] follows the last one), at most limit[b] drafts acceptable in row b,
    uniforms u [B, d] and u_next [B] (`accept_uniforms`) -> (k [B] drafts accepted, the next
    token [B], accepted [B, d] each draft's own outcome). The next token is drawn from the
    residual norm(max(0, p - q)) at the first rejection, else from p after the accepted prefix:
    together the committed tokens are distributed exactly as under p."""
    d = x.shape[1]
    # no drafts (AR): the next token is a draw from p, without the verification's ops around it
    if d == 0:
        return torch.zeros_like(limit), draw(p[:, 0], u_next), torch.zeros_like(u, dtype=torch.bool)
    accepted = (u < verifier.accept_prob(p[:, :d], q, x)) & (
        torch.arange(d, device=x.device) < limit[:, None]
    )
    k = first_rejection(accepted)
    pk = gather_slot(p, k)
    qk = gather_slot(q, k.clamp(max=d - 1))
    return k, draw(torch.where((k < limit)[:, None], residual(pk, qk), pk), u_next), accepted
