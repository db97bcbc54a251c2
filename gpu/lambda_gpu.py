"""GPU-backed Lambda functions (Managed Instances with accelerators) planned against CPU functions.

A Lambda function on a Managed Instances capacity provider may hold GPU memory
(`AcceleratorConfig.AcceleratorMemorySize`, one of the calibration's
`lambda_accelerator_memory_gib`); the provider runs GPU instances (the calibration's
`ec2_instance_prices` entries with GPUs) and bills them by the hour like a CPU pool
(`planner.traffic.managed`: instances x hours x price x (1 + fee), plus a request charge).
This module plans a driver deployment (`ground.driver`: a driver function runs the non-MoE stack
and its local experts and invokes the rest) where each function is a CPU function or a GPU one,
for a stream of prompts of `prompt_tokens` tokens under a p99 latency SLO:

* **gpu**: a GPU driver of accelerator size A holds the non-MoE stack and the most popular
  experts that fit (Lina's popularity-based placement, `gpu.lina`: the hot experts where the
  tokens are); each layer's other experts share one GPU expert-group function of the smallest
  size that holds them (one function hosting several experts of a layer).
* **mixed**: the same GPU driver; of each layer's remote experts the most popular fraction `q`
  in a GPU group, the long tail on CPU Lambda functions that bill nothing idle (Remoe's split).
* **cpu**: the CPU planner's cheapest deployment of one prompt (`planner.api.plan_deployment`:
  one function, a driver, the fan-out workflow), planned for the stream as `plan --traffic`
  plans it (no capacity policy, warmers, provisioned concurrency or CPU Managed Instances).

The gpu hardware also weighs a chain of layer stages (`gpu.lambda_stages`), for models larger
than one accelerator. Expert groups and stages are planned and priced, not deployable yet
(`gpu.lambda_plan` writes the rest as a Plan).

Compute on a GPU is the GPU backend's per-token model (`gpu.estimate`, its speeds in
gpu/data/catalogue.json): a stage of p parameters on n tokens takes
max(2 p n / (peak x mfu), 2 p / memory bandwidth) + kernel_s (bf16 weights, read once per call).
An environment holds one whole GPU (`planner.traffic.managed`: AWS exposes accelerator devices
to an environment, not shares of one), so it computes at the whole GPU's speed and asks for
the smallest AcceleratorMemorySize that holds its weights. These timings are predicted, not
measured: `scripts/gpu-lambda-timing.py` times them on a GPU where one is present.

A request's latency (warm, seconds), as the CPU driver model counts it (`planner.driver`):
T^str, the input's read, per layer the layer stage on the GPU then the slowest of the local
experts (in turn, on the GPU) and the remote calls (all at once; a call's rows are split over
replicas so that each event fits the Invoke payload limit, each replica timed by the one rule
`ground.driver.remote_call_s`: the round trip `invoke_round_trip_s`, its rows in and out at
B^f and its compute), then the tail and the
output's write. Transfers use the calibration's Lambda bandwidths for GPU functions too.

The pool. Every request is the same size, so the driver is a c-server FCFS queue with a constant
service time S: request i starts when request i - c ends (or on arrival), so each residue class
mod c is a one-server queue, start_j = S j + max over k <= j of (a_k - S k) (a cumulative
maximum, vectorised). The driver gets the fewest environments whose p99 latency meets the SLO
over the stream; a layer's group gets its replicas times the calls in flight at a 50 % busy
share (Little's law; their queueing is not simulated). The environments are packed onto the
cheapest GPU instance type (`ManagedPrices.choose`), at least the provider's default instances,
for the whole period: nothing is billed for capacity the plan did not choose, and the pool's
busy share is the scaling target the plan reports. A new environment loads its weights from S3
at B^s before it serves (`load_s`, its cold start): the fixed pool is started before traffic.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.driver import layer_seconds, remote_call_s
from ground.errors import InfeasibleError, UsageError
from ground.semantics import direct_event_bytes

if TYPE_CHECKING:
    from gpu.cluster import Catalogue
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.api import PlanningCounts
    from planner.calibration import Calibration
    from planner.traffic.managed import InstanceChoice, ManagedPrices

__all__ = [
    "HARDWARE",
    "GpuSpeed",
    "HardwarePlan",
    "Stream",
    "activations_gib",
    "cpu_plan",
    "driver_servers",
    "express_usd",
    "plan_hardware",
    "runtime_gib",
]

HARDWARE = ("cpu", "gpu", "mixed")
BF16 = 2  # bytes per weight on a GPU
GROUP_BUSY = 0.5  # a group's environments are sized to be busy at most half the time
# The popular share of each layer's remote experts a mixed plan puts on a GPU group.
MIXED_SHARES = (0.0, 0.25, 0.5, 0.75)
DRIVER_VCPUS = 2  # a GPU driver's host side: tokenising, S3 and Invoke I/O
GROUP_VCPUS = 1


@dataclass(frozen=True)
class GpuSpeed:
    """One GPU type's speed from the GPU backend's catalogue."""

    name: str
    flops: float  # FLOP/s at the catalogue's mfu
    bytes_per_s: float  # memory bandwidth
    kernel_s: float

    @classmethod
    def of(cls, catalogue: Catalogue, name: str) -> GpuSpeed:
        gpu = catalogue.get(name)
        if gpu.memory_gbps is None:
            raise UsageError(
                f"the GPU catalogue gives {name} no memory bandwidth.",
                "add memory_gbps to its entry in gpu/data/catalogue.json.",
            )
        return cls(name, gpu.flops(catalogue.mfu), gpu.memory_gbps * 1e9, catalogue.kernel_s)

    def seconds(self, params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Seconds of stages of `params` parameters on `tokens` tokens each (0 where a stage
        gets no token)."""
        params, tokens = np.broadcast_arrays(np.asarray(params, float), np.asarray(tokens, float))
        compute = 2.0 * params * tokens / self.flops
        read = BF16 * params / self.bytes_per_s
        return np.where(tokens > 0, np.maximum(compute, read) + self.kernel_s, 0.0)


