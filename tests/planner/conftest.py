"""Shared fixtures of the planner tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from predictor import PredictedCounts


@pytest.fixture(scope="module")
def counts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Skewed counts for MiniLM, E = 4, top-2, 10,240 tokens."""
    rng = np.random.default_rng(0)
    shares = rng.dirichlet(np.full(4, 0.8), size=6)
    path = tmp_path_factory.mktemp("plan") / "counts.json"
    PredictedCounts(
        model="minilm",
        experts=4,
        top_k=2,
        tokens=10240,
        method="test",
        counts=(shares * 20480).round(2).tolist(),
    ).save(path)
    return path
