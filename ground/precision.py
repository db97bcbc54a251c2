"""The precision of a served model's weights: what `--weights` names, per stage kind.

A decode step is bound by the bytes of weights it reads and a function's price by its memory, so
the weights' precision is a plan dimension beside shape and hardware. Two stage kinds can differ
(`Weights`): the non-MoE stack (embeddings, attention, norms' neighbours, LM head: the head,
layer and tail stages) and the routed experts (the expert stages). The gate (router) and the
norms always stay float32: they are a few thousand values per layer, and a rounded gate flips
routing decisions, which costs quality for no byte saved.

* ``fp32``: float32, as the model was fitted.
* ``bf16``: bfloat16 weights and activations (the stage runs in bfloat16; hidden states cross a
  function's boundary as bfloat16, exactly, because that is what the stage computed). Needs
  hardware that computes in bfloat16: a GPU, or a CPU with AVX512-BF16 or AMX (`moe._precision`
  detects it and refuses otherwise).
* ``int8``: weight-only int8, symmetric, one float32 scale per output channel; activations stay
  float32 (the kernel quantizes each call's input on the fly: `moe._precision` says which kernel
  and why). An int8 weight file holds the int8 values and the scales, about a quarter of float32.

Torch-free: the planner, the manifest and the CLI read it.
"""

from __future__ import annotations

import re
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

from ground.errors import UsageError

__all__ = [
    "ACTIVATION_DTYPE",
    "BYTES",
    "FP32",
    "PRECISIONS",
    "Precision",
    "Weights",
    "parse_weights",
    "scale_bytes",
]

Precision = Literal["fp32", "bf16", "int8"]
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
# Bytes per stored weight value. int8 adds one float32 scale per output channel (`scale_bytes`).
BYTES: dict[Precision, int] = {"fp32": 4, "bf16": 2, "int8": 1}
# The torch dtype name a precision computes its activations in.
ACTIVATION_DTYPE: dict[Precision, str] = {"fp32": "float32", "bf16": "bfloat16", "int8": "float32"}


class Weights(BaseModel):
    """The precision of each stage kind's weights (`--weights`)."""

    model_config = ConfigDict(frozen=True)

    stack: Precision = "fp32"
    experts: Precision = "fp32"

    def label(self) -> str:
        """The spelling `parse_weights` reads back: one name when both kinds agree."""
        if self.stack == self.experts:
            return self.stack
        return f"stack={self.stack},experts={self.experts}"

    @property
    def is_fp32(self) -> bool:
        return self.stack == "fp32" and self.experts == "fp32"

    def of(self, role: str) -> Precision:
        """The precision of a stage of `role` (head, layer, tail: the stack; expert)."""
        return self.experts if role == "expert" else self.stack

    def bytes_per_weight(self, role: str) -> int:
        return BYTES[self.of(role)]

    def wire_bytes(self) -> int:
        """Bytes per value of a hidden state on the wire (S3, Invoke payloads): bfloat16 when
        the stack computes in bfloat16 (exact: the value was a bfloat16), else float32."""
        return 2 if self.stack == "bf16" else 4

    def expert_wire_bytes(self) -> int:
        """Bytes per value of an expert's output rows: bfloat16 when either kind computes in
        bfloat16 (an expert returns its rows in the stack's dtype), else float32."""
        return 2 if "bf16" in (self.stack, self.experts) else 4

    def kv_bytes(self) -> int:
        """Bytes per value of a decoder's KV cache: the stack's activation dtype."""
        return self.wire_bytes()


FP32 = Weights()


def parse_weights(spec: str | Weights | None) -> Weights:
    """Read `--weights`: one precision for every stage (``int8``), or per stage kind
    (``stack=bf16,experts=int8``; a kind left out stays fp32).

    Raises:
        UsageError: A name or a stage kind is unknown.
    """
    if spec is None:
        return FP32
    if isinstance(spec, Weights):
        return spec
    text = spec.strip().lower()
    names = ", ".join(PRECISIONS)
    if text in PRECISIONS:
        return Weights(stack=text, experts=text)  # type: ignore[arg-type]
    parts = dict(re.findall(r"(\w+)=(\w+)", text))
    rebuilt = ",".join(f"{k}={v}" for k, v in parts.items())
    if not parts or rebuilt != text.replace(" ", ""):
        raise UsageError(
            f"--weights '{spec}' is not a precision.",
            f"pass one of {names} (every stage), or per stage kind: stack=bf16,experts=int8.",
        )
    for kind, value in parts.items():
        if kind not in ("stack", "experts"):
            raise UsageError(
                f"--weights '{spec}': '{kind}' is not a stage kind.",
                "name stack (head, attention layers, tail) and/or experts.",
            )
        if value not in PRECISIONS:
            raise UsageError(
                f"--weights '{spec}': '{value}' is not a precision.", f"use one of {names}."
            )
    return Weights(**parts)


def scale_bytes(rows: int, precision: Precision) -> int:
    """The bytes int8 adds to a matrix of `rows` output channels: one float32 scale each."""
    return 4 * rows if precision == "int8" else 0
