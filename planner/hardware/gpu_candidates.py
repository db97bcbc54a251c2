"""The GPU-backed candidates of a stream: every layout, accelerator size and GPU type priced.

`plan_hardware` weighs, for a stream of prompts under a p99 SLO, the candidates on the hardware
kinds (`planner.hardware`): "cpu" (the CPU planner's cheapest deployment, `cpu_plan`), "gpu" (a
GPU driver with GPU expert groups, or a chain of GPU layer stages, `planner.hardware.gpu_stages`)
and "gpu+cpu" (a GPU driver whose long tail of experts runs on CPU functions). Each is timed and
billed by the one GPU Lambda model (`planner.hardware.gpu_model`), every function's weights
bounded by the smaller of its accelerator size and what the GPU type's device exposes
(`detail["gpu_usable_gib"]`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import InfeasibleError, UsageError
from planner.hardware import candidate_name
from planner.hardware.gpu_model import (
    DRIVER_VCPUS,
    GROUP_BUSY,
    GROUP_VCPUS,
    MIXED_SHARES,
    GpuSpeed,
    HardwarePlan,
    Stream,
    _fewest_servers,
    _Layout,
    _layout,
    _Model,
    _request,
    activations_gib,
    express_usd,
    front_door,
    host_memory_mb,
    runtime_gib,
    scaling_target,
)
from planner.hardware.gpu_stages import stages_candidate

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.api import PlanningCounts
    from planner.calibration import Calibration
    from planner.hardware.catalogue import Catalogue
    from planner.traffic.managed import InstanceChoice, ManagedPrices

__all__ = ["HARDWARE", "cpu_plan", "plan_hardware"]

# The candidates `plan_hardware` weighs, by the kinds their functions run on.
MIXED = candidate_name(("gpu", "cpu"))  # a GPU driver, its long tail on CPU functions
HARDWARE = ("cpu", "gpu", MIXED)


def _gpu_candidate(
    model: _Model,
    layout: _Layout,
    speed: GpuSpeed,
    prices: ManagedPrices,
    cal: Calibration,
    stream: Stream,
    slo_s: float,
    hardware: str,
    door: tuple[float, float],
) -> HardwarePlan:
    """One driver layout's candidate; `door` the stream's front door (`front_door`: USD over
    the period, p99 wait), simulated once per stream."""
    req = _request(model, layout, speed, cal, stream.prompt_tokens)
    door_usd, door_s = door
    served = _fewest_servers(stream, req.latency_s, slo_s - door_s)
    monolithic = bool(layout.local.all())
    detail: dict[str, Any] = {
        "shape": "monolithic" if monolithic else "driver",
        # the driver invokes one expert per remote function (groups would need packing there)
        "deployable": not layout.on_gpu_group.any(),
        "driver_accelerator_gib": layout.driver_gib,
        "local_experts": int(layout.local.sum()),
        "gpu_group_experts": int(layout.on_gpu_group.sum()),
        "cpu_experts": int(layout.on_cpu.sum()),
        "group_accelerator_gib": sorted({int(g) for g in layout.group_gib if g}),
        "load_s": {
            "driver": round(req.load_s["driver"], 1),
            "slowest_group": round(
                max((v for k, v in req.load_s.items() if k != "driver"), default=0.0), 1
            ),
        },
    }
    if served is None:
        return HardwarePlan(
            hardware,
            False,
            f"a warm request takes {req.latency_s:.1f} s, over the SLO",
            req.latency_s,
            None,
            math.inf,
            math.inf,
            detail,
        )
    servers, p99 = served[0], served[1] + door_s
    rate = stream.rate
    group_envs = np.where(
        req.group_replicas > 0,
        req.group_replicas
        * np.minimum(servers, np.maximum(1, np.ceil(rate * req.group_busy_s / GROUP_BUSY))),
        0,
    ).astype(np.int64)
    used = np.flatnonzero(group_envs)
    layers = np.arange(model.layer_params.size)
    driver_mb = host_memory_mb(
        model, cal, DRIVER_VCPUS, layout.local, layers >= 0, head=True, tail=True
    )
    groups_mb = [
        host_memory_mb(model, cal, GROUP_VCPUS, layout.on_gpu_group & (layers == i)[:, None])
        for i in used
    ]
    memory_mb = np.array([driver_mb, *groups_mb])
    environments = np.array([servers, *group_envs[used]], dtype=np.int64)
    accelerator = np.array([layout.driver_gib, *layout.group_gib[used]], dtype=np.int64)
    choice: InstanceChoice | None = prices.choose(memory_mb, environments, accelerator)
    if choice is None:
        return HardwarePlan(
            hardware,
            False,
            "no GPU instance type holds the largest environment",
            req.latency_s,
            p99,
            math.inf,
            math.inf,
            detail,
        )
    requests = stream.arrivals_s.size
    invokes = requests * (1 + int(req.group_replicas.sum()))
    pool = prices.bill_usd(choice, stream.period_s, invokes)
    express = requests * (cal.express_request_usd + express_usd(cal, req.latency_s))
    bill = pool + requests * (req.cpu_usd + req.s3_usd) + express + door_usd
    tokens = requests * stream.prompt_tokens
    detail.update(
        {
            "instance_type": choice.instance_type,
            "instances": choice.instances,
            "driver_environments": servers,
            "group_environments": int(group_envs.sum()),
            "scaling_target": scaling_target(requests, req.gpu_s, servers, stream.period_s),
            "pool_usd": round(pool, 6),
            "cpu_functions_usd": round(requests * req.cpu_usd, 6),
            "front_door_usd": round(door_usd, 6),
        }
    )
    parts = {
        "layout": layout,
        "request": req,
        "driver_memory_mb": driver_mb,
        "weights_mb": req.load_s["driver"] * cal.s3_bandwidth_bytes_per_s / 2**20,
        "activations_mb": activations_gib(model, stream.prompt_tokens, cal) * 1024,
    }
    return HardwarePlan(
        hardware, True, None, req.latency_s, p99, bill, bill / tokens * 1e6, detail, parts
    )


def cpu_plan(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    slo_s: float,
    prompt_tokens: int,
    concurrency_quota: int = 100_000,
) -> tuple[Plan, str | None]:
    """The CPU planner's cheapest deployment of one prompt within the SLO (every shape:
    `planner.api.plan_deployment`), or, when none meets it warm, its cheapest plan and why.
    A shape's counts are drawn again for a batch of `prompt_tokens`."""
    from planner.api import PlanOptions, plan_deployment, shape_counts_for_plan

    shape = counts.source.get("shape")
    planning = (
        shape_counts_for_plan(
            shape,
            counts.source.get("popularity", "zipf:1.0"),
            tokens=prompt_tokens,
            weights=manifest.precision,
        )
        if shape is not None
        else counts
    )
    options = PlanOptions(concurrency_quota=concurrency_quota, confidence=0.0)
    try:
        return plan_deployment(
            manifest, planning, calibration, slo_s=slo_s, options=options
        ).plan, None
    except InfeasibleError as err:
        reason = str(err).splitlines()[0]
        planned = plan_deployment(manifest, planning, calibration, slo_s=None, options=options)
        return planned.plan, reason


