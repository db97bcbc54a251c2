"""A plan's workflow as a function of the batch size: what the simulator replays per batch.

For a batch of n tokens the routing is the plan's predicted popularity scaled to n (each
function's predicted tokens times n / the plan's batch), and everything else is the plan's own
cost model (`planner.replay.evaluate_plan`, the one re-scorer: the instance of the plan's model
and calibration, the replicas the gates use for those counts): the warm latency, the bill by
item and, per function, when its invocation starts after the batch is dispatched and how long it
is billed. Nothing is re-derived here; the model is only evaluated on a geometric grid of batch
sizes and interpolated linearly between grid points (tests bound the error against an exact
evaluation). Replica counts, which are integers, are exact at every size: the rule of the gates
(`ground.semantics.runtime_replicas`) over a table of all sizes.

Functions are numbered head, then per layer its gate and its expert functions, then tail, and
grouped in stages that run one after another: head, gate 0, experts 0, gate 1, ..., tail. A
pipelined layer's replicas start with their gate (so their start offset is the gate's), a direct
layer's after the gate has sent their rows, an s3 layer's after the gate's upload.

A driver or monolithic plan (`ground.driver`) has the driver, in stage 0, then per layer its
remote expert functions, in stage 1 + the layer: each layer's experts start once the driver has
run the layer stage and sent their rows, and the driver waits on every later stage (billed while
a remote expert starts cold, as a direct gate is while its experts do).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ground.manifest import Manifest, StageEntry
from ground.method import Method
from ground.plan import Plan, PlanError
from ground.precision import parse_weights
from ground.semantics import adapts, runtime_replicas
from planner.replay import driver_of, evaluate_plan, instance_of, runtime_choice

__all__ = ["BILL_ITEMS", "Functions", "WorkflowModel", "manifest_of_plan", "workflow_model"]

BILL_ITEMS = ("experts_usd", "nonmoe_usd", "requests_usd", "s3_usd", "workflow_usd")
GRID_RATIO = 1.06  # consecutive grid sizes differ by 6%: interpolation error well under 1%


@dataclass(frozen=True, eq=False)
class Functions:
    """The deployment's functions in simulation order (arrays of length F)."""

    names: list[str]  # as run-local and the CDK name them: head, layer00, layer00/expert01, tail
    role: list[str]  # head, layer, expert, tail
    stage: np.ndarray  # int: the sequential stage each belongs to
    memory_mb: np.ndarray
    weight_bytes: np.ndarray  # bytes of the stages the function downloads at INIT
    hosted: np.ndarray  # experts hosted (1 but for packed expert functions)
    waits_on_next_stage: np.ndarray  # bool: a direct gate, billed while its experts run
    waits_on_previous_stage: np.ndarray  # bool: a pipelined replica, billed while its gate runs
    reserved: np.ndarray  # int: concurrency the stack reserves (an expert's max_replicas; 0: none)
    waits_on_later_stages: np.ndarray  # bool: a driver, billed while any later stage starts

    @property
    def count(self) -> int:
        return len(self.names)

    @property
    def stages(self) -> int:
        return int(self.stage.max()) + 1