@dataclass(frozen=True)
class Stream:
    """The requests: arrival times (s) over a period, every one a prompt of `prompt_tokens`."""

    arrivals_s: np.ndarray
    period_s: float
    prompt_tokens: int
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.arrivals_s.size / self.period_s


@dataclass(frozen=True, eq=False)
class _Model:
    """The model's sizes and predicted routing, in the units the formulas use."""

    hidden: int
    nonmoe_params: float  # every layer stage
    layer_params: np.ndarray  # (L,)
    tail_params: float
    head_bytes: float
    expert_params: np.ndarray  # (L, E)
    share: np.ndarray  # (L, E) rows per token routed to each expert
    token_bytes: int  # a hidden state on the wire (float32)
    token_bytes_out: int  # one token of the model's output

    @classmethod
    def of(cls, manifest: Manifest, counts: PlanningCounts) -> _Model:
        width = manifest.dtype_bytes
        layers = np.zeros(manifest.num_layers)
        experts = np.zeros((manifest.num_layers, manifest.experts))
        tail = head = 0.0
        for stage in manifest.stages:
            if stage.role == "layer":
                layers[stage.layer] = stage.bytes / width
            elif stage.role == "expert":
                experts[stage.layer, stage.expert] = stage.bytes / width
            elif stage.role == "tail":
                tail = stage.bytes / width
            else:
                head += stage.bytes / width
        return cls(
            manifest.hidden_size,
            float(layers.sum() + tail + head),
            layers,
            tail,
            head * BF16,
            experts,
            np.asarray(counts.counts, float) / counts.tokens,
            max(manifest.token_bytes_in, manifest.token_bytes_out),
            manifest.token_bytes_out,
        )

    @property
    def nonmoe_gib(self) -> float:
        return self.nonmoe_params * BF16 / 2**30


@dataclass(frozen=True, eq=False)
class HardwarePlan:
    """One candidate: where each function runs, its predicted latency, pool and bill."""

    hardware: str
    feasible: bool
    reason: str | None
    latency_s: float  # one warm request
    p99_s: float | None
    bill_usd: float  # over the period
    per_million_usd: float
    detail: dict[str, Any]
    # what `gpu.lambda_plan.plan_document` writes a deployable one from (not reported)
    parts: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        """The JSON row of a report (None for what an infeasible candidate does not have)."""

        def finite(value: float | None, digits: int) -> float | None:
            return None if value is None or not math.isfinite(value) else round(value, digits)

        return {
            "hardware": self.hardware,
            "feasible": self.feasible,
            "reason": self.reason,
            "latency_s": finite(self.latency_s, 4),
            "p99_s": finite(self.p99_s, 4),
            "bill_usd": finite(self.bill_usd, 6),
            "per_million_tokens_usd": finite(self.per_million_usd, 4),
            **self.detail,
        }


