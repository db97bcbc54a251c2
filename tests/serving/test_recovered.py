"""A MoEfication with every quality-recovery option through the synthesised workflow: a shared
expert and a correction bias in the layer functions, output biases in the experts, adaptive k in
the gates. The real handlers compute the monolithic model's output, and the metered requests are
the planned."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from moe import load_corpus
from predictor import RoutingTrace
from tests.serving.test_packed import _cli, _packed_plan, _run_local

RECOVERED = [
    "--model",
    "minilm",
    "--experts",
    "8",
    "--top-k",
    "mass:0.5:4",
    "--shared",
    "0.25",
    "--router",
    "output",
    "--correction",
    "--fit-tokens",
    "1024",
]


@pytest.mark.slow  # every recovery option converted, every method run
def test_recovered_minilm_runs_every_method_as_planned(tmp_path: Path) -> None:
    plan = _packed_plan(RECOVERED, tmp_path, "1", "s3", "pipelined", "direct")
    trace = RoutingTrace.load(tmp_path / "traces")
    per_token = (trace.experts < trace.num_experts).sum(axis=2)
    assert per_token.min() >= 1 and per_token.max() == 4 and (per_token < 4).any()
    assert trace.meta["moefy"]["shared"] == 0.25 and trace.meta["moefy"]["correction"]
    doc = json.loads(plan.read_text())
    assert doc["model"]["moefy"]["top_k"] == "mass:0.5:4"
    assert doc["model"]["quality"]["expert_flops_share"] < 1.0
    # The plan names the text its model was fitted on, and that text's documents.
    fitted = (doc["model"]["moefy"]["fit_corpus"], doc["model"]["moefy"]["fit_corpus_sha256"])
    assert fitted == ("wiki", load_corpus("wiki").sha256)
    assert doc["model"]["quality"]["fit_corpus_sha256"] == fitted[1]
    summary = _run_local(plan)
    assert summary["max_abs_diff_vs_monolithic"] <= 1e-4


def test_profile_reports_quality_and_variable_k(tmp_path: Path) -> None:
    out = _cli("profile", *RECOVERED, "--tokens", "256", "--out", str(tmp_path / "t"))
    quality = out["quality"]
    assert quality["kind"] == "encoder" and 0 < quality["cosine_mean"] <= 1
    # a quarter of the width shared, then 1 to 4 of the 8 routed experts per token
    assert 0.25 + 0.75 / 8 <= quality["expert_flops_share"] <= 0.25 + 0.75 * 4 / 8
    popularity = np.array(out["popularity"])
    assert popularity.sum() < 256 * 6 * 4  # fewer than k_max entries per token
