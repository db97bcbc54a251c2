"""The BO comparison over several seeds: mean and spread per method, and the paper's claims.

One seed is one draw of the learning and test batches and of every sampler's randomness, so
the spread is what a user re-running the search on other text would see. A claim holds when it
holds on the mean by more than twice the standard error of the paired differences (the methods
of one seed share its batches, so they are compared seed by seed); it fails when the mean
points the other way by as much; otherwise it is "not shown" at this many seeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["METRICS", "claims", "statistics"]

# What is compared: the learning cut (higher is better), the held-out cost against the oracle,
# the held-out SLO attainment, the iteration the search converged at.
METRICS = ("learn_improvement", "cost_vs_oracle", "slo_attainment", "converged_at")


def _values(reports: Sequence[dict[str, Any]], method: str, metric: str) -> np.ndarray:
    out = []
    for report in reports:
        row = report["methods"][method]
        if metric == "slo_attainment":
            tests = report["setup"]["test_batches"]
            out.append(1.0 - row["slo_violations"] / tests)
        else:
            value = row.get(metric)
            out.append(np.nan if value is None else float(value))
    return np.asarray(out, float)


def statistics(reports: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """Per method and metric: mean, std (ddof 1), min and max over the seeds."""
    methods = list(reports[0]["methods"])
    out: dict[str, dict[str, dict[str, float]]] = {}
    for method in methods:
        out[method] = {}
        for metric in METRICS:
            values = _values(reports, method, metric)
            values = values[~np.isnan(values)]
            if values.size == 0:
                continue
            out[method][metric] = {
                "mean": round(float(values.mean()), 6),
                "std": round(float(values.std(ddof=1)) if values.size > 1 else 0.0, 6),
                "min": round(float(values.min()), 6),
                "max": round(float(values.max()), 6),
            }
    return out


def _verdict(differences: np.ndarray) -> tuple[str, float, float]:
    """("holds" | "fails" | "not shown", mean, standard error) of paired differences > 0."""
    differences = differences[~np.isnan(differences)]
    if differences.size < 2:
        return "not shown", float(differences.mean()) if differences.size else 0.0, 0.0
    mean = float(differences.mean())
    se = float(differences.std(ddof=1) / np.sqrt(differences.size))
    if mean > 2 * se and mean > 0:
        return "holds", mean, se
    if mean < -2 * se and mean < 0:
        return "fails", mean, se
    return "not shown", mean, se


def claims(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The paper's claims about its search, each judged on the seeds."""
    methods = set(reports[0]["methods"])
    out: list[dict[str, Any]] = []
    if "multi-eps" in methods:
        learn = _values(reports, "multi-eps", "learn_improvement")
        for baseline in ("single-eps", "random", "tpe"):
            if baseline not in methods:
                continue
            verdict, mean, se = _verdict(learn - _values(reports, baseline, "learn_improvement"))
            out.append(
                {
                    "claim": f"multi-dimensional ε-greedy cuts the learning cost more than "
                    f"{baseline}",
                    "verdict": verdict,
                    "mean_difference": round(mean, 6),
                    "standard_error": round(se, 6),
                }
            )
        if "none" in methods:
            gain = _values(reports, "none", "cost_vs_oracle") - _values(
                reports, "multi-eps", "cost_vs_oracle"
            )
            verdict, mean, se = _verdict(gain)
            out.append(
                {
                    "claim": "the tuned predictor's plans cost less on held-out batches than "
                    "the untuned one's",
                    "verdict": verdict,
                    "mean_difference": round(mean, 6),
                    "standard_error": round(se, 6),
                }
            )
    for method in sorted(methods - {"none"}):
        ratio = _values(reports, method, "cost_vs_oracle")
        verdict, mean, se = _verdict(1.03 - ratio)
        out.append(
            {
                "claim": f"{method}: held-out cost within 3 % of the oracle's",
                "verdict": verdict,
                "mean_difference": round(mean, 6),
                "standard_error": round(se, 6),
            }
        )
    return out
