"""The GPU plan: where each expert of each MoE layer runs and how its all-to-alls are ordered.

`moelambda gpu-plan` writes it and `moelambda run-gpu` executes it. Per MoE layer: the experts each
GPU hosts with the share of each expert's tokens it takes (Lina replicates popular experts; Aurora
and vanilla host each expert once), the all-to-all order (`aurora`: contention-free rounds from
the batch's own counts; `rank`: every sender in destination rank order), and the predicted times.
The model reference is what the run needs to load the same weights and routing the trace saw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ground.errors import MoelambdaError
from ground.files import read_document, write_file_atomically
from ground.kinds import refuse_other_kind

__all__ = [
    "GPU_PLAN_VERSION",
    "GpuLayerPlan",
    "GpuModelRef",
    "GpuPlan",
    "GpuPlanError",
    "Hosted",
]

GPU_PLAN_VERSION = 1


class GpuPlanError(MoelambdaError):
    """A GPU plan file that cannot be used."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Hosted(_Strict):
    """One expert on one GPU, taking `share` of the expert's tokens (1 unless replicated)."""

    expert: int = Field(ge=0)
    share: float = Field(gt=0, le=1)


class GpuLayerPlan(_Strict):
    layer: int = Field(ge=0)
    placement: list[list[Hosted]] = Field(description="Per GPU rank, the experts it hosts.")
    order: Literal["aurora", "rank"]
    a2a_rounds: int = Field(ge=0, description="Rounds (permutations) of one all-to-all.")
    a2a_s: float = Field(ge=0, description="Predicted seconds of both all-to-alls.")
    lower_bound_s: float = Field(ge=0, description="Theorem 4.2's bound for both all-to-alls.")
    layer_s: float = Field(ge=0, description="Predicted seconds of the whole MoE layer.")

    def hosts(self, experts: int) -> list[list[tuple[int, float]]]:
        """Per expert, the (rank, share) pairs that host it."""
        where: list[list[tuple[int, float]]] = [[] for _ in range(experts)]
        for rank, hosted in enumerate(self.placement):
            for h in hosted:
                where[h.expert].append((rank, h.share))
        return where


class GpuModelRef(_Strict):
    """The model and routing the plan was made for (`moe.load_model` arguments)."""

    name: str
    experts: int = Field(ge=1)
    top_k: int = Field(ge=1)
    moefy_seed: int = 0
    moefy: dict[str, Any] | None = None  # `moe.MoefyOptions.describe()`; None: native MoE


class GpuPlan(_Strict):
    format_version: int = GPU_PLAN_VERSION
    scheduler: Literal["aurora", "lina", "vanilla"]
    model: GpuModelRef
    gpu_types: list[str] = Field(description="The catalogue type of each GPU rank.")
    tokens: int = Field(ge=1, description="Tokens per batch the times are predicted for.")
    layers: list[GpuLayerPlan]
    total_s: float = Field(ge=0)
    cost_per_million_tokens_usd: float = Field(ge=0)

    @property
    def gpus(self) -> int:
        return len(self.gpu_types)

    @model_validator(mode="after")
    def _consistent(self) -> GpuPlan:
        if self.format_version != GPU_PLAN_VERSION:
            raise ValueError(
                f"format version {self.format_version}; this moelambda reads {GPU_PLAN_VERSION}"
            )
        for layer in self.layers:
            if len(layer.placement) != self.gpus:
                raise ValueError(
                    f"layer {layer.layer} places experts on {len(layer.placement)} GPUs, the plan "
                    f"has {self.gpus}"
                )
            shares = [0.0] * self.model.experts
            for hosted in layer.placement:
                for h in hosted:
                    if h.expert >= self.model.experts:
                        raise ValueError(
                            f"layer {layer.layer} hosts expert {h.expert}; the model has "
                            f"{self.model.experts}"
                        )
                    shares[h.expert] += h.share
            missing = [e for e, s in enumerate(shares) if abs(s - 1.0) > 1e-6]
            if missing:
                raise ValueError(
                    f"layer {layer.layer}: the shares of experts {missing} do not add up to 1"
                )
        return self

    def save(self, path: str | Path, *, force: bool = False) -> None:
        text = self.model_dump_json(indent=2)
        write_file_atomically(Path(path), lambda tmp: tmp.write_text(text), force=force)

    @classmethod
    def load(cls, path: str | Path, *, option: str = "--plan") -> GpuPlan:
        """Read a GPU plan; `option` is the command-line option it was given as, which an
        error about a file of another kind names."""
        refuse_other_kind(path, "gpu-plan", option)
        return read_document(
            cls, path, GpuPlanError, "GPU plan", "write one with `moelambda gpu-plan --out FILE`."
        )
