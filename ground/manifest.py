"""The manifest of a weight export: what the planner and the functions read instead of the model.

It lives here, with no torch import, because the planner, the Plan and the CDK app need the stage
sizes and keys but must not load a model to get them. The keys are the weight half of the S3
layout (the request half is `ground.layout`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ground.precision import Weights, parse_weights

__all__ = [
    "DTYPE_BYTES",
    "HEAD_KEY",
    "MANIFEST_VERSION",
    "TAIL_KEY",
    "Manifest",
    "StageEntry",
    "expert_key",
    "layer_key",
]

MANIFEST_VERSION = 2  # 2: a layer file may hold a shared expert; experts an output bias
HEAD_KEY = "head.safetensors"
TAIL_KEY = "tail.safetensors"


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def layer_key(layer: int) -> str:
    return f"layers/{layer:02d}/layer.safetensors"


def expert_key(layer: int, expert: int) -> str:
    return f"layers/{layer:02d}/experts/{expert:02d}.safetensors"


class StageEntry(BaseModel):
    """One deployable stage: its role, position, S3 key and size in bytes."""

    model_config = ConfigDict(frozen=True)

    role: Literal["head", "layer", "expert", "tail"]
    layer: int | None = None
    expert: int | None = None
    key: str
    bytes: int


class Manifest(BaseModel):
    """What an export holds; the planner and the functions read it instead of the model."""

    model_config = ConfigDict(frozen=True)

    format_version: int
    model: str
    model_type: str
    family: str
    classes: dict[str, str]
    moefied: bool
    seed: int
    num_layers: int
    experts: int
    top_k: int
    weighting: str
    expert_kind: str
    activation: str
    hidden_size: int
    dtype: str
    token_bytes_in: int
    token_bytes_out: int
    stages: list[StageEntry]
    router_fit: list[dict[str, float]] = []
    # The MoEfication options (`moe.MoefyOptions.describe()`; None for native MoE models) and the
    # model's quality against the dense one on held-out text (`moe.Quality`), when measured.
    moefy: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    # The precision of the stored weights per stage kind (`ground.precision.Weights.label`);
    # None in an export made before precisions existed: then `dtype` says it.
    weights: str | None = None

    @property
    def precision(self) -> Weights:
        """The weights' precision per stage kind (float32 or bfloat16 `dtype` when unnamed)."""
        if self.weights is not None:
            return parse_weights(self.weights)
        return parse_weights("fp32" if self.dtype == "float32" else "bf16")

    def params(self, stage: StageEntry) -> float:
        """Weight values of `stage`: its bytes over its kind's bytes per value (an int8
        stage's per-channel scales count as a fraction of a value: under 1 %)."""
        return stage.bytes / self.precision.bytes_per_weight(stage.role)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per weight value: stage bytes / this = parameters (2 FLOPs each per token)."""
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown weight dtype '{self.dtype}'; known: {sorted(DTYPE_BYTES)}")
        return DTYPE_BYTES[self.dtype]

    def expert_bytes(self) -> list[list[int]]:
        """P_{e,i}: bytes of expert i of layer e, as downloaded by its function."""
        sizes = [[0] * self.experts for _ in range(self.num_layers)]
        for stage in self.stages:
            if stage.role == "expert":
                assert stage.layer is not None and stage.expert is not None
                sizes[stage.layer][stage.expert] = stage.bytes
        return sizes