def _cpu_candidate(
    plan: Plan, why: str | None, cal: Calibration, stream: Stream, slo_s: float
) -> HardwarePlan:
    """The CPU plan over the stream as `plan --traffic` plans it (`planner.traffic.planning
    .plan_for_traffic`, its batch fixed at one prompt): with no capacity policy, warmers,
    provisioned concurrency or Managed Instances on CPUs, each simulated over the stream (cold
    starts, INIT billed, idle reclaim at the assumed time and at the low end of its range), the
    cheapest meeting the p99 SLO; else the best it found and why none meets it."""
    from planner.traffic import simulate_plan
    from planner.traffic.planning import plan_for_traffic
    from planner.traffic.spec import Arrivals

    n = stream.arrivals_s.size
    tokens = max(n * stream.prompt_tokens, 1)
    arrivals = Arrivals(
        stream.arrivals_s, np.full(n, stream.prompt_tokens), stream.period_s, stream.source
    )
    detail: dict[str, Any] = {"shape": plan.deployment, "deployable": True}
    if why is None:

        def plan_at(_tokens: int, budget_s: float) -> Plan:
            if plan.totals.latency_s > budget_s:
                raise InfeasibleError(f"the CPU plan takes {plan.totals.latency_s:.1f} s", "")
            return plan

        try:
            choice = plan_for_traffic(
                plan_at,
                arrivals,
                slo_s,
                cal,
                plan.arch,
                caps=(stream.prompt_tokens,),
                waits=(0.0,),
            )
        except InfeasibleError as err:
            why = str(err).splitlines()[0]
            best = re.search(r"the best p99 is ([0-9.]+) s", why)  # plan_for_traffic's words
            detail["best_p99_s"] = float(best.group(1)) if best else None
        else:
            result = choice.result
            bill = float(result.bill_usd["total_usd"])
            detail |= {
                "capacity": choice.plan.traffic.simulated["capacity"]
                if choice.plan.traffic
                else None,
                "cold_starts": int(sum(result.cold_starts.values())),
                "managed_instances": result.managed or None,
            }
            return HardwarePlan(
                "cpu", True, None, plan.totals.latency_s, result.quantiles()["p99"], bill,
                bill / tokens * 1e6, detail,
            )  # fmt: skip
    report = simulate_plan(plan, arrivals, slo_s=slo_s, calibration=cal, reserve=False)
    p99 = report["latency_s"]["p99"]
    bill = float(report["bill_usd"]["total_usd"])
    detail |= {"capacity": "none", "cold_starts": report["cold_starts"]["count"]}
    return HardwarePlan(
        "cpu", False, why, plan.totals.latency_s, p99, bill, bill / tokens * 1e6, detail
    )


