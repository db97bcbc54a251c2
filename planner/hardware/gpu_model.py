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
* **gpu+cpu**: the same GPU driver; of each layer's remote experts the most popular fraction `q`
  in a GPU group, the long tail on CPU Lambda functions that bill nothing idle (Remoe's split).
* **cpu**: the CPU planner's cheapest deployment of one prompt (`planner.api.plan_deployment`:
  one function, a driver, the fan-out workflow), planned for the stream as `plan --traffic`
  plans it (no capacity policy, warmers, provisioned concurrency or CPU Managed Instances).

The gpu hardware also weighs a chain of layer stages (`planner.hardware.gpu_stages`), for models
larger than one accelerator. Expert groups and stages are planned and priced, not deployable yet
(no handler runs them: `HardwarePlan.detail["deployable"]`); a GPU function holding the model
and a GPU driver with CPU experts deploy (`planner.hardware.gpu_plan` writes them as a Plan, the
handlers place their stages on the device, `ground.placement`); the candidates are weighed in
`planner.hardware.gpu_candidates`.

Compute on a GPU is the GPU backend's per-token model (`planner.hardware.gpu_driver.GpuSpeed`,
the speeds in planner/data/gpu_catalogue.json), its weights held and read as bfloat16
(`planner.hardware.gpu_driver.DEVICE_BYTES`: the handlers cast fp32 weights as they load them;
int8 weights have no GPU kernel and are refused, `planner.hardware.why_not`); a function
downloads the export's own bytes (`Manifest.precision`).
An environment holds one whole GPU (`planner.traffic.managed`: AWS exposes accelerator devices
to an environment, not shares of one), so it computes at the whole GPU's speed and asks for
the smallest AcceleratorMemorySize that holds its weights. Its room is that size or what the
device exposes, whichever is less (`GpuSpeed.room_gib`: the catalogue's `usable_memory_mib`, a
48-GB L40S exposes 44.99 GiB), less the runtime (`gpu_runtime_gib`) and a batch's tensors.
These timings are predicted, not measured: `scripts/gpu-lambda-timing.py` times them on a GPU
where one is present.

A request (warm, seconds) is priced by the driver model itself (`planner.driver.evaluate_driver`)
on this hardware: T^str, the input's read, per layer the layer stage on the GPU then the
longer of the local experts (in turn, on the GPU) and the remote calls (all at once), then the
tail and the output's write. The CPU experts are any driver's remote experts
(`planner.driver.remote_options`: the fastest of the calibration's memory options, the replicas
the Invoke payload limit asks for up to G, beyond it through S3 as the handler sends them); a
layer's GPU group is one more call it waits on, split over replicas so that each event fits the
payload limit, timed by the one rule `ground.driver.remote_call_s`. Transfers use the
calibration's Lambda bandwidths for GPU functions too.

