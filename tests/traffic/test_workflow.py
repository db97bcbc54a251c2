"""The plan's workflow over batch sizes: interpolation error, timings and replica counts."""

from __future__ import annotations

import numpy as np
import pytest

from ground.semantics import runtime_replicas
from planner.costmodel import evaluate
from planner.replay import evaluate_plan, instance_of, runtime_choice
from planner.traffic.workflow import (
    BILL_ITEMS,
    _per_expert_counts,
    manifest_of_plan,
    workflow_model,
)
from tests.traffic.plans import tiny_plan


@pytest.mark.parametrize("method", ["s3", "pipelined", "direct", None])
def test_grid_matches_the_cost_model_at_random_sizes(method: str | None) -> None:
    # Latency and billed seconds are smooth in the batch size: within 1% anywhere. Request
    # counts (pipelined minibatches) and Express's 100-ms rounding are steps, which the linear
    # interpolation smears: a few percent on one batch, but the period's bill sums many sizes
    # and its error must stay within 1%.
    plan = tiny_plan(method=method)
    model = workflow_model(plan, 4096)
    manifest = manifest_of_plan(plan)
    counts = _per_expert_counts(plan)
    sizes = np.random.default_rng(0).integers(8, model.feasible_tokens, 150)
    exact_total, grid_total = 0.0, 0.0
    for n in sizes:
        exactly = evaluate_plan(plan, manifest, counts * n / plan.totals.tokens, int(n))
        latency, items, duration = exactly.latency_s, exactly.bill, exactly.duration_s
        at = np.array([n])
        assert float(model.at(model.latency_s, at)[0]) == pytest.approx(latency, rel=0.01)
        np.testing.assert_allclose(model.at(model.duration_s, at)[0], duration, rtol=0.01)
        point = sum(float(model.at(model.bill_usd[k], at)[0]) for k in BILL_ITEMS)
        exact = sum(items[k] for k in BILL_ITEMS)
        assert point == pytest.approx(exact, rel=0.05)
        exact_total += exact
        grid_total += point
    assert grid_total == pytest.approx(exact_total, rel=0.01)


@pytest.mark.parametrize("method", ["s3", "pipelined", "direct"])
def test_functions_end_where_the_workflow_does(method: str) -> None:
    # At grid sizes the timeline is exact: the tail starts after every layer and ends at the
    # cost model's latency; each stage's functions end by the next stage's start.
    plan = tiny_plan(method=method)
    model = workflow_model(plan, 2048)
    fns = model.functions
    tail = fns.count - 1
    np.testing.assert_allclose(
        model.offset_s[:, tail] + model.duration_s[:, tail], model.latency_s
    )
    for k in range(model.sizes.size):
        for s in range(1, fns.stages - 1, 2):  # each gate stage ends before the next gate
            gate = np.flatnonzero(fns.stage == s)[0]
            nxt = np.flatnonzero(fns.stage == s + 2)[0]
            experts = np.flatnonzero(fns.stage == s + 1)
            ends = model.offset_s[k, experts] + model.duration_s[k, experts]
            assert (ends <= model.offset_s[k, nxt] + 1e-9).all()
            assert model.offset_s[k, gate] <= model.offset_s[k, experts].min() + 1e-9


@pytest.mark.parametrize("method", ["s3", "direct", "pipelined"])
def test_replica_table_is_the_gates_rule(method: str) -> None:
    plan = tiny_plan(method=method, tokens=1024)
    model = workflow_model(plan, 3000)
    manifest = manifest_of_plan(plan)
    counts = _per_expert_counts(plan)
    for n in (1, 7, 300, 1024, model.feasible_tokens):
        inst = instance_of(plan, manifest, counts * n / plan.totals.tokens, n)
        choice = runtime_choice(plan, inst)
        evaluate(inst, choice)
        f = 1
        for layer in range(inst.layers):
            f += 1
            tokens = np.ceil(inst.counts[layer])
            want = (
                choice.replicas[layer]
                if method == "pipelined"
                else np.minimum(tokens, choice.replicas[layer])
            )
            got = model.replicas[n, f : f + inst.experts]
            assert got.tolist() == want.astype(int).tolist()
            f += inst.experts
    assert model.replicas[0].sum() == 0


def test_largest_batch_is_where_the_caps_bind() -> None:
    plan = tiny_plan(method="direct", tokens=512)
    model = workflow_model(plan, 10**6)
    layer = plan.layers[0]
    share = np.array([e.tokens for e in layer.experts]) / plan.totals.tokens
    cap = np.array([e.max_replicas for e in layer.experts])
    fit = np.array([e.max_tokens_per_replica for e in layer.experts])
    for n, ok in ((model.feasible_tokens, True), (model.feasible_tokens + 1, False)):
        worst = True
        for lay in plan.layers:
            share = np.array([e.tokens for e in lay.experts]) / plan.totals.tokens
            cap = np.array([e.max_replicas for e in lay.experts])
            fit = np.array([e.max_tokens_per_replica for e in lay.experts])
            need = runtime_replicas(np.ceil(n * share), cap * 0 + 1, cap, fit)
            worst &= bool((need <= cap).all())
        assert worst is ok
