"""Faults injected into the synthesised workflow on moto (`pipeline.faults`): throttling and
S3 SlowDown are retried to success, a duplicate delivery changes nothing, a crashed expert
fails its request with the cause named; in every case nothing is left behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from functions.local import run_workflow
from ground.errors import UsageError
from moe import MoEModel
from pipeline.faults import Faults
from tests.serving.conftest import METHODS

TOL = 1e-4


def test_the_spec_is_parsed_strictly() -> None:
    faults = Faults.parse("throttle=0.1, s3-slowdown=0.05,expert-crash=0,duplicate=1", seed=3)
    assert (faults.throttle, faults.s3_slowdown, faults.expert_crash, faults.duplicate) == (
        0.1,
        0.05,
        0.0,
        1.0,
    )
    assert faults.any and not Faults.parse(None).any and not Faults.parse("").any
    for bad, message in (
        ("crash=0.1", "unknown fault 'crash'"),
        ("throttle", "not a fault=rate item"),
        ("throttle=2", "not a number in \\[0, 1\\]"),
        ("duplicate=lots", "not a number in \\[0, 1\\]"),
    ):
        with pytest.raises(UsageError, match=message):
            Faults.parse(bad)
    first, second = Faults.parse("duplicate=0.5", seed=7), Faults.parse("duplicate=0.5", seed=7)
    assert [first.draw("duplicate") for _ in range(50)] == [
        second.draw("duplicate") for _ in range(50)
    ]


def _inputs(minilm: MoEModel) -> list[np.ndarray]:
    texts = ["faults are injected on purpose", "and the workflow must survive them"]
    return [minilm.tokenizer([t], return_tensors="pt")["input_ids"].numpy() for t in texts]


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("throttle=0.1", "throttle"),
        ("s3-slowdown=0.2", "s3-slowdown"),
        ("duplicate=0.5", "duplicate"),
    ],
)
@pytest.mark.usefixtures("no_backoff")
def test_retried_and_repeated_faults_change_nothing(
    spec: str, fault: str, minilm: MoEModel, weights: Path, template: dict[str, Any]
) -> None:
    """Every method of the mixed plan (s3, pipelined, direct, twice) under the fault."""
    inputs = _inputs(minilm)
    result = run_workflow(template, weights, inputs, faults=Faults.parse(spec, seed=1))
    assert result["faults"].get(fault, 0) > 0  # the fault did happen
    for run, ids in zip(result["requests"], inputs, strict=True):
        assert run["status"] == "SUCCEEDED", (run.get("error"), run.get("cause"))
        reference = minilm.forward(torch.from_numpy(ids), reference=True).numpy()
        assert float(np.abs(run["output"] - reference).max()) <= TOL
        assert run["intermediates_left"] == 0


def test_a_crashed_expert_fails_its_request_cleanly(
    minilm: MoEModel, weights: Path, template: dict[str, Any]
) -> None:
    inputs = _inputs(minilm)
    result = run_workflow(template, weights, inputs, faults=Faults.parse("expert-crash=0.5"))
    assert result["faults"]["expert-crash"] > 0
    runs = result["requests"]
    assert any(run["status"] == "FAILED" for run in runs)
    for run, ids in zip(runs, inputs, strict=True):
        if run["status"] == "FAILED":
            assert run["error"] in ("ExpertFailed", "ExpertCrash")
            assert "process died" in run["cause"]
        else:
            reference = minilm.forward(torch.from_numpy(ids), reference=True).numpy()
            assert float(np.abs(run["output"] - reference).max()) <= TOL
        assert run["intermediates_left"] == 0
    assert len(METHODS) == 6