The pool. Every request is the same size, taking S seconds warm, and an environment serves one
at a time (`ground.managed.MAX_CONCURRENCY`: one process holds the weights on the device). The
driver keeps c environments, all started before traffic: a request that finds all c busy is
throttled, and the state machine's Task retries it after the waits of
`ground.coldstart.retry_waits` (its THROTTLE_RETRY policy at the mean of its jitter); still
throttled after the last retry, it fails. A request's latency is S plus its retries' waits
(`pool_latency`, the traffic simulator's own pool, `planner.traffic._kernels`). The driver gets
the fewest environments whose p99 latency meets the SLO over the stream, a failed request's
latency infinite as the traffic simulator counts it (scanning up from Little's law's bound); a
layer's group gets its replicas times the calls in flight at a 50 % busy share (Little's law;
their throttling is not simulated). The environments are packed onto the cheapest GPU instance type
(`ManagedPrices.choose`), at least the provider's default instances, for the whole period:
nothing is billed for capacity the plan did not choose. The scaling target the plan reports
(the provider's GPU-utilisation target) is the drivers' GPU computing share of the period
(`_Request.gpu_s`: its layer stages, local experts and tail, not its S3 reads and Invoke
waits; `scaling_target`). A new environment loads its weights from S3 at B^s before it serves
(`load_s`, its cold start): the fixed pool is started before traffic.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.coldstart import retry_waits
from ground.driver import remote_call_s
from ground.errors import UsageError
from ground.semantics import direct_event_bytes
from planner.hardware.gpu_driver import DEVICE_BYTES, GpuSpeed, gpu_s, model_sizes, on_gpu

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.api import PlanningCounts
    from planner.calibration import Calibration

__all__ = [
    "GpuSpeed",
    "HardwarePlan",
    "Stream",
    "activations_gib",
    "express_usd",
    "front_door",
    "host_memory_mb",
    "pool_latency",
    "runtime_gib",
    "scaling_target",
]

GROUP_BUSY = 0.5  # a group's environments are sized to be busy at most half the time
# The popular share of each layer's remote experts a gpu+cpu plan puts on a GPU group.
MIXED_SHARES = (0.0, 0.25, 0.5, 0.75)
# The least GPU-utilisation target a plan reports, as `planner.hardware.gpu_plan` writes it.
SCALING_FLOOR = 0.01
DRIVER_VCPUS = 2  # a GPU driver's host side: tokenising, S3 and Invoke I/O (at least)
GROUP_VCPUS = 1  # a GPU expert group's (at least): `host_memory_mb` may need more


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
    head_params: float
    expert_params: np.ndarray  # (L, E)
    share: np.ndarray  # (L, E) rows per token routed to each expert
    token_bytes: int  # a hidden state on the wire (`Weights.wire_bytes` per value)
    token_bytes_out: int  # one token of the model's output
    manifest: Manifest  # whose stages the CPU driver model prices the CPU experts from

    @classmethod
    def of(cls, manifest: Manifest, counts: PlanningCounts) -> _Model:
        return dataclasses.replace(
            cls.of_sizes(manifest), share=np.asarray(counts.counts, float) / counts.tokens
        )

    @classmethod
    def of_sizes(cls, manifest: Manifest) -> _Model:
        """The model's sizes, its routing unknown (`share` zero)."""
        layers, experts, tail, head = model_sizes(manifest)
        return cls(
            manifest.hidden_size,
            float(layers.sum() + tail + head),
            layers,
            tail,
            head,
            experts,
            np.zeros_like(experts),
            max(manifest.token_bytes_in, manifest.token_bytes_out),
            manifest.token_bytes_out,
            manifest,
        )

    @staticmethod
    def device_gib(params: Any) -> Any:
        """GiB that `params` weights take on a GPU (`DEVICE_BYTES`)."""
        return params * DEVICE_BYTES / 2**30

    def file_bytes(self, params: Any, role: str) -> Any:
        """Bytes of `params` weights of a stage of `role` as the export stores them: what a
        function downloads and streams onto its GPU."""
        return params * self.manifest.precision.bytes_per_weight(role)

    @property
    def nonmoe_gib(self) -> float:
        return self.device_gib(self.nonmoe_params)


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
    # what `planner.hardware.gpu_plan.plan_document` writes a deployable one from (not reported)
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


def pool_latency(arrivals_s: np.ndarray, service_s: float, servers: int) -> np.ndarray:
    """Each request's latency through `servers` started environments serving one request of
    `service_s` at a time, throttled when all are busy and retried as the state machine
    retries (see the module docstring): its service plus its retries' waits, inf where it was
    still throttled after the last retry. The traffic simulator's own pool
    (`planner.traffic._kernels._pool`), every environment provisioned and the function's
    reserved concurrency, so none starts cold and none is reclaimed."""
    from planner.traffic._kernels import _pool

    arrivals = np.asarray(arrivals_s, float)
    n = arrivals.size
    late = np.zeros(n)
    failed = np.zeros(n, np.bool_)
    _pool(
        arrivals,
        np.argsort(arrivals, kind="mergesort"),
        np.full(n, float(service_s)),
        np.ones(n, np.int64),
        0.0,  # INIT: the pool is started before traffic
        servers,  # provisioned
        servers,  # reserved: no more environments than these
        np.asarray(retry_waits(), float),
        math.inf,  # idle reclaim: provisioned environments are not reclaimed
        0.0,  # no warmer pings
        0,
        0.0,
        0.0,
        late,
        np.zeros(n, np.int64),
        failed,
        np.zeros(1, np.int64),
    )
    return np.where(failed, math.inf, service_s + late)


def _fewest_servers(stream: Stream, service_s: float, slo_s: float) -> tuple[int, float] | None:
    """The fewest driver environments whose p99 latency meets the SLO, and that p99: a failed
    request's latency is infinite and counts within the p99, as the traffic simulator counts
    it (`TrafficResult.quantiles`). Scanning up from Little's law's bound, not by bisection:
    one more environment may fail a request fewer did not (its retries fall at other times)."""
    if service_s > slo_s or stream.arrivals_s.size == 0:
        return (1, service_s) if service_s <= slo_s else None
    servers = max(1, math.ceil(stream.rate * service_s))
    while True:  # ends: one environment per request serves each at once, within the SLO
        latency = pool_latency(stream.arrivals_s, service_s, servers)
        p99 = float(np.quantile(latency, 0.99, method="inverted_cdf"))
        if p99 <= slo_s:
            return servers, p99
        servers += 1


@dataclass(frozen=True, eq=False)
class _Layout:
    """Where each expert runs: in the driver, its layer's GPU group, or a CPU function."""

    driver_gib: int
    local: np.ndarray  # (L, E) bool
    on_gpu_group: np.ndarray  # (L, E) bool
    on_cpu: np.ndarray  # (L, E) bool
    group_gib: np.ndarray  # (L,) int, 0: no group


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
    gpu: GpuSpeed,
    sizes: Sequence[int],
    driver_gib: int,
    gpu_share: float,
    activations: float,
    runtime: float,
) -> _Layout | str:
    """The driver of `driver_gib` on `gpu` with the most popular experts that fit its room
    (`GpuSpeed.room_gib`); of each layer's others the popular `gpu_share` on a GPU group of
    the smallest size whose room holds them, the rest on CPU. A string says why none."""
    room = gpu.room_gib(driver_gib) - runtime - model.nonmoe_gib - activations
    if room < 0:
        return (
            f"the non-MoE stack ({model.nonmoe_gib:.1f} GiB with {runtime:g} GiB of runtime and "
            f"{activations:.1f} GiB of activations) does not fit {gpu.bound(driver_gib)}"
        )
    gib = model.device_gib(model.expert_params)
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
            size = gpu.smallest_size(sizes, held + runtime)
            if size is None:
                return (
                    f"layer {layer}'s remote experts ({held:.1f} GiB with {runtime:g} GiB of "
                    f"runtime) exceed {gpu.bound(max(sizes))}"
                )
            group_gib[layer] = size
    return _Layout(driver_gib, local, on_gpu, remote & ~on_gpu, group_gib)


