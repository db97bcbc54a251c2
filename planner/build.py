"""From a model and predicted counts to a planning instance, and from a solution to a Plan.

The model's facts come from its manifest (`moe.describe_model`): stage sizes in bytes (the
expert sizes P_{e,i}, the layer and head/tail sizes for the non-MoE functions) and the bytes per
token. Compute times scale the calibrated reference expert by FLOPs, counting two FLOPs per
weight per token (one multiply-add), which holds for the matmul-dominated stages; a stage's
weights are its bytes over its kind's bytes per value (`ground.precision`: the experts' and the
stack's precisions may differ), and its time is scaled by its precision's speed on CPUs against
fp32 (`Calibration.speed_ratio`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ground.manifest import Manifest
from ground.plan import ExpertPlan, LayerPlan, Plan, Totals
from planner.calibration import Calibration
from planner.compute import expert_compute_s, flops_per_token
from planner.costmodel import Solution, bill, replica_limits
from planner.instance import Instance, Method
from planner.plan_writer import write_plan

__all__ = ["instance_for", "make_plan", "stage_compute_s"]

NONMOE_MEMORY_MB = 1769  # one full vCPU for the head, gate and tail functions


def stage_compute_s(
    calibration: Calibration, manifest: Manifest, stage_bytes: float, role: str
) -> np.ndarray:
    """U_j of a stage of `role` holding `stage_bytes` of `manifest`'s weights at each memory
    option: its FLOPs at its kind's bytes per value, at its precision's speed on CPUs."""
    precision = manifest.precision
    flops = flops_per_token(stage_bytes, precision.bytes_per_weight(role))
    ratio = calibration.speed_ratio(precision.of(role))
    return np.asarray(expert_compute_s(calibration, flops)) * ratio


def instance_for(
    manifest: Manifest,
    counts: np.ndarray,
    calibration: Calibration,
    *,
    tokens: int,
    arch: str = "x86_64",
    workflow: str = "express",
    objective: str = "full",
    payload: str = "invoke",
    pipelined_residency: bool = False,
) -> Instance:
    """The planning instance of `manifest`'s model serving a batch with `counts` per expert."""
    sizes = {(s.role, s.layer, s.expert): s.bytes for s in manifest.stages}
    layers, experts = manifest.num_layers, manifest.experts
    expert_bytes = np.array(manifest.expert_bytes(), dtype=float)
    layer_bytes = np.array([sizes[("layer", layer, None)] for layer in range(layers)], float)
    expert_u = stage_compute_s(calibration, manifest, float(expert_bytes.mean()), "expert")
    options = np.asarray(calibration.memory_options_mb, dtype=float)
    layer_u_ref = stage_compute_s(calibration, manifest, float(layer_bytes.mean()), "layer")
    nonmoe_u = float(np.interp(NONMOE_MEMORY_MB, options, layer_u_ref))
    # The tail stage computes too: a decoder's LM head is a (vocab x hidden) matmul per token.
    tail_bytes = float(sizes[("tail", None, None)])
    tail_u_ref = stage_compute_s(calibration, manifest, tail_bytes, "tail")
    tail_u = float(np.interp(NONMOE_MEMORY_MB, options, tail_u_ref))
    if counts.shape != (layers, experts):
        raise ValueError(f"counts have shape {counts.shape}, the model ({layers}, {experts})")
    return Instance.build(
        counts,
        calibration,
        expert_bytes=expert_bytes,
        token_bytes=manifest.token_bytes_in,
        compute_s=expert_u,
        nonmoe_compute_s=nonmoe_u,
        tokens=tokens,
        tail_compute_s=tail_u,
        arch=arch,
        workflow=workflow,
        objective=objective,
        nonmoe_memory_mb=NONMOE_MEMORY_MB,
        payload=payload,
        pipelined_residency=pipelined_residency,
        meta={"model": manifest.model},
    )


def make_plan(
    inst: Instance,
    solution: Solution,
    manifest: Manifest,
    calibration: Calibration,
    *,
    slo_s: float | None,
    counts_source: dict[str, Any],
) -> Plan:
    """The Plan document of a solver's solution.

    Each expert's cap: the gate of an s3 or direct layer may spread a batch's real tokens over up
    to G replicas (its reserved concurrency); a pipelined layer's replicas start before the gate
    knows the counts, so its cap is the planned count. `max_tokens_per_replica` is what one
    replica's memory holds (and, for direct, what one Invoke event carries).
    """
    choice, ev = solution.choice, solution.evaluation
    caps, fits = replica_limits(inst, choice)
    layers = []
    for layer in range(inst.layers):
        method = Method(int(choice.method[layer]))
        experts = [
            ExpertPlan(
                expert=e,
                hosts=None if inst.groups is None else [int(x) for x in inst.groups[layer, e]],
                memory_mb=int(inst.memory_mb[choice.memory[layer, e]]),
                replicas=int(choice.replicas[layer, e]),
                tokens=float(inst.counts[layer, e]),
                time_s=float(ev.expert_time[layer, e]),
                cost_usd=float(ev.expert_cost[layer, e]),
                max_replicas=int(caps[layer, e]),
                max_tokens_per_replica=int(fits[layer, e]),
            )
            for e in range(inst.experts)
        ]
        layers.append(
            LayerPlan(
                layer=layer,
                method=method.label,
                beta=int(choice.beta[layer]) if method is Method.PIPELINED else 1,
                latency_s=float(ev.layer_latency[layer]),
                cost_usd=float(ev.layer_cost[layer]),
                experts=experts,
            )
        )
    return write_plan(
        manifest,
        calibration,
        solver=solution.solver,
        workflow=inst.workflow,
        objective=inst.objective,
        nonmoe_memory_mb=int(inst.nonmoe_memory_mb),
        optimal=solution.optimal,
        arch=inst.arch,
        direct_payload_bytes=inst.direct_payload_bytes,
        counts_source=counts_source,
        layers=layers,
        totals=Totals(
            tokens=inst.tokens,
            moe_cost_usd=ev.experts_usd,
            bill_usd=bill(inst, choice, ev),
            latency_s=ev.latency,
            slo_s=slo_s,
        ),
    )
