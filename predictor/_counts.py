"""The predicted-counts file: the hand-over from the predictor to the planner.

A small JSON document (pydantic, versioned) with the predicted tokens per expert of every MoE
layer for one batch, the method that predicted them, and the model identity the planner checks
against its weight sizes. When the batch came from a trace, the real counts ride along so the
planner and the BO loop can measure the prediction error without the trace. `std` and
`model_error` carry the predictive distribution (`predictor._uncertainty`): `quantile(q)` gives
each count's q-quantile, which a plan at a confidence level sizes for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ground.errors import TraceError
from ground.files import read_document, write_file_atomically
from ground.kinds import refuse_other_kind

__all__ = ["COUNTS_VERSION", "PredictedCounts"]

COUNTS_VERSION = 1


class PredictedCounts(BaseModel):
    """Tokens per (layer, expert) predicted for a batch of `tokens` tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: Literal[1] = COUNTS_VERSION
    model: str
    experts: int = Field(ge=1)
    top_k: int = Field(ge=1)
    seed: int = Field(default=0, ge=0, description="The seed the model was MoEfied with.")
    moefy: dict[str, Any] | None = Field(
        default=None, description="The MoEfication options (`moe.MoefyOptions.describe()`)."
    )
    tokens: int = Field(ge=1, description="Tokens in the predicted batch.")
    method: str
    counts: list[list[float]] = Field(description="(layers, experts) predicted tokens.")
    real: list[list[int]] | None = Field(
        default=None, description="(layers, experts) real tokens, when the batch was traced."
    )
    std: list[list[float]] | None = Field(
        default=None,
        description="(layers, experts) predictive standard deviation of each count: per-token "
        "draws from the posteriors widened by the measured model error (normal quantiles).",
    )
    model_error: list[float] | None = Field(
        default=None,
        description="Per layer, the relative model error rho measured on held-out batches "
        "(scale^2 = sampling variance + rho^2 * count^2 + 1).",
    )
    residual_z: list[float] | None = Field(
        default=None,
        description="Standardised residuals (real - count) / std of the held-out batches, "
        "sorted: their empirical quantiles shape the distribution (none: the normal's).",
    )

    @model_validator(mode="after")
    def _shapes(self) -> PredictedCounts:
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} exceeds experts {self.experts}")
        for name in ("counts", "real", "std"):
            rows = getattr(self, name)
            if rows is None:
                continue
            if not rows or any(len(row) != self.experts for row in rows):
                raise ValueError(f"'{name}' must be {self.experts} numbers per layer")
            if any(v < 0 for row in rows for v in row):
                raise ValueError(f"'{name}' has a negative count")
        if self.real is not None and len(self.real) != len(self.counts):
            raise ValueError("'real' and 'counts' have different numbers of layers")
        if self.std is not None and len(self.std) != len(self.counts):
            raise ValueError("'std' and 'counts' have different numbers of layers")
        if self.model_error is not None and len(self.model_error) != len(self.counts):
            raise ValueError("'model_error' needs one value per layer")
        return self

    @property
    def layers(self) -> int:
        return len(self.counts)

    def array(self) -> np.ndarray:
        return np.asarray(self.counts, dtype=float)

    @property
    def has_distribution(self) -> bool:
        return self.std is not None

    def quantile(self, q: float) -> np.ndarray:
        """Each count's q-quantile (L, E); the mean where the file holds no distribution."""
        from predictor._uncertainty import quantile

        if self.std is None:
            return self.array()
        z = None if self.residual_z is None else np.asarray(self.residual_z, float)
        return quantile(self.array(), np.asarray(self.std, float), q, self.tokens, z)

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        path = Path(path)
        write_file_atomically(
            path, lambda tmp: tmp.write_text(self.model_dump_json(indent=1)), force=force
        )
        return path

    @classmethod
    def load(cls, path: str | Path) -> PredictedCounts:
        """Read and validate a counts file.

        Raises:
            TraceError: The file is missing, not JSON, or not a valid counts document.
            UsageError: The file is another kind of document (a plan, a GPU plan, ...).
        """
        refuse_other_kind(path, "counts", "--counts")
        return read_document(
            cls,
            path,
            TraceError,
            "counts file",
            "write one with `moelambda predict --traces DIR --counts-out FILE`.",
        )