@dataclass(frozen=True)
class _Request:
    """One warm request through a layout: its latency and what each part is busy or billed."""

    latency_s: float
    gpu_s: float  # the driver's GPU computing: its layer stages, local experts and tail
    layer_s: np.ndarray  # (L,) each layer's time in the driver
    group_busy_s: np.ndarray  # (L,) per replica
    group_replicas: np.ndarray  # (L,)
    cpu_replicas: np.ndarray  # (L, E) calls to each CPU expert (0: not on a CPU function)
    cpu_run_s: np.ndarray  # (L, E) billed seconds of one of them
    cpu_usd_each: np.ndarray  # (L, E) its replicas' GB-s, requests and S3 overflow
    cpu_memory_mb: int  # every CPU expert's memory: the CPU driver model's fastest option
    cpu_fit: np.ndarray  # (L, E) rows one CPU replica holds (`planner.costmodel.tokens_that_fit`)
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


def _group_calls(
    model: _Model, layout: _Layout, speed: GpuSpeed, cal: Calibration, rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per layer, (replicas, seconds until the last returns) of the call to its GPU expert
    group: one call, split over replicas so that each event fits the payload limit, each timed
    by the one rule `ground.driver.remote_call_s`."""
    trip = cal.required("invoke_round_trip_s", "pricing a GPU driver's remote calls")
    group_rows = np.where(layout.on_gpu_group, rows, 0.0).sum(axis=1)
    replicas = np.where(group_rows > 0, _calls(model, group_rows, cal.invoke_payload_bytes), 0)
    per_rep = group_rows / np.maximum(replicas, 1)
    compute = np.array(
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
    bf = cal.invoke_bandwidth_bytes_per_s
    finish = remote_call_s(trip, per_rep, 2 * model.token_bytes, bf, compute)
    return replicas, np.where(group_rows > 0, finish, 0.0)


def _request(
    model: _Model, layout: _Layout, speed: GpuSpeed, cal: Calibration, tokens: int
) -> _Request:
    """One warm request through `layout`, priced by the driver model
    (`planner.driver.evaluate_driver`) on this hardware: the driver's stages and its local
    experts at the GPU's speed, its CPU experts as any driver's remote experts
    (`planner.driver.remote_options`, at the fastest memory option with the replicas the
    Invoke payload asks for, past the cap of G through S3 as the handler sends them), and each
    layer's GPU group as a call the layer also waits on."""
    from planner.build import instance_for
    from planner.costmodel import tokens_that_fit
    from planner.driver import DriverChoice, driver_instance, evaluate_driver

    n = float(tokens)
    rows = n * model.share  # (L, E)
    group_replicas, group_s = _group_calls(model, layout, speed, cal, rows)
    base = instance_for(
        model.manifest, rows, cal, tokens=tokens, arch="x86_64", workflow="express"
    )
    dinst = on_gpu(
        driver_instance(base, model.manifest, cal, memory_mb=[cal.lambda_max_memory_mb]),
        model.manifest,
        speed,
        layout.local,
        group_s,
    )
    fastest = base.memory_mb.size - 1
    wanted = _calls(model, rows, cal.invoke_payload_bytes)
    replicas = np.minimum(wanted, base.max_replicas)
    choice = DriverChoice(
        0, ~layout.on_cpu, np.full(rows.shape, fastest), np.where(layout.on_cpu, replicas, 1)
    )
    # its memory check is a CPU driver's; the GPU's memory is `_layout`'s
    ev = evaluate_driver(dinst, choice)
    busy = layout.on_cpu & (np.ceil(rows) > 0)
    s3_usd = cal.s3_get_request_usd + cal.s3_put_request_usd
    if ev.overflow:  # the request's prefix listed and deleted
        s3_usd += base.s3_list_usd + base.s3_delete_usd
    # what it downloads: the export's weights (`moe.StageLoader` casts them on the device)
    local_params = float((model.expert_params * layout.local).sum())
    driver_bytes = model.file_bytes(model.nonmoe_params, "layer") + model.file_bytes(
        local_params, "expert"
    )
    load = {"driver": driver_bytes / cal.s3_bandwidth_bytes_per_s}
    for layer in np.flatnonzero(layout.group_gib):
        held = float(model.expert_params[layer, layout.on_gpu_group[layer]].sum())
        load[f"group{layer:02d}"] = model.file_bytes(held, "expert") / cal.s3_bandwidth_bytes_per_s
    return _Request(
        latency_s=ev.latency,
        gpu_s=gpu_s(dinst),
        layer_s=n * dinst.u_layer[0] + ev.layer_latency,
        group_busy_s=group_s,
        group_replicas=group_replicas,
        cpu_replicas=np.where(busy, choice.replicas, 0),
        cpu_run_s=np.where(busy, ev.expert_time, 0.0),
        cpu_usd_each=np.where(busy, ev.expert_cost, 0.0),
        cpu_memory_mb=int(base.memory_mb[fastest]),
        cpu_fit=np.stack(
            [
                tokens_that_fit(base, layer, np.full(base.experts, base.memory_mb[fastest]))
                for layer in range(base.layers)
            ]
        ),
        s3_usd=s3_usd,
        load_s=load,
    )


def scaling_target(requests: int, gpu_s: float, environments: int, period_s: float) -> float:
    """The GPU-utilisation target of a pool: its GPUs' computing share of the period, the
    `requests` each computing `gpu_s` on `environments` GPUs (not their S3 reads and Invoke
    waits, which leave the GPU idle), at least `SCALING_FLOOR`."""
    share = requests * gpu_s / max(environments * period_s, 1e-9)
    return round(max(share, SCALING_FLOOR), 4)


def host_memory_mb(
    model: _Model,
    cal: Calibration,
    vcpus: int,
    experts: np.ndarray,
    layers: np.ndarray | None = None,
    head: bool = False,
    tail: bool = False,
) -> float:
    """The Lambda memory a GPU-backed function is planned at: its `vcpus`' share, or more
    where its host side must hold the CUDA runtime (`gpu_host_runtime_mb`) beside the largest
    weight file it streams onto the device (`moe.StageLoader` reads a stage's file a tensor
    at a time, so the file bounds it): of its `experts` ((L, E) mask), its `layers` ((L,)
    mask of layer stages), the head and the tail, as the export stores them."""
    runtime = cal.required("gpu_host_runtime_mb", "sizing a GPU-backed function's host memory")
    experts = np.broadcast_to(experts, model.expert_params.shape)
    files = [
        model.file_bytes(float(model.expert_params[experts].max(initial=0.0)), "expert"),
        model.file_bytes(float(model.layer_params[layers].max(initial=0.0)), "layer")
        if layers is not None
        else 0.0,
        model.file_bytes(model.head_params, "head") if head else 0.0,
        model.file_bytes(model.tail_params, "tail") if tail else 0.0,
    ]
    largest = max(files)
    return max(vcpus * cal.mb_per_vcpu, runtime + largest / 1e6)


def express_usd(cal: Calibration, seconds: float) -> float:
    """The duration charge of one Express execution of `seconds` (64 MB, 100-ms steps)."""
    steps = math.ceil(seconds / cal.express_duration_step_s)
    gb = cal.express_memory_mb / cal.billing_mb_per_gb
    return steps * cal.express_duration_step_s * gb * cal.express_gb_second_usd


def front_door(cal: Calibration, stream: Stream) -> tuple[float, float]:
    """(USD over the period, p99 seconds a request waits from its arrival to its execution's
    start) of the front door for `stream`, one execution per request: the traffic
    simulator's own front door (`planner.traffic.simulate.front_door_only`: its batching,
    StartExecution time, the batcher's INIT when cold, SQS, Lambda and S3 charges), billed
    once, here as for CPU plans."""
    from planner.traffic.platform import platform_for
    from planner.traffic.simulate import BatchPolicy, front_door_only
    from planner.traffic.spec import Arrivals

    platform = platform_for(cal, None, "x86_64", static_bytes=0)  # no remote table: one Task
    if platform.front_door is None:
        return 0.0, 0.0
    n = int(stream.arrivals_s.size)
    arrivals = Arrivals(
        np.asarray(stream.arrivals_s, float), np.full(n, stream.prompt_tokens), stream.period_s
    )
    one_each = BatchPolicy(max_tokens=stream.prompt_tokens, max_wait_s=0.0)
    waits, bill = front_door_only(arrivals, one_each, platform)
    return float(sum(bill.values())), float(np.percentile(waits, 99)) if n else 0.0
