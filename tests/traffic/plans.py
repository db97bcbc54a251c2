"""Small real plans for the traffic tests: a synthetic float32 model planned by the planner.

The manifest is made by hand (no weights), the counts are skewed, and the plan is the exact
solver's, so every number the simulator reads comes from the real cost model.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ground.manifest import (
    HEAD_KEY,
    MANIFEST_VERSION,
    TAIL_KEY,
    Manifest,
    StageEntry,
    expert_key,
    layer_key,
)
from ground.plan import Plan
from planner import load_calibration
from planner.build import instance_for, make_plan
from planner.exact import solve_exact
from planner.instance import Method


def tiny_manifest(layers: int = 2, experts: int = 4, hidden: int = 256) -> Manifest:
    width = 4 * hidden // experts
    expert_bytes = (2 * hidden * width + width + hidden) * 4
    stages = [StageEntry(role="head", key=HEAD_KEY, bytes=30522 * hidden * 4)]
    for layer in range(layers):
        stages.append(
            StageEntry(role="layer", layer=layer, key=layer_key(layer), bytes=4 * hidden**2 * 4)
        )
        stages += [
            StageEntry(
                role="expert",
                layer=layer,
                expert=e,
                key=expert_key(layer, e),
                bytes=expert_bytes,
            )
            for e in range(experts)
        ]
    stages.append(StageEntry(role="tail", key=TAIL_KEY, bytes=hidden * 4))
    return Manifest(
        format_version=MANIFEST_VERSION,
        model="tiny-traffic",
        model_type="bert",
        family="bert",
        classes={},
        moefied=True,
        seed=0,
        num_layers=layers,
        experts=experts,
        top_k=2,
        weighting="softmax",
        expert_kind="mlp",
        activation="gelu",
        hidden_size=hidden,
        dtype="float32",
        token_bytes_in=hidden * 4,
        token_bytes_out=hidden * 4,
        stages=stages,
    )


def counts_of(layers: int, experts: int, tokens: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(experts, 0.8), size=layers) * tokens * 2


def tiny_plan(
    *,
    method: str | None = None,
    tokens: int = 2048,
    slo_s: float | None = None,
    layers: int = 2,
    experts: int = 4,
    **extra: Any,
) -> Plan:
    """The exact solver's plan of the tiny model for a batch of `tokens`."""
    cal = load_calibration()
    manifest = tiny_manifest(layers, experts)
    counts = counts_of(layers, experts, tokens)
    inst = instance_for(manifest, counts, cal, tokens=tokens)
    methods = tuple(Method) if method is None else (Method.parse(method),)
    solution = solve_exact(inst, slo_s, methods)
    assert solution is not None
    return make_plan(inst, solution, manifest, cal, slo_s=slo_s, counts_source={"test": True})


def with_traffic(
    plan: Plan,
    *,
    max_batch_tokens: int,
    max_wait_s: float,
    policies: dict[str, dict[str, Any]] | None = None,
    spec: str = "test",
    **extra: Any,
) -> Plan:
    """`plan` served for traffic, its block as `plan --traffic` writes it: the batch policy, and
    per function the capacity policy `policies` gives it (none when it names none)."""
    chosen = policies or {}
    capacity = [
        {"function": n, "policy": "none"} | chosen.get(n, {})
        for n in plan.topology.function_names(plan.layers)
    ]
    traffic = {
        "traffic": {"spec": spec},
        "slo_p99_s": 10.0,
        "max_batch_tokens": max_batch_tokens,
        "max_wait_s": max_wait_s,
        "idle_reclaim_s": 600.0,
        "capacity": capacity,
        "simulated": {},
    } | extra
    return Plan.model_validate(plan.model_dump() | {"traffic": traffic})