def driver_servers(arrivals_s: np.ndarray, service_s: float, servers: int) -> np.ndarray:
    """Each request's latency through `servers` FCFS servers of constant service `service_s`
    (see the module docstring: per residue class a cumulative maximum)."""
    latency = np.empty_like(arrivals_s)
    for r in range(min(servers, arrivals_s.size)):
        a = arrivals_s[r::servers]
        steps = service_s * np.arange(a.size)
        start = steps + np.maximum.accumulate(a - steps)
        latency[r::servers] = start - a + service_s
    return latency


def _fewest_servers(stream: Stream, service_s: float, slo_s: float) -> tuple[int, float] | None:
    """The fewest driver environments whose p99 latency meets the SLO, and that p99."""
    if service_s > slo_s or stream.arrivals_s.size == 0:
        return (1, service_s) if service_s <= slo_s else None
    low = max(1, math.ceil(stream.rate * service_s))
    for servers in range(low, low + 10_000):
        p99 = float(np.quantile(driver_servers(stream.arrivals_s, service_s, servers), 0.99))
        if p99 <= slo_s:
            return servers, p99
    return None


@dataclass(frozen=True, eq=False)
class _Layout:
    """Where each expert runs: in the driver, its layer's GPU group, or a CPU function."""

    driver_gib: int
    local: np.ndarray  # (L, E) bool
    on_gpu_group: np.ndarray  # (L, E) bool
    on_cpu: np.ndarray  # (L, E) bool
    group_gib: np.ndarray  # (L,) int, 0: no group


def _smallest_size(sizes: Sequence[int], gib: float) -> int | None:
    return next((s for s in sizes if s >= gib), None)


def activations_gib(model: _Model, tokens: int, cal: Calibration) -> float:
    """A batch's float32 tensors at their peak in a GPU function: the calibration's
    `driver_activation_states` hidden-state-sized tensors per token, as in a CPU driver."""
    states = cal.required("driver_activation_states", "sizing a GPU function's activations")
    return tokens * model.hidden * 4 * states / 2**30


def runtime_gib(cal: Calibration) -> float:
    """What a GPU environment's accelerator memory holds before any weight (calibration)."""
    if cal.gpu_runtime_gib is None:
        raise UsageError(
            "the calibration has no gpu_runtime_gib, the accelerator memory a GPU-backed "
            "function's runtime takes.",
            "use the packaged calibration, or add it with its source.",
        )
    return cal.gpu_runtime_gib


def _layout(
    model: _Model,
    sizes: Sequence[int],
    driver_gib: int,
    gpu_share: float,
    activations: float,
    runtime: float,
) -> _Layout | str:
    """The driver of `driver_gib` with the most popular experts that fit; of each layer's
    others the popular `gpu_share` on a GPU group, the rest on CPU. A string says why none."""
    room = driver_gib - runtime - model.nonmoe_gib - activations
    if room < 0:
        return (
            f"the non-MoE stack ({model.nonmoe_gib:.1f} GiB) does not fit a {driver_gib}-GiB "
            "accelerator"
        )
    gib = model.expert_params * BF16 / 2**30
    order = np.argsort(-model.share, axis=None, kind="stable")  # hottest first, every layer
    taken = np.cumsum(gib.reshape(-1)[order]) <= room + 1e-9
    local = np.zeros(gib.size, bool)
    local[order[taken]] = True
    local = local.reshape(gib.shape)
    remote = ~local
    on_gpu = np.zeros_like(local)
    for layer in range(gib.shape[0]):
        rest = np.flatnonzero(remote[layer])
        rest = rest[np.argsort(-model.share[layer, rest], kind="stable")]
        on_gpu[layer, rest[: round(gpu_share * rest.size)]] = True
    group_gib = np.zeros(gib.shape[0], int)
    for layer in range(gib.shape[0]):
        held = float(gib[layer, on_gpu[layer]].sum())
        if held:
            size = _smallest_size(sizes, held + runtime)
            if size is None:
                return (
                    f"layer {layer}'s remote experts ({held:.1f} GiB) exceed Lambda's largest "
                    f"accelerator ({max(sizes)} GiB)"
                )
            group_gib[layer] = size
    return _Layout(driver_gib, local, on_gpu, remote & ~on_gpu, group_gib)


@dataclass(frozen=True)
class _Request:
    """One warm request through a layout: its latency and what each part is busy or billed."""

    latency_s: float
    layer_s: np.ndarray  # (L,) each layer's time in the driver
    group_busy_s: np.ndarray  # (L,) per replica
    group_replicas: np.ndarray  # (L,)
    cpu_replicas: np.ndarray  # (L, E) calls to each CPU expert (0: not on a CPU function)
    cpu_run_s: np.ndarray  # (L, E) billed seconds of one of them
    cpu_usd_each: np.ndarray  # (L, E) its replicas' GB-s and requests
    rows_per_call: int  # the most rows one call's event carries
    s3_usd: float
    load_s: dict[str, float]

    @property
    def cpu_usd(self) -> float:
        """The CPU functions' GB-s and requests of one request."""
        return float(self.cpu_usd_each.sum())


