"""A GPU-backed Lambda candidate as the deployable `Plan` document, and its front door's bill.

A plan made for a stream is served behind the batching front door (an SQS queue and the batcher
function, `cdk._front_door`), so a GPU candidate's bill counts it as the CPU traffic planner
does (`ground.frontdoor.planned`, the calibration's SQS and Lambda prices): every request its
own message and execution (a batch of one prompt), the queue's idle long polls over the period,
and the batcher's StartExecution time per execution.

`plan_document` writes the candidates the handlers run today: one GPU function holding the
whole model (`monolithic`), or a GPU driver whose remote experts are CPU functions (`driver`,
each expert its own function, as `planner.deployments.driver_plan` writes them). The driver
(and nothing else) is managed: its environments, host memory (`gpu_model.host_memory_mb`: the
CUDA runtime beside the largest weight file it streams onto the device) and
`accelerator_memory_gib` in the plan's traffic block, on the provider's GPU instance type, at
its GPUs' computing share of the period as the scaling target (`gpu_model.scaling_target`).
The CDK app builds its image with CUDA torch and places its stages on the device
(`ground.placement.GPU`). Expert groups on GPUs and layer stages are planned and priced
(`planner.hardware.gpu_candidates`, `planner.hardware.gpu_stages`) but not deployable: the
driver invokes one expert per function, and no handler runs a range of layers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ground.managed import environment_memory_mb
from ground.plan import (
    DriverPlan,
    ExpertPlan,
    FunctionCapacity,
    LayerPlan,
    Plan,
    Totals,
    TrafficPlan,
)
from ground.topology import topology
from planner.plan_writer import write_plan

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.api import PlanningCounts
    from planner.calibration import Calibration
    from planner.hardware.gpu_model import HardwarePlan, Stream

__all__ = ["plan_document", "plan_traffic_on_hardware"]


def plan_document(
    candidate: HardwarePlan,
    manifest: Manifest,
    counts: PlanningCounts,
    cal: Calibration,
    stream: Stream,
    slo_p99_s: float,
    tokens: int | None = None,
) -> Plan | None:
    """The Plan a deployable GPU candidate deploys as (None: not deployable today); its bill
    per million over `tokens` (default: every request a prompt of the stream's length)."""
    parts = candidate.parts
    if not candidate.feasible or not candidate.detail.get("deployable") or parts is None:
        return None
    layout, request = parts["layout"], parts["request"]
    local = [[int(e) for e in np.flatnonzero(row)] for row in layout.local]
    tokens = stream.prompt_tokens
    share = np.asarray(counts.counts, float) / counts.tokens
    rows = tokens * share
    memory = request.cpu_memory_mb
    layers = []
    for layer, own in enumerate(layout.on_cpu):
        remote = np.flatnonzero(own)
        experts = [
            ExpertPlan(
                expert=slot,
                hosts=[int(e)],
                memory_mb=memory,
                replicas=int(request.cpu_replicas[layer, e]),
                tokens=float(rows[layer, e]),
                time_s=float(request.cpu_run_s[layer, e]),
                cost_usd=float(request.cpu_usd_each[layer, e]),
                max_replicas=int(cal.max_replicas),
                max_tokens_per_replica=max(int(request.cpu_fit[layer, e]), 1),
            )
            for slot, e in enumerate(remote)
        ]
        layers.append(
            LayerPlan(
                layer=layer,
                method="direct",
                beta=1,
                latency_s=float(request.layer_s[layer]),
                cost_usd=float(request.cpu_usd_each[layer].sum()),
                experts=experts,
            )
        )
    detail = candidate.detail
    requests = max(int(stream.arrivals_s.size), 1)
    driver_mb = int(parts["driver_memory_mb"])
    # the driver's host side: a driver with CPU experts, or one function when every expert
    # sits on the GPU (`ground.topology`)
    deployment = "driver" if any(layer.experts for layer in layers) else "monolithic"
    names = topology(deployment).function_names(layers)
    capacity = [
        FunctionCapacity(
            function="driver",
            policy="managed",
            managed_environments=int(detail["driver_environments"]),
            managed_memory_mb=environment_memory_mb(driver_mb, cal.mb_per_vcpu),
            accelerator_memory_gib=int(detail["driver_accelerator_gib"]),
        ),
        *(FunctionCapacity(function=name, policy="none") for name in names[1:]),
    ]
    simulated: dict[str, Any] = {
        "p99_s": candidate.p99_s,
        "bill_usd": round(candidate.bill_usd, 6),
        "per_million_tokens_usd": round(
            candidate.per_million_usd
            if tokens is None
            else candidate.bill_usd / max(tokens, 1) * 1e6,
            6,
        ),
        "hardware": candidate.hardware,
        "gpu": detail.get("gpu"),
        "predicted": "GPU timings from the GPU backend's model, not measured",
    }
    per_request = candidate.bill_usd / requests
    bill = {
        "experts_usd": float(request.cpu_usd),
        "nonmoe_usd": float(detail["pool_usd"]) / requests,
        "requests_usd": 0.0,
        "s3_usd": float(request.s3_usd),
        "workflow_usd": per_request
        - float(request.cpu_usd)
        - float(detail["pool_usd"]) / requests
        - float(request.s3_usd),
        "total_usd": per_request,
    }
    return write_plan(
        manifest,
        cal,
        solver="gpu-lambda",
        workflow="express",
        objective="full",
        nonmoe_memory_mb=driver_mb,
        optimal=None,
        arch="x86_64",
        direct_payload_bytes=int(cal.invoke_payload_bytes),
        counts_source=counts.source,
        layers=layers,
        totals=Totals(
            tokens=tokens,
            moe_cost_usd=float(request.cpu_usd),
            bill_usd=bill,
            latency_s=candidate.latency_s,
            slo_s=None,
        ),
        deployment=deployment,
        driver=DriverPlan(
            local=local,
            local_tokens=[[float(rows[layer, e]) for e in own] for layer, own in enumerate(local)],
            time_s=candidate.latency_s,
            weights_mb=round(float(parts["weights_mb"]), 3),
            activations_mb=round(float(parts["activations_mb"]), 3),
        ),
        traffic=TrafficPlan(
            traffic=stream.source,
            slo_p99_s=slo_p99_s,
            max_batch_tokens=tokens,
            max_wait_s=0.0,
            idle_reclaim_s=float(cal.required("idle_reclaim_s", "a stream's plan").assumed_s),
            capacity=capacity,
            simulated=simulated,
            managed_instance_type=detail["instance_type"],
            managed_instances=int(detail["instances"]),
            managed_target_utilisation=min(1.0, max(float(detail["scaling_target"]), 0.01)),
        ),
    )


def plan_traffic_on_hardware(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    hardware: str,
    traffic: str,
    slo_p99_s: float,
    scale: float = 1.0,
    hours: float | None = None,
    seed: int = 0,
    idle_s: float | None = None,
    options: Any = None,
    status: Any = None,
) -> tuple[Plan, dict[str, Any]]:
    """`plan --traffic --hardware gpu|auto`: the CPU traffic plan (`planner.traffic.api
    .plan_traffic`, with auto) beside the GPU-backed candidates (`planner.hardware
    .gpu_candidates.plan_hardware`, gpu and gpu+cpu) for the same stream and p99 SLO; the
    cheapest meeting it that can run (`planner.hardware.why_not`: a plan document, on kinds
    whose handlers exist and compute the manifest's precision: a CPU row they refuse is not
    planned) is returned with the summary `plan --traffic` prints, plus `hardware`, every
    candidate with why it was not chosen, and `weights`, the precision planned.

    The GPU candidates serve every request as a prompt of the stream's p99 prompt length (their
    queue has one service time), which overstates what the shorter ones cost them.

    Raises:
        UsageError: An unknown hardware.
        InfeasibleError: No deployable candidate meets the SLO; names each one's reason.
    """
    import math
    import time

    from ground.errors import InfeasibleError, UsageError
    from ground.plan import PlanError
    from planner.hardware import AUTO, why_not
    from planner.hardware.catalogue import load_catalogue
    from planner.hardware.gpu_candidates import MIXED, plan_hardware
    from planner.hardware.gpu_model import Stream
    from planner.traffic import load_arrivals
    from planner.traffic.api import plan_traffic

    started = time.perf_counter()
    if hardware not in ("gpu", AUTO):
        raise UsageError(f"--hardware {hardware!r} is not gpu or auto.", "pass cpu, gpu or auto.")
    rows: dict[str, dict[str, Any]] = {}
    cpu: tuple[Plan, dict[str, Any]] | None = None
    weights = manifest.precision
    arch = getattr(options, "arch", "x86_64")
    cpu_blocked = why_not("cpu", weights, calibration, arch)
    if hardware == AUTO and cpu_blocked is not None:  # refused: not planned for the stream
        rows["cpu"] = {
            "hardware": "cpu", "feasible": False, "deployable": False, "reason": cpu_blocked,
            "not_chosen_because": cpu_blocked,
        }  # fmt: skip
    elif hardware == AUTO:
        try:
            choice, summary = plan_traffic(
                manifest, counts, calibration, traffic=traffic, slo_p99_s=slo_p99_s,
                scale=scale, hours=hours, seed=seed, idle_s=idle_s, options=options,
                **({} if status is None else {"status": status}),
            )  # fmt: skip
            cpu = (choice.plan, summary)
            rows["cpu"] = {
                "hardware": "cpu", "feasible": True, "deployable": True, "reason": None,
                "p99_s": summary["latency_s"]["p99"],
                "bill_usd": summary["bill_usd"]["total_usd"],
                "per_million_tokens_usd": summary["bill_usd"]["per_million_tokens_usd"],
                "shape": summary["deployment"], "capacity": summary["capacity"],
            }  # fmt: skip
        except (InfeasibleError, PlanError) as err:  # none meets the SLO, or the quota
            rows["cpu"] = {"hardware": "cpu", "feasible": False, "reason": err.problem}
    arrivals = load_arrivals(traffic, scale=scale, hours=hours, seed=seed)
    prompt = (
        max(1, math.ceil(float(np.quantile(arrivals.tokens, 0.99)))) if arrivals.requests else 1
    )
    stream = Stream(arrivals.times_s, arrivals.period_s, prompt, arrivals.describe())
    gpu = plan_hardware(
        manifest, counts, calibration, load_catalogue(), stream, slo_s=slo_p99_s,
        hardware=("gpu", MIXED),
    )  # fmt: skip
    tokens = arrivals.total_tokens  # the stream's own, not the p99 prompts it was sized for
    documents = {
        h: plan_document(c, manifest, counts, calibration, stream, slo_p99_s, tokens)
        for h, c in gpu.items()
    }
    for h, c in gpu.items():
        blocked = why_not(h, weights, calibration) or (
            None if documents[h] is not None else "planned, not deployable"
        )
        rows[h] = c.describe() | {"deployable": blocked is None, "not_chosen_because": blocked}
        if c.feasible:
            rows[h]["per_million_tokens_usd"] = round(c.bill_usd / max(tokens, 1) * 1e6, 4)
    deployable = {
        h: r["bill_usd"] for h, r in rows.items() if r.get("feasible") and r.get("deployable")
    }
    if not deployable:
        raise InfeasibleError(
            f"no deployable CPU or GPU-backed plan meets the p99 SLO of {slo_p99_s:g} s ("
            + "; ".join(
                f"{h}: {r.get('reason') or r.get('not_chosen_because')}" for h, r in rows.items()
            )
            + ").",
            "raise --slo-p99"
            + (", or pass --hardware auto (CPU functions run today)." if hardware != AUTO else ".")
            + (
                f" The {weights.label()} weights refuse some kinds: pass --weights fp32 (every "
                "kind runs it), int8 (CPU functions) or bf16 (GPU-backed ones)."
                if any(why_not(h, weights, calibration, arch) for h in rows)
                else ""
            ),
        )
    chosen = min(deployable, key=deployable.__getitem__)
    if chosen == "cpu":
        assert cpu is not None
        return _with_rows(cpu[0], rows, chosen), cpu[1] | {
            "hardware": rows,
            "hardware_chosen": chosen,
        }
    plan = _with_rows(documents[chosen], rows, chosen)
    quota = getattr(options, "concurrency_quota", None)
    if quota is not None:  # checked and recorded, as a CPU plan's is: synth reads it back
        plan = plan.within_concurrency_quota(quota)
    assert plan.traffic is not None
    c = gpu[chosen]
    summary = {
        "weights": weights.label(),
        "weights_note": None,
        "traffic": arrivals.describe(),
        "slo_p99_s": slo_p99_s,
        "max_batch_tokens": plan.traffic.max_batch_tokens,
        "max_wait_s": 0.0,
        "capacity": f"{c.detail['instances']} x {c.detail['instance_type']} (GPU-backed, "
        f"{c.detail['driver_environments']} driver environments of "
        f"{c.detail['driver_accelerator_gib']} GiB)",
        "capacity_per_function": [
            x.model_dump() for x in plan.traffic.capacity if x.policy != "none"
        ],
        "latency_s": {"p99": c.p99_s},
        "bill_usd": {
            "total_usd": c.bill_usd,
            "per_million_tokens_usd": c.bill_usd / max(tokens, 1) * 1e6,
        },
        "notes": [
            f"GPU timings predicted by the GPU backend's model, not measured; every request "
            f"planned as a {prompt:,}-token prompt (the stream's p99)"
        ],
        "tokens_per_batch_planned": prompt,
        "batch_latency_s": c.latency_s,
        "candidates": len(rows),
        "seconds": round(time.perf_counter() - started, 3),
        "deployment": plan.deployment,
        "hardware": rows,
        "hardware_chosen": chosen,
    }
    return plan, summary


def _with_rows(plan: Plan | None, rows: dict[str, dict[str, Any]], chosen: str) -> Plan:
    """`plan` with every hardware candidate weighed for the stream, and which won, in its
    traffic block's `simulated` (the plan's JSON says why it won, as `candidates` does for
    the shapes of one batch)."""
    assert plan is not None and plan.traffic is not None
    simulated = plan.traffic.simulated | {"hardware": rows, "hardware_chosen": chosen}
    traffic = plan.traffic.model_copy(update={"simulated": simulated})
    return Plan.model_validate(plan.model_dump() | {"traffic": traffic.model_dump()})
