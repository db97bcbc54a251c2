"""Drift: the routing a deployment observes against the popularity its plan was made for.

The gates emit each batch's tokens per expert as CloudWatch embedded-metric records
(`functions.metrics`; `run-local --metrics-out` writes the same lines). `read_metrics` sums them
per layer; `replan` compares the observed shares with the plan's (total-variation distance per
layer), prices today's plan on the observed routing (its gates, or its driver, adapt replicas to
the real counts, `planner.replay.evaluate_plan`; a batch its caps cannot take is refused), makes
the plan of the same deployment shape the
planner would make for the observed routing at the same batch, SLO, arch, workflow and objective,
and says whether, and by how much, the new plan saves money or restores the SLO.

A plan does not move experts' weights, and the routers were fitted on a text (`moefy.fit_corpus`
of the plan's model). Routing far from the plan's (`REFIT_DRIFT`) says the requests are not the
text they were fitted on: the report's `refit` then suggests fitting the model on recent
requests (`--fit-corpus`), which a new plan alone does not do.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import InfeasibleError, UsageError
from ground.plan import Plan, PlanError
from ground.routing_metrics import NAMESPACE, metric_name, metric_value
from planner.replay import calibration_of, evaluate_plan
from planner.traffic.workflow import _per_expert_counts, manifest_of_plan

__all__ = ["REFIT_DRIFT", "REFIT_MIN_ROUTED", "SAVING_THRESHOLD", "read_metrics", "replan"]

SAVING_THRESHOLD = 0.01  # a new plan is advised when it saves at least 1 % per batch
# A layer whose expert shares moved this far (total variation: the share of tokens that would
# have to change expert) over at least REFIT_MIN_ROUTED expert assignments suggests refitting
# the model on the observed text. The floor on assignments keeps sampling noise out: one batch
# of 256 tokens drifted 25.8 % from its plan's predicted shares (docs/traffic.md); over 10,000
# assignments of E = 8 experts the noise is about 1 %.
REFIT_DRIFT = 0.2
REFIT_MIN_ROUTED = 10_000


def read_metrics(path: Path, layers: int, experts: int) -> tuple[np.ndarray, np.ndarray]:
    """(tokens per layer and expert summed over the records (L, E), records per layer (L,)).

    Lines that are not EMF routing records (other log lines) are skipped.

    Raises:
        UsageError: An unreadable or non-UTF-8 file, no routing record, a record naming a
            layer or expert the plan does not have, a layer of the plan without a record, one
            that does not parse, or a token count below 0.
    """
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(
            f"cannot read the metrics file {path}: {exc.strerror}.",
            "pass the file `run-local --metrics-out` wrote, or the gates' log lines.",
        ) from None
    except UnicodeDecodeError as exc:
        raise UsageError(
            f"the metrics file {path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} at "
            f"offset {exc.start}): it must be JSON lines, CloudWatch EMF records.",
            "pass the file `run-local --metrics-out` wrote, or the gates' log lines as text.",
        ) from None
    counts = np.zeros((layers, experts))
    records = np.zeros(layers, dtype=np.int64)
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict) or "_aws" not in record or "Layer" not in record:
            continue
        try:
            spaces = {m.get("Namespace") for m in record["_aws"].get("CloudWatchMetrics", [])}
            if NAMESPACE not in spaces:
                continue
            layer = int(record["Layer"])
            names = [k for k in record if k.startswith("Expert") and k.endswith("Tokens")]
            if not 0 <= layer < layers or len(names) != experts:
                raise UsageError(
                    f"{path} has a record of layer {layer} with {len(names)} experts; the plan "
                    f"has {layers} layers of {experts}.",
                    "pass the metrics of the deployment this plan describes.",
                )
            tokens = np.array([metric_value(record, metric_name(e)) for e in range(experts)])
        except (AttributeError, KeyError, TypeError, ValueError):
            raise UsageError(
                f"{path} line {number} is a routing record that does not parse: a Layer number "
                f"and {', '.join(metric_name(e) for e in range(min(experts, 2)))}... token "
                "counts are expected.",
                "pass the lines the gates wrote, unchanged.",
            ) from None
        bad = np.flatnonzero(~(np.isfinite(tokens) & (tokens >= 0)))
        if bad.size:
            e = int(bad[0])
            raise UsageError(
                f"{path} line {number}: {metric_name(e)} of layer {layer} is {tokens[e]:g}; a "
                "token count is 0 or more.",
                "pass the lines the gates wrote, unchanged.",
            )
        counts[layer] += tokens
        records[layer] += 1
    if not records.any():
        raise UsageError(
            f"{path} holds no routing record of namespace {NAMESPACE!r}.",
            "run `moelambda run-local --metrics-out FILE`, or export the gates' log lines.",
        )
    missing = np.flatnonzero(records == 0)
    if missing.size:  # every batch passes every layer's gate: these are another model's
        raise UsageError(
            f"{path} has routing records of {layers - missing.size} of the plan's {layers} "
            f"layers, none of layer{'s' if missing.size > 1 else ''} {_ranges(missing)}: "
            "they are not the metrics of this plan's model (each request writes one record "
            "per layer).",
            "pass the metrics of the deployment this plan describes, or the plan of the "
            "model that wrote them.",
        )
    return counts, records


def _ranges(values: np.ndarray) -> str:
    """Sorted integers as ranges: [1, 2, 3, 7] -> '1-3, 7'."""
    runs: list[list[int]] = []
    for v in values.tolist():
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _shares(counts: np.ndarray) -> np.ndarray:
    total = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, total, out=np.zeros_like(counts), where=total > 0)


def _priced(plan: Plan, manifest: Any, counts: np.ndarray) -> dict[str, Any]:
    """Today's plan on a batch routed as `counts` (the plan's batch size), any shape."""
    try:
        used = evaluate_plan(plan, manifest, counts, plan.totals.tokens)
    except PlanError as error:
        return {"refused": True, "reason": error.problem}
    latency = float(used.latency_s)
    slo = plan.totals.slo_s
    return {
        "refused": False,
        "latency_s": latency,
        "cost_usd": float(used.bill["total_usd"]),
        "meets_slo": slo is None or latency <= slo * (1 + 1e-9),
    }


def _refit(plan: Plan, drift: np.ndarray, routed: np.ndarray) -> dict[str, Any] | None:
    """The suggestion to refit a MoEfied model whose routing drifted past `REFIT_DRIFT` in a
    layer of at least `REFIT_MIN_ROUTED` observed assignments (None: no such layer)."""
    moefy = plan.model.moefy
    layers = np.flatnonzero((drift >= REFIT_DRIFT) & (routed >= REFIT_MIN_ROUTED))
    if moefy is None or not layers.size:
        return None
    fitted_on = moefy.get("fit_corpus", "wiki")
    return {
        "fit_corpus": fitted_on,
        "layers": [int(i) for i in layers],
        "advice": (
            f"the routing drift (up to {float(drift.max()):.0%} of a layer's tokens on other "
            f"experts) suggests the requests are not the text the model was fitted on "
            f"('{fitted_on}'): refit it on recent requests (--fit-corpus FILE with `moelambda "
            "choose` or `profile`) and plan again"
        ),
    }


def replan(
    plan: Plan, observed: np.ndarray, *, solver: str = "exact", pack: str | None = None
) -> tuple[dict[str, Any], Plan | None]:
    """(the comparison report, the new plan or None if none meets the plan's SLO).

    `observed` (L, E) are tokens per expert summed over any number of batches; only their
    shares per layer matter, scaled to the plan's batch. `pack`: experts per function of the
    new plan (`moelambda plan --pack`); default today's plan's, so that the comparison is of
    the routing alone. The new plan has today's deployment shape, for the same reason.
    """
    if pack is None:
        pack = str(max((len(e.hosted) for la in plan.layers for e in la.experts), default=1))
    from planner.traffic.planning import moe_plan_at

    manifest = manifest_of_plan(plan)
    planned = _per_expert_counts(plan)
    layers_seen = observed.sum(axis=1) > 0
    scaled = np.where(
        layers_seen[:, None], _shares(observed) * planned.sum(axis=1, keepdims=True), planned
    )
    drift = 0.5 * np.abs(_shares(observed) - _shares(planned)).sum(axis=1)
    drift = np.where(layers_seen, drift, 0.0)  # a layer not observed keeps the plan's counts
    current = _priced(plan, manifest, scaled)
    cal = calibration_of(plan)
    plan_at = moe_plan_at(
        manifest,
        scaled,
        plan.totals.tokens,
        cal,
        arch=plan.arch,
        workflow=plan.workflow,
        objective=plan.objective,
        solver=solver,
        pack=pack,
        counts_source={"replan": True, "from_plan_solver": plan.solver},
        deployment=plan.deployment,
    )
    slo = plan.totals.slo_s
    try:
        new_plan: Plan | None = plan_at(plan.totals.tokens, slo)  # type: ignore[arg-type]
    except InfeasibleError as error:
        new_plan, reason = None, error.problem
    report: dict[str, Any] = {
        "slo_s": slo,
        "tokens": plan.totals.tokens,
        "layers_observed": int(layers_seen.sum()),
        "drift_per_layer": [round(float(d), 6) for d in drift],
        "max_drift": float(drift.max()),
        "current": current,
        "refit": _refit(plan, drift, observed.sum(axis=1)),
    }
    if new_plan is None:
        report["new"] = {"feasible": False, "reason": reason}
        report["advice"] = "no plan meets the SLO on the observed routing"
        return report, None
    new_cost = float(new_plan.totals.bill_usd.get("total_usd", new_plan.totals.moe_cost_usd))
    report["new"] = {
        "feasible": True,
        "latency_s": float(new_plan.totals.latency_s),
        "cost_usd": new_cost,
    }
    if current["refused"] or not current["meets_slo"]:
        report["restores_slo"] = True
        report["saves_usd_per_batch"] = None
        report["advice"] = "replan: today's plan misses the SLO on the observed routing"
    else:
        saves = current["cost_usd"] - new_cost
        report["restores_slo"] = False
        report["saves_usd_per_batch"] = saves
        report["saves_fraction"] = saves / current["cost_usd"] if current["cost_usd"] else 0.0
        report["advice"] = (
            "replan: the new plan is cheaper"
            if report["saves_fraction"] >= SAVING_THRESHOLD
            else "keep today's plan"
        )
    return report, new_plan