@dataclass(frozen=True, eq=False)
class WorkflowModel:
    """The plan evaluated on a grid of batch sizes (arrays over the grid, S points).

    `offset_s` and `duration_s` (S, F) are each function's warm start after the dispatch and its
    billed seconds for one invocation; `replicas` (feasible_tokens + 1, F) the invocations of
    each function for every whole batch size it serves; `feasible_tokens` the largest batch the
    plan serves (a larger one needs more replicas than an expert's cap, and its gate refuses
    it; a table up to a refused request's size would only cost memory, 8 bytes per function
    per token).
    """

    functions: Functions
    sizes: np.ndarray  # (S,) tokens per batch, increasing
    latency_s: np.ndarray  # (S,)
    bill_usd: dict[str, np.ndarray]  # BILL_ITEMS -> (S,)
    offset_s: np.ndarray  # (S, F)
    duration_s: np.ndarray  # (S, F)
    replicas: np.ndarray  # (feasible_tokens + 1, F) int
    feasible_tokens: int
    workflow: str  # express or standard
    express_usd_per_s: float  # what an Express execution costs per second it lasts (0: standard)

    def interpolate(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(grid index i, weight w) per batch: its value is (1 - w) v[i] + w v[i + 1]."""
        tokens = np.clip(np.asarray(tokens, dtype=float), self.sizes[0], self.sizes[-1])
        i = np.clip(np.searchsorted(self.sizes, tokens, side="right") - 1, 0, self.sizes.size - 2)
        w = (tokens - self.sizes[i]) / (self.sizes[i + 1] - self.sizes[i])
        return i.astype(np.int64), w

    def at(self, values: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """A grid array (S,) or (S, F) at each batch size in `tokens`."""
        i, w = self.interpolate(tokens)
        if values.ndim == 2:
            w = w[:, None]
        return (1.0 - w) * values[i] + w * values[i + 1]


def manifest_of_plan(plan: Plan) -> Manifest:
    """The manifest of the plan's model, from the plan alone (no weights are loaded).

    A model shape's comes from its definition at the plan's precision (`ModelRef.weights`; a
    plan made before precisions: the shape's published one, in which its stages were sized),
    with the token sizes the plan was made with. A real model's stage list, token sizes and
    precision in the plan are the whole manifest the cost model reads (a plan made before
    precisions: float32, as every export then was).
    """
    ref = plan.model
    if ref.model_type.startswith("shape:"):
        from planner.shapes import load_shape

        weights = None if ref.weights is None else parse_weights(ref.weights)
        return (
            load_shape(ref.model)
            .manifest(weights)
            .model_copy(
                update={
                    "token_bytes_in": ref.token_bytes_in,
                    "token_bytes_out": ref.token_bytes_out,
                }
            )
        )
    return Manifest(
        format_version=2,
        model=ref.model,
        model_type=ref.model_type,
        family="plan",
        classes={},
        moefied=ref.moefied,
        seed=ref.seed,
        num_layers=ref.num_layers,
        experts=ref.experts,
        top_k=ref.top_k,
        weighting="softmax",
        expert_kind="mlp",
        activation="gelu",
        hidden_size=ref.hidden_size,
        dtype="float32",
        token_bytes_in=ref.token_bytes_in,
        token_bytes_out=ref.token_bytes_out,
        stages=[StageEntry(**s.model_dump()) for s in ref.stages],
        moefy=ref.moefy,
        quality=ref.quality,
        weights=ref.weights,
    )


def _per_expert_counts(plan: Plan) -> np.ndarray:
    """(L, E) predicted tokens per expert of the plan's batch (a packed function's split evenly
    among its experts: the packed instance sums them back; a driver's local experts' from its
    `local_tokens`)."""
    counts = np.zeros((plan.model.num_layers, plan.model.experts))
    for layer in plan.layers:
        for e in layer.experts:
            counts[layer.layer, e.hosted] = e.tokens / len(e.hosted)
    if plan.topology.driven:  # the driver's own experts
        for layer, own, tokens in zip(
            plan.layers, plan.driver.local, plan.driver.local_tokens, strict=True
        ):
            counts[layer.layer, own] = tokens
    return counts


def _driver_functions(plan: Plan) -> Functions:
    """The driver (stage 0; `hosted` counts the stage files it builds), then each layer's
    remote expert functions (stage 1 + layer)."""
    assert plan.driver is not None
    sizes = {(s.role, s.layer, s.expert): s.bytes for s in plan.model.stages}
    held = [sizes[("head", None, None)], sizes[("tail", None, None)]]
    for layer, local in zip(plan.layers, plan.driver.local, strict=True):
        held.append(sizes[("layer", layer.layer, None)])
        held.extend(sizes[("expert", layer.layer, i)] for i in local)
    names, memory, weights, reserved, stage = (
        ["driver"],
        [plan.nonmoe_memory_mb],
        [sum(held)],
        [0],
        [0],
    )
    for layer in plan.layers:
        for e in layer.experts:
            names.append(f"layer{layer.layer:02d}/expert{e.expert:02d}")
            memory.append(e.memory_mb)
            weights.append(sizes[("expert", layer.layer, e.hosted[0])])
            reserved.append(e.max_replicas)
            stage.append(1 + layer.layer)
    count = len(names)
    return Functions(
        names=names,
        role=["driver"] + ["expert"] * (count - 1),
        stage=np.array(stage, dtype=np.int64),
        memory_mb=np.array(memory, dtype=float),
        weight_bytes=np.array(weights, dtype=float),
        hosted=np.array([len(held)] + [1] * (count - 1), dtype=np.int64),
        waits_on_next_stage=np.zeros(count, dtype=bool),
        waits_on_previous_stage=np.zeros(count, dtype=bool),
        reserved=np.array(reserved, dtype=np.int64),
        waits_on_later_stages=np.arange(count) == 0,
    )


def _functions(plan: Plan) -> Functions:
    if plan.topology.driven:
        return _driver_functions(plan)
    sizes = {(s.role, s.layer, s.expert): s.bytes for s in plan.model.stages}
    names, roles, stage, memory, weights, hosted = [], [], [], [], [], []
    waits_next, waits_prev, reserved = [], [], []

    def add(
        name: str, role: str, st: int, mb: int, wb: int, h: int, nxt: bool, prev: bool
    ) -> None:
        names.append(name)
        roles.append(role)
        stage.append(st)
        memory.append(mb)
        weights.append(wb)
        hosted.append(h)
        waits_next.append(nxt)
        waits_prev.append(prev)
        reserved.append(0)

    nonmoe = plan.nonmoe_memory_mb
    add("head", "head", 0, nonmoe, sizes[("head", None, None)], 1, False, False)
    for layer in plan.layers:
        e = layer.layer
        gate = f"layer{e:02d}"
        add(gate, "layer", 1 + 2 * e, nonmoe, sizes[("layer", e, None)], 1,
            layer.method == "direct", False)  # fmt: skip
        for x in layer.experts:
            add(
                f"{gate}/expert{x.expert:02d}",
                "expert",
                2 + 2 * e,
                x.memory_mb,
                sum(sizes[("expert", e, h)] for h in x.hosted),
                len(x.hosted),
                False,
                layer.method == "pipelined",
            )
            reserved[-1] = x.max_replicas
    add("tail", "tail", 2 + 2 * len(plan.layers) - 1, nonmoe, sizes[("tail", None, None)], 1,
        False, False)  # fmt: skip
    return Functions(
        names=names,
        role=roles,
        stage=np.array(stage, dtype=np.int64),
        memory_mb=np.array(memory, dtype=float),
        weight_bytes=np.array(weights, dtype=float),
        hosted=np.array(hosted, dtype=np.int64),
        waits_on_next_stage=np.array(waits_next, dtype=bool),
        waits_on_previous_stage=np.array(waits_prev, dtype=bool),
        reserved=np.array(reserved, dtype=np.int64),
        waits_on_later_stages=np.zeros(len(names), dtype=bool),
    )


def _feasible(plan: Plan, manifest: Manifest, counts: np.ndarray, tokens: int) -> bool:
    scaled = counts * tokens / plan.totals.tokens
    try:
        if plan.topology.driven:
            driver_of(plan, manifest, scaled, tokens)
        else:
            runtime_choice(plan, instance_of(plan, manifest, scaled, tokens))
    except PlanError:
        return False
    return True


def _largest_batch(plan: Plan, manifest: Manifest, counts: np.ndarray, limit: int) -> int:
    """The largest batch (<= limit) whose real counts the plan's gates can spread (bisection:
    replicas needed grow with the batch)."""
    if _feasible(plan, manifest, counts, limit):
        return limit
    low, high = 0, limit  # low feasible (0 trivially), high not
    while high - low > 1:
        mid = (low + high) // 2
        if _feasible(plan, manifest, counts, mid):
            low = mid
        else:
            high = mid
    return low


def _point(
    plan: Plan, manifest: Manifest, counts: np.ndarray, tokens: int
) -> tuple[float, dict[str, float], np.ndarray, np.ndarray]:
    """(latency, bill by item, start offsets (F,), billed seconds (F,)) of one batch size, as
    the one re-scorer (`planner.replay.evaluate_plan`) says."""
    ev = evaluate_plan(plan, manifest, counts * tokens / plan.totals.tokens, tokens)
    return ev.latency_s, ev.bill, ev.offset_s, ev.duration_s


def _replica_table(plan: Plan, counts: np.ndarray, max_tokens: int, f_count: int) -> np.ndarray:
    """(max_tokens + 1, F) invocations of each function at every whole batch size: 1 for the
    head, gates and tail; per expert function, its non-empty shards under the gates' rule."""
    n = np.arange(max_tokens + 1, dtype=float)
    table = np.ones((n.size, f_count), dtype=np.int64)
    table[0] = 0
    f = 1
    for layer in plan.layers:
        f += not plan.topology.driven  # a gate; a driver's remote experts follow each other
        planned = np.array([e.replicas for e in layer.experts])
        cap = np.array([e.max_replicas for e in layer.experts])
        fit = np.array([e.max_tokens_per_replica for e in layer.experts])
        share = np.array([e.tokens for e in layer.experts]) / plan.totals.tokens
        tokens = np.ceil(n[:, None] * share[None, :])  # (N, E) the batch's rows per function
        if plan.topology.driven or adapts(Method.parse(layer.method)):
            replicas = runtime_replicas(tokens, planned[None, :], cap[None, :], fit[None, :])
            invoked = np.minimum(tokens, np.minimum(replicas, cap[None, :]))
        else:
            invoked = np.broadcast_to(planned[None, :], tokens.shape)
        table[:, f : f + planned.size] = invoked
        table[0, f : f + planned.size] = 0
        f += planned.size
    return table


