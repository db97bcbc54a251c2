"""The options of MoEfication: how a dense FFN becomes experts, and how far it may drift from it.

One frozen model holds every choice that changes the served model, so the cache key, the
manifest, routing traces and the planner all name the same MoEfication. The defaults are the
original MoEfication of this project (E experts of equal width, a linear gate fitted to the
largest activation mass, top-k with unit weights, no correction), so a model made before these
options existed is the model made with the defaults.

Quality recovery (each measured with `moelambda quality`):

* ``shared``: a fraction of the FFN's neurons, those carrying the most activation mass on the
  fit split, forms an always-on expert computed in the layer function (DeepSeekMoE, Qwen-MoE).
* ``router="output"``: the gate is fitted to pick the experts whose outputs best reproduce the
  dense FFN's output, not the groups of largest activation mass.
* ``correction``: each expert's output projection (plus a bias per expert and per layer) is
  refitted by least squares so that the routed FFN matches the dense FFN on the fit split.
* ``adaptive``: tokens take a variable number of experts (see `TopK`).
* ``distil_steps``: a short end-to-end distillation of the experts against the dense model.
* ``local_steps``: layer-local distillation: each layer's experts learn, alone, to reproduce the
  dense FFN's output on the inputs the served model gives it (`moe._local`).
* ``ridge``: the correction's ridge penalty (relative to the features' mean energy): larger
  shrinks the refitted projections toward the dense ones, which generalises better on little
  fit text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ground.errors import UsageError

__all__ = ["EXPERT_CHOICES", "MAX_SHARED", "MoefyOptions", "TopK", "parse_top_k"]

EXPERT_CHOICES = (2, 4, 8, 16)
DEFAULT_RIDGE = 1e-3
MAX_SHARED = 0.75


class TopK(BaseModel):
    """How many experts a token takes.

    * ``fixed``: exactly ``k`` (``--top-k 2``).
    * ``gap``: the thesis's adaptive gating: the top expert, and the second too when the top two
      gate probabilities are within ``threshold`` (``--top-k adaptive:0.1``); at most ``k`` = 2.
    * ``mass``: experts in order of gate probability until their cumulative probability reaches
      ``threshold`` (``--top-k mass:0.6``), at most ``k`` (all experts unless given as
      ``mass:0.6:4``).
    """

    model_config = ConfigDict(frozen=True)

    rule: Literal["fixed", "gap", "mass"] = "fixed"
    k: int = Field(ge=1)
    threshold: float | None = None

    @property
    def adaptive(self) -> bool:
        return self.rule != "fixed"

    def label(self) -> str:
        """The spelling `parse_top_k` reads back."""
        if self.rule == "fixed":
            return str(self.k)
        if self.rule == "gap":
            return f"adaptive:{self.threshold:g}"
        return f"mass:{self.threshold:g}:{self.k}"


def parse_top_k(spec: str | int, experts: int | None = None) -> TopK:
    """Read `--top-k`: an integer, ``adaptive:T`` (0 < T < 1) or ``mass:P[:K]`` (0 < P <= 1).

    Raises:
        UsageError: The spelling is unknown or a number is out of range.
    """
    text = str(spec).strip()
    if re.fullmatch(r"\d+", text):
        k = int(text)
        if k < 1:
            raise UsageError(f"--top-k {k} is not positive.", "pass --top-k 1 or more.")
        return TopK(k=k)
    match = re.fullmatch(r"(adaptive|mass):([0-9.]+)(?::(\d+))?", text)
    if not match:
        raise UsageError(
            f"--top-k '{text}' is not a number of experts or an adaptive rule.",
            "pass an integer (2), adaptive:T (e.g. adaptive:0.1: a second expert when the top "
            "two gate probabilities are within T) or mass:P (e.g. mass:0.6: experts until "
            "their gate probabilities add up to P).",
        )
    rule, value, cap = match.group(1), float(match.group(2)), match.group(3)
    if rule == "adaptive":
        if not 0 < value < 1 or cap is not None:
            raise UsageError(
                f"--top-k {text}: the threshold of adaptive:T must be between 0 and 1.",
                "pass e.g. --top-k adaptive:0.1.",
            )
        return TopK(rule="gap", k=2, threshold=value)
    if not 0 < value <= 1:
        raise UsageError(
            f"--top-k {text}: the mass of mass:P must be in (0, 1].",
            "pass e.g. --top-k mass:0.6.",
        )
    k = int(cap) if cap is not None else (experts or 0)
    if k < 1:
        raise UsageError(
            f"--top-k {text} needs the number of experts to bound k.",
            "pass --experts, or write the bound: mass:0.6:4.",
        )
    return TopK(rule="mass", k=k, threshold=value)


class MoefyOptions(BaseModel):
    """Every choice of MoEfication that changes the served model (part of the cache key).

    Attributes:
        experts: Routed experts per layer (E), one of 2, 4, 8, 16; must divide the routed width.
        top_k: Experts per token: fixed k or an adaptive rule.
        shared: Fraction of the FFN width in an always-on shared expert (0 = none).
        router: "mass" (the k groups of largest activation mass, MoEfication's gate) or
            "output" (the experts whose outputs best reproduce the dense FFN's).
        correction: Refit the experts' output projections and biases by least squares.
        distil_steps: Steps of end-to-end distillation of the experts (0 = none).
        local_steps: Steps of layer-local distillation per layer (0 = none).
        ridge: The correction's ridge penalty, relative to the features' mean energy.
        fit_tokens: Tokens of the fit split the clustering, routers and corrections see.
        seed: Seeds the clustering, the router fits and the distillation.
        fit_corpus: The text everything above learns from: "wiki" (embedded) or a file
            (`moe.load_corpus`); its fit part only (`moe._corpus.partition`).
        fit_corpus_sha256: The SHA-256 of that text's documents (`Corpus.sha256`) once the model
            was fitted on it; None before. A model whose options pin it is loaded only while
            the text is the same (`moe.load_model` checks it).
    """

    model_config = ConfigDict(frozen=True)

    experts: int
    top_k: TopK
    shared: float = Field(default=0.0, ge=0.0, le=MAX_SHARED)
    router: Literal["mass", "output"] = "mass"
    correction: bool = False
    distil_steps: int = Field(default=0, ge=0)
    local_steps: int = Field(default=0, ge=0)
    ridge: float = Field(default=DEFAULT_RIDGE, gt=0.0)
    fit_tokens: int = Field(default=8192, ge=128)
    seed: int = 0
    fit_corpus: str = Field(default="wiki", min_length=1)
    fit_corpus_sha256: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> MoefyOptions:
        if self.experts not in EXPERT_CHOICES:
            raise UsageError(
                f"--experts {self.experts} is not supported for MoEfication.",
                f"use one of {', '.join(map(str, EXPERT_CHOICES))}.",
            )
        if self.top_k.k > self.experts:
            raise UsageError(
                f"--top-k {self.top_k.label()} takes up to {self.top_k.k} experts, more than "
                f"--experts {self.experts}.",
                "pick top-k no larger than the number of experts.",
            )
        if self.ridge != DEFAULT_RIDGE and not self.correction:
            raise UsageError(
                f"--ridge {self.ridge:g} is the correction's penalty, and the correction is off.",
                "add --correction, or leave --ridge out.",
            )
        return self

    @property
    def is_original(self) -> bool:
        """True for MoEfication as it was before quality recovery (fixed k, nothing else)."""
        return (
            not self.top_k.adaptive
            and self.shared == 0.0
            and self.router == "mass"
            and not self.correction
            and self.distil_steps == 0
            and self.local_steps == 0
        )

    def describe(self) -> dict[str, Any]:
        """The options as reports, manifests and traces record them."""
        return {
            "experts": self.experts,
            "top_k": self.top_k.label(),
            "shared": self.shared,
            "router": self.router,
            "correction": self.correction,
            "distil_steps": self.distil_steps,
            "local_steps": self.local_steps,
            "ridge": self.ridge,
            "fit_tokens": self.fit_tokens,
            "seed": self.seed,
            "fit_corpus": self.fit_corpus,
            "fit_corpus_sha256": self.fit_corpus_sha256,
        }

    @classmethod
    def from_description(cls, data: dict[str, Any]) -> MoefyOptions:
        """Inverse of `describe` (a description written before the fit corpus was an option
        is of a model fitted on the embedded text)."""
        return cls(
            **{k: v for k, v in data.items() if k != "top_k"},
            top_k=parse_top_k(data["top_k"], data["experts"]),
        )

    def label(self) -> str:
        """A short name for tables: E8 k2 s0.25 out ls."""
        parts = [f"E{self.experts}", f"k{self.top_k.label()}"]
        if self.shared:
            parts.append(f"shared {self.shared:g}")
        if self.router == "output":
            parts.append("router out")
        if self.correction:
            parts.append("corr")
        if self.correction and self.ridge != DEFAULT_RIDGE:
            parts.append(f"ridge {self.ridge:g}")
        if self.local_steps:
            parts.append(f"local {self.local_steps}")
        if self.distil_steps:
            parts.append(f"distil {self.distil_steps}")
        if self.fit_corpus != "wiki":
            parts.append(f"fit {Path(self.fit_corpus).name}")
        return " ".join(parts)

    def unpinned(self) -> MoefyOptions:
        """The options without the fit text's hash: what a user asks for."""
        return self.model_copy(update={"fit_corpus_sha256": None})