def rows_per_call(token_bytes: int, limit: int) -> int:
    """The most rows a direct Invoke's event carries within `limit` bytes."""
    one = int(direct_event_bytes(1, token_bytes))
    return max(1, int((limit - one) // (4 * token_bytes / 3)) + 1)


def _calls(model: _Model, rows: np.ndarray, limit: int) -> np.ndarray:
    """Replicas a call of `rows` rows needs so that each event fits the Invoke limit."""
    rows = np.ceil(rows).astype(np.int64)
    return np.maximum(1, -(-rows // rows_per_call(model.token_bytes, limit)))


def _request(
    model: _Model, layout: _Layout, speed: GpuSpeed, cal: Calibration, tokens: int
) -> _Request:
    n = float(tokens)
    bf = cal.invoke_bandwidth_bytes_per_s
    trip = cal.required("invoke_round_trip_s", "pricing a GPU driver's remote calls")
    rows = n * model.share  # (L, E)
    nonmoe = speed.seconds(model.layer_params, np.full_like(model.layer_params, n))
    local = np.where(layout.local, speed.seconds(model.expert_params, rows), 0.0).sum(axis=1)
    # GPU groups: one call per layer, split over replicas to fit the payload limit
    group_rows = np.where(layout.on_gpu_group, rows, 0.0).sum(axis=1)
    replicas = np.where(group_rows > 0, _calls(model, group_rows, cal.invoke_payload_bytes), 0)
    per_rep = group_rows / np.maximum(replicas, 1)
    group_compute = np.array(
        [
            float(
                speed.seconds(
                    model.expert_params[layer, layout.on_gpu_group[layer]],
                    rows[layer, layout.on_gpu_group[layer]] / max(replicas[layer], 1),
                ).sum()
            )
            for layer in range(rows.shape[0])
        ]
    )
    group_s = np.where(
        group_rows > 0, remote_call_s(trip, per_rep, 2 * model.token_bytes, bf, group_compute), 0.0
    )
    # CPU functions: each expert its own, at Lambda's largest memory (the fastest)
    from planner.compute import compute_s_at

    memory = float(cal.lambda_max_memory_mb)
    cpu_rows = np.where(layout.on_cpu, rows, 0.0)
    cpu_reps = np.where(cpu_rows > 0, _calls(model, cpu_rows, cal.invoke_payload_bytes), 0)
    per_cpu = cpu_rows / np.maximum(cpu_reps, 1)
    per_token = compute_s_at(cal, 2.0 * model.expert_params.mean(), memory)
    cpu_run = np.where(
        cpu_rows > 0, cal.warm_start_s + per_cpu * (float(per_token) + model.token_bytes / bf), 0.0
    )
    cpu_s = np.where(
        cpu_rows > 0,
        remote_call_s(trip, per_cpu, 2 * model.token_bytes, bf, per_cpu * per_token),
        0.0,
    )
    layer_s = nonmoe + layer_seconds(local, np.maximum(group_s, cpu_s.max(axis=1)))
    tail = float(speed.seconds(np.array(model.tail_params), np.array(n)))
    io = 2 * cal.s3_access_delay_s + n * (8 + model.token_bytes_out) / cal.s3_bandwidth_bytes_per_s
    latency = cal.warm_start_s + io + float(layer_s.sum()) + tail
    price = cal.lambda_prices["x86_64"]
    billed = np.ceil(cpu_run / cal.billing_granularity_s) * cal.billing_granularity_s
    gb_s = cpu_reps * billed * memory / cal.billing_mb_per_gb
    cpu_usd = gb_s * price.gb_second_usd + cpu_reps * price.request_usd
    s3_usd = cal.s3_get_request_usd + cal.s3_put_request_usd
    driver_bytes = model.nonmoe_params * BF16 + float(
        (model.expert_params * layout.local).sum() * BF16
    )
    load = {"driver": driver_bytes / cal.s3_bandwidth_bytes_per_s}
    for layer in np.flatnonzero(layout.group_gib):
        held = float(model.expert_params[layer, layout.on_gpu_group[layer]].sum()) * BF16
        load[f"group{layer:02d}"] = held / cal.s3_bandwidth_bytes_per_s
    limit = rows_per_call(model.token_bytes, cal.invoke_payload_bytes)
    return _Request(
        latency, layer_s, group_s, replicas, cpu_reps, cpu_run, cpu_usd, limit, s3_usd, load
    )


def _gpu_candidate(
    model: _Model,
    layout: _Layout,
    speed: GpuSpeed,
    prices: ManagedPrices,
    cal: Calibration,
    stream: Stream,
    slo_s: float,
    hardware: str,
) -> HardwarePlan:
    from gpu.lambda_plan import front_door

    req = _request(model, layout, speed, cal, stream.prompt_tokens)
    door_usd, door_s = front_door(cal, stream)
    served = _fewest_servers(stream, req.latency_s, slo_s - door_s)
    monolithic = bool(layout.local.all())
    detail: dict[str, Any] = {
        "shape": "monolithic" if monolithic else "driver",
        # the driver invokes one expert per remote function (groups would need packing there),
        # each with at most the calibration's G replicas
        "deployable": not layout.on_gpu_group.any()
        and bool((req.cpu_replicas <= cal.max_replicas).all()),
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
    memory_mb = np.array(
        [DRIVER_VCPUS * cal.mb_per_vcpu] + [GROUP_VCPUS * cal.mb_per_vcpu] * used.size
    )
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
    busy = requests * req.latency_s / (servers * stream.period_s)
    detail.update(
        {
            "instance_type": choice.instance_type,
            "instances": choice.instances,
            "driver_environments": servers,
            "group_environments": int(group_envs.sum()),
            "scaling_target": round(busy, 4),
            "pool_usd": round(pool, 6),
            "cpu_functions_usd": round(requests * req.cpu_usd, 6),
            "front_door_usd": round(door_usd, 6),
        }
    )
    parts = {
        "layout": layout,
        "request": req,
        "driver_memory_mb": DRIVER_VCPUS * cal.mb_per_vcpu,
        "weights_mb": req.load_s["driver"] * cal.s3_bandwidth_bytes_per_s / 2**20,
        "activations_mb": activations_gib(model, stream.prompt_tokens, cal) * 1024,
    }
    return HardwarePlan(
        hardware, True, None, req.latency_s, p99, bill, bill / tokens * 1e6, detail, parts
    )


def express_usd(cal: Calibration, seconds: float) -> float:
    """The duration charge of one Express execution of `seconds` (64 MB, 100-ms steps)."""
    steps = math.ceil(seconds / cal.express_duration_step_s)
    gb = cal.express_memory_mb / cal.billing_mb_per_gb
    return steps * cal.express_duration_step_s * gb * cal.express_gb_second_usd


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
            shape, counts.source.get("popularity", "zipf:1.0"), tokens=prompt_tokens
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
    gpu and mixed every driver accelerator size, every GPU type the calibration prices, and
    for mixed every popular share in `MIXED_SHARES`; for gpu also the chain of layer stages
    (`gpu.lambda_stages`); for cpu `cpu` (from `cpu_plan`, made here when None) simulated over
    the stream. Infeasible ones say why.

    Raises:
        UsageError: An unknown hardware, or a calibration without GPU instance types or
            accelerator sizes (it names the keys to add).
    """
    from gpu.lambda_stages import stages_candidate
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
            largest = max(t.gpu_memory_gib for t in pool.types)
            fitting = [size for size in sizes if size <= largest + 1e-9]
            peak = activations_gib(model, stream.prompt_tokens, calibration)
            runtime = runtime_gib(calibration)
            for size in fitting:
                for share in shares:
                    layout = _layout(model, fitting, size, share, peak, runtime)
                    if isinstance(layout, str):
                        reasons.append(layout)
                        continue
                    if kind == "mixed" and not layout.on_cpu.any():
                        reasons.append(
                            f"a {size}-GiB GPU driver holds every expert: none is left for CPU "
                            "functions"
                        )
                        continue
                    plan = _gpu_candidate(
                        model, layout, speed, pool, calibration, stream, slo_s, kind
                    )
                    plan.detail["gpu"] = gpu_name
                    plan.detail["gpu_share_of_remote"] = share
                    best = _keep(plan, best, reasons)
            if kind == "gpu":
                staged = stages_candidate(model, speed, pool, calibration, stream, slo_s, fitting)
                staged.detail["gpu"] = gpu_name
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
    """Feasible first, then the cheaper; among infeasible ones the faster."""
    if plan.feasible != best.feasible:
        return plan.feasible
    if plan.feasible:
        return plan.bill_usd < best.bill_usd
    return plan.latency_s < best.latency_s