def plan_hardware(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    catalogue: Catalogue,
    stream: Stream,
    *,
    slo_s: float,
    hardware: Sequence[str] = HARDWARE,
    cpu: tuple[Plan, str | None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, HardwarePlan]:
    """The cheapest plan meeting the p99 SLO on each hardware (see the module docstring): for
    gpu and gpu+cpu every driver accelerator size, every GPU type the calibration prices, and
    for gpu+cpu every popular share in `MIXED_SHARES`; for gpu also the chain of layer stages
    (`planner.hardware.gpu_stages`); for cpu `cpu` (from `cpu_plan`, made here when None)
    simulated over the stream. Infeasible ones say why.

    Raises:
        UsageError: An unknown hardware, or a calibration without GPU instance types or
            accelerator sizes (it names the keys to add).
    """
    from planner.traffic.managed import managed_prices

    say = progress or (lambda _: None)
    unknown = sorted(set(hardware) - set(HARDWARE))
    if unknown:
        raise UsageError(f"unknown hardware {unknown}.", f"pass one of {', '.join(HARDWARE)}.")
    sizes = calibration.lambda_accelerator_memory_gib
    prices = managed_prices(calibration, "x86_64", accelerated=True)
    if any(h != "cpu" for h in hardware) and (not sizes or prices is None):
        raise UsageError(
            "the calibration has no GPU-backed Lambda: it lacks lambda_accelerator_memory_gib "
            "or GPU instance types in ec2_instance_prices.",
            "use the packaged calibration, or add both with their sources.",
        )
    model = _Model.of(manifest, counts)
    door = front_door(calibration, stream) if any(h != "cpu" for h in hardware) else (0.0, 0.0)
    out: dict[str, HardwarePlan] = {}
    for kind in hardware:
        say(f"{manifest.model}: {kind} at {stream.rate:.4g} requests/s")
        if kind == "cpu":
            made = cpu or cpu_plan(
                manifest, counts, calibration, slo_s=slo_s, prompt_tokens=stream.prompt_tokens
            )
            out[kind] = _cpu_candidate(*made, calibration, stream, slo_s)
            continue
        shares = (1.0,) if kind == "gpu" else MIXED_SHARES
        best: HardwarePlan | None = None
        reasons: list[str] = []
        for gpu_name in sorted({t.gpu for t in prices.gpu_types if t.gpu}):
            speed = GpuSpeed.of(catalogue, gpu_name)
            pool = replace(prices, types=tuple(t for t in prices.types if t.gpu == gpu_name))
            # sizes the type's GPUs hold as AWS counts them; their room is at most what the
            # device exposes (`GpuSpeed.room_gib`)
            largest = max(t.gpu_memory_gib for t in pool.types)
            fitting = [size for size in sizes if size <= largest + 1e-9]
            peak = activations_gib(model, stream.prompt_tokens, calibration)
            runtime = runtime_gib(calibration)
            for size in fitting:
                for share in shares:
                    layout = _layout(model, speed, fitting, size, share, peak, runtime)
                    if isinstance(layout, str):
                        reasons.append(layout)
                        continue
                    if kind == MIXED and not layout.on_cpu.any():
                        reasons.append(
                            f"a {size}-GiB GPU driver holds every expert: none is left for CPU "
                            "functions"
                        )
                        continue
                    plan = _gpu_candidate(
                        model, layout, speed, pool, calibration, stream, slo_s, kind, door
                    )
                    plan.detail["gpu"] = gpu_name
                    plan.detail["gpu_usable_gib"] = round(speed.usable_gib, 2)
                    plan.detail["gpu_share_of_remote"] = share
                    best = _keep(plan, best, reasons)
            if kind == "gpu":
                staged = stages_candidate(
                    model, speed, pool, calibration, stream, slo_s, fitting, door
                )
                staged.detail["gpu"] = gpu_name
                staged.detail["gpu_usable_gib"] = round(speed.usable_gib, 2)
                best = _keep(staged, best, reasons)
        if best is None:
            best = HardwarePlan(
                kind,
                False,
                reasons[0] if reasons else "no layout",
                math.inf,
                None,
                math.inf,
                math.inf,
                {},
            )
        out[kind] = best
    return out


def _keep(plan: HardwarePlan, best: HardwarePlan | None, reasons: list[str]) -> HardwarePlan:
    """The better of `plan` and `best`, noting why `plan` is infeasible."""
    if not plan.feasible:
        reasons.append(plan.reason or "")
    return plan if best is None or _better(plan, best) else best


def _better(plan: HardwarePlan, best: HardwarePlan) -> bool:
    """Feasible first, then one the handlers deploy (`detail["deployable"]`: no expert group,
    no layer stage), then the cheaper; among infeasible ones the faster. A kind's best is so
    the cheapest plan that can run, and a shape without a handler is its best only where no
    deployable one meets the SLO (reported, never chosen)."""
    if plan.feasible != best.feasible:
        return plan.feasible
    if not plan.feasible:
        return plan.latency_s < best.latency_s
    runs, best_runs = (bool(p.detail.get("deployable")) for p in (plan, best))
    if runs != best_runs:
        return runs
    return plan.bill_usd < best.bill_usd
