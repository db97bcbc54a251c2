"""Random small planning instances and a brute-force optimum, for the solvers' property tests."""

from __future__ import annotations

import itertools

import numpy as np

from planner.costmodel import Choice, expert_options, global_terms, layer_terms
from planner.instance import Instance, Method


def small_instance(
    seed: int,
    *,
    layers: int = 2,
    experts: int = 3,
    memories: int = 3,
    replicas: int = 2,
    betas: tuple[int, ...] = (8, 64),
    workflow: str = "express",
    objective: str = "full",
) -> Instance:
    """Counts from a skewed distribution, a few memory options, realistic platform constants."""
    rng = np.random.default_rng(seed)
    counts = np.floor(rng.dirichlet(np.full(experts, 0.7), size=layers) * 400)
    counts[rng.random((layers, experts)) < 0.1] = 0  # an idle expert now and then
    memory = np.sort(rng.choice([512, 768, 1024, 1769, 2048, 3008], size=memories, replace=False))
    return Instance(
        counts=counts,
        expert_bytes=rng.uniform(1e6, 3e7, (layers, experts)),
        token_bytes_in=1536.0,
        token_bytes_out=1536.0,
        memory_mb=memory.astype(float),
        compute_s=2e-4 * 1769 / np.minimum(memory, 1769),
        max_replicas=replicas,
        warm_start_s=0.02,
        s3_delay_s=0.02,
        s3_bandwidth=75e6,
        invoke_bandwidth=56.25e6,
        direct_payload_bytes=262144,
        runtime_mb=300.0,
        price_mb_s=0.0000166667 / 1024,
        request_usd=2e-7,
        s3_put_usd=5e-6,
        s3_get_usd=4e-7,
        s3_list_usd=5e-6,
        s3_delete_usd=5e-6,
        transition_usd=2.5e-5,
        express_request_usd=1e-6,
        express_mb_s_usd=1.6667e-5 / 1024,
        express_memory_mb=64.0,
        express_step_s=0.1,
        nonmoe_memory_mb=1769.0,
        head_s=0.05,
        tail_s=0.05,
        layer_s=np.full(layers, 0.1),
        tokens=400,
        workflow=workflow,
        objective=objective,
        betas=betas,
    )


def layer_table(inst: Instance, layer: int, methods=tuple(Method)):  # type: ignore[no-untyped-def]
    """Every complete decision of one layer: (cost, latency, method, beta, memory, replicas).

    The cost is the layer's share of the objective: its experts' costs plus `layer_terms`.
    """
    rows = []
    per_method_betas = {m: (inst.betas if m is Method.PIPELINED else (1,)) for m in methods}
    for method in methods:
        usd, per_s = layer_terms(inst, layer, method)
        for beta in per_method_betas[method]:
            opts = expert_options(inst, layer, method, beta)
            e_idx = np.arange(inst.experts)
            options = list(itertools.product(range(inst.memory_mb.size), range(inst.max_replicas)))
            for combo in itertools.product(options, repeat=inst.experts):
                j = np.array([c[0] for c in combo])
                g = np.array([c[1] for c in combo])
                if not opts.feasible[e_idx, j, g].all():
                    continue
                latency = float(opts.finish[e_idx, j, g].max())
                cost = float(opts.cost[e_idx, j, g].sum()) + usd + per_s * latency
                rows.append((cost, latency, method, beta, j, g + 1))
    return rows


def brute_force(inst: Instance, slo_s: float | None, methods=tuple(Method)):  # type: ignore[no-untyped-def]
    """The cheapest feasible choice by enumerating every combination (tiny instances only).

    Returns (cost, choice) or None when no choice meets the SLO.
    """
    tables = [layer_table(inst, layer, methods) for layer in range(inst.layers)]
    if any(not rows for rows in tables):
        return None
    combinations = int(np.prod([len(rows) for rows in tables], dtype=float))
    if combinations > 10**8:
        raise ValueError(f"{combinations:.2e} combinations: too many to enumerate; shrink it")
    usd, per_s = global_terms(inst)
    cost = np.array([usd + per_s * inst.fixed_s()])
    latency = np.zeros(1)
    for rows in tables:  # every combination, as an outer sum
        cost = (cost[:, None] + np.array([r[0] for r in rows])[None, :]).ravel()
        latency = (latency[:, None] + np.array([r[1] for r in rows])[None, :]).ravel()
    ok = inst.fixed_s() + latency <= (np.inf if slo_s is None else slo_s * (1 + 1e-9))
    if not ok.any():
        return None
    best = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
    picks = np.unravel_index(best, [len(rows) for rows in tables])
    rows = [table[i] for table, i in zip(tables, picks, strict=True)]
    choice = Choice(
        method=np.array([int(r[2]) for r in rows]),
        beta=np.array([r[3] for r in rows]),
        memory=np.stack([r[4] for r in rows]),
        replicas=np.stack([r[5] for r in rows]),
    )
    return float(cost[best]), choice