def workflow_model(plan: Plan, max_tokens: int) -> WorkflowModel:
    """The plan's workflow for every batch of 1..max_tokens tokens (see the module docstring).

    Raises:
        PlanError: The plan cannot serve even a one-token batch.
    """
    manifest = manifest_of_plan(plan)
    counts = _per_expert_counts(plan)
    functions = _functions(plan)
    max_tokens = max(int(max_tokens), 2)
    feasible = _largest_batch(plan, manifest, counts, max_tokens)
    if feasible < 1:
        raise PlanError(
            "the plan cannot serve a batch of one token: an expert's cap is below its need.",
            "re-plan with `moelambda plan`.",
        )
    steps = max(2, math.ceil(math.log(max(feasible, 2)) / math.log(GRID_RATIO)) + 1)
    sizes = np.unique(np.round(np.geomspace(1, max(feasible, 2), steps)).astype(int))
    sizes = sizes[sizes <= feasible] if feasible >= 2 else np.array([1, 2])
    latency = np.zeros(sizes.size)
    items = {name: np.zeros(sizes.size) for name in BILL_ITEMS}
    offset = np.zeros((sizes.size, functions.count))
    duration = np.zeros_like(offset)
    for k, n in enumerate(sizes):
        latency[k], point, offset[k], duration[k] = _point(
            plan, manifest, counts, int(min(n, feasible))
        )
        for name in BILL_ITEMS:
            items[name][k] = point[name]
    cal = plan.calibration
    express = (
        cal["express_memory_mb"] * cal["express_gb_second_usd"] / cal["billing_mb_per_gb"]
        if plan.workflow == "express"
        else 0.0
    )
    return WorkflowModel(
        functions=functions,
        sizes=sizes.astype(float),
        latency_s=latency,
        bill_usd=items,
        offset_s=offset,
        duration_s=duration,
        replicas=_replica_table(plan, counts, feasible, functions.count),
        feasible_tokens=int(feasible),
        workflow=plan.workflow,
        express_usd_per_s=express,
    )
