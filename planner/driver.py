"""Driver and monolithic deployments: their cost and latency, and the exact solver of both.

A driver function (`ground.driver`) runs the non-MoE stack and its local experts in process and
invokes the remote experts' functions. What the model says, per request (times in seconds):

* driver: T^str, reading the token ids (T^dl + 8 N / B^s), per layer the layer stage on all N
  tokens (N u_layer at the driver's memory), then the layer's experts: remote ones all at once,
  local ones meanwhile one after another (u_expert per routed row); the layer ends when both
  are done (t_e = N u_layer + max(local, slowest remote), `ground.driver.layer_seconds`, as
  the handler runs it); then the tail (N u_tail) and the output
  (T^dl + N D^o / B^s), and a listing and delete (2 T^dl) if any shard went through S3;
* a remote expert's replica with r = ceil(d / g) rows, inline (its event fits the payload
  limit): sent at B^f, billed T^str + r (D^o / B^f + U_j), done after RT + r ((D^in + D^o) /
  B^f + U_j), RT the Invoke's round trip (`invoke_round_trip_s`); through S3 past the limit:
  billed T^str + 2 T^dl + r ((D^in + D^o) / B^s + U_j), done after RT + 4 T^dl + 2 r (D^in +
  D^o) / B^s + r U_j (the driver's PUT before it and its GET after it): one rule,
  `ground.driver.remote_call_s`, for every model's remote call;
* the bill: the driver's GB-s for the whole request (memory x latency), every remote replica's
  GB-s, one Lambda request per function started, the S3 requests of the overflowing shards, the
  input GET and output PUT, and the one-state workflow (an Express execution's request and
  duration, or a Standard transition).

The driver's memory must hold the runtime, the non-MoE stages, its local experts (each counted
at the model's largest expert) and a batch's activations (`ground.driver.activation_bytes`).
Each u (u_layer, u_expert, u_tail) counts a stage's FLOPs from its bytes at its kind's bytes
per value and runs at its kind's precision's speed on CPUs (`Calibration.speed_ratio`), as
`planner.build` prices U_j.

The exact solver of both shapes is `planner.driver_solver`.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ground.driver import (
    activation_bytes,
    driver_request_counts,
    layer_seconds,
    overflows,
    remote_call_s,
)
from ground.manifest import Manifest
from planner.calibration import Calibration
from planner.compute import compute_s_at, flops_per_token
from planner.costmodel import price
from planner.exact import SLO_RTOL
from planner.instance import MB, Instance

__all__ = [
    "DriverChoice",
    "DriverEvaluation",
    "DriverInstance",
    "DriverSolution",
    "driver_instance",
    "driver_options_mb",
    "evaluate_driver",
    "remote_options",
    "driver_usage",
]


def driver_options_mb(calibration: Calibration) -> np.ndarray:
    """The driver's memory options: the experts' options, every whole vCPU, Lambda's largest.

    Below one vCPU a function computes at its share of one (the compute's GB-s stay the same,
    the waits cost less); above it, each whole vCPU is a step in speed.
    """
    top = calibration.lambda_max_memory_mb
    steps = int(top // calibration.mb_per_vcpu)
    vcpus = [round(k * calibration.mb_per_vcpu) for k in range(1, steps + 1)]
    options = {*calibration.memory_options_mb, *(m for m in vcpus if m <= top), top}
    return np.array(sorted(options), dtype=float)


@dataclass(frozen=True, eq=False)
class DriverInstance:
    """One driver-planning problem: the per-expert `base` instance (counts, remote options,
    prices, workflow type) and what the driver adds. Sizes in MB, times in seconds."""

    base: Instance
    top_k: int
    runtime_mb: float  # the driver's runtime (it imports transformers: `driver_runtime_mb`)
    nonmoe_mb: float  # head, every layer stage and the tail: what every driver holds
    unit_mb: float  # one local expert's memory: the model's largest expert
    experts_mb: np.ndarray  # (L, E) each expert's weights
    layer_flops: np.ndarray  # (L,) FLOPs per token of each layer stage
    tail_flops: float
    expert_flops: float
    memory_mb: np.ndarray  # (D,) the driver's memory options
    u_layer: np.ndarray  # (D, L) seconds per token of each layer stage at each option
    u_expert: np.ndarray  # (D,) seconds per routed row of one expert
    u_tail: np.ndarray  # (D,)
    activations_mb: float  # a batch's tensors with remote experts (`activation_bytes`)
    activations_local_mb: float  # the same with every expert local
    payload_limit: int  # an inline Invoke's event (and response)
    round_trip_s: float  # a warm synchronous Invoke's round trip (`ground.driver.remote_call_s`)
    max_memory_mb: float
    meta: dict[str, Any] = field(default_factory=dict)
    # A driver on other hardware than CPU Lambda (a GPU: `planner.hardware.gpu_model`), whose
    # speed is not a rate per row: (L, E) the seconds each expert takes in the driver on this
    # batch (None: u_expert x its rows), and (L,) a call each layer waits on beside its expert
    # functions (a GPU expert group's; None: none). The solver (`planner.driver_solver`) plans
    # CPU drivers only; `evaluate_driver` prices both.
    local_s: np.ndarray | None = None
    side_finish_s: np.ndarray | None = None

    @property
    def layers(self) -> int:
        return self.base.layers

    @property
    def experts(self) -> int:
        return self.base.experts

    @property
    def tokens(self) -> int:
        return self.base.tokens

    def rho(self, d: int) -> float:
        """$ per second of the request's latency: the driver's GB-s, Express's duration."""
        express = (
            self.base.express_memory_mb * self.base.express_mb_s_usd
            if self.base.workflow == "express"
            else 0.0
        )
        return float(self.memory_mb[d]) * self.base.price_mb_s + express

    def fixed_s(self, d: int, overflow: bool) -> float:
        """The driver's time outside the layers' expert steps at memory option `d`."""
        b = self.base
        n = float(self.tokens)
        io = b.warm_start_s + 2 * b.s3_delay_s + n * (8 + b.token_bytes_out) / b.s3_bandwidth
        compute = n * float(self.u_layer[d].sum()) + n * float(self.u_tail[d])
        return io + compute + (2 * b.s3_delay_s if overflow else 0.0)

    def fixed_usd(self, overflow: bool) -> float:
        """Dollars every request pays whatever its experts: the driver's request, the input
        GET and output PUT, the workflow's request or transition, and the overflow's cleanup
        (one listing and one delete call, as the solvers count them; `bill` counts exactly)."""
        b = self.base
        usd = b.request_usd + b.s3_get_usd + b.s3_put_usd
        usd += b.express_request_usd if b.workflow == "express" else b.transition_usd
        return usd + ((b.s3_list_usd + b.s3_delete_usd) if overflow else 0.0)

    def budget_units(self, d: int, *, local_all: bool = False) -> int:
        """Local experts a driver of memory option `d` holds beside its stages (-1: none fit
        the stages themselves)."""
        acts = self.activations_local_mb if local_all else self.activations_mb
        free = float(self.memory_mb[d]) - self.runtime_mb - self.nonmoe_mb - acts
        if free < 0:
            return -1
        return int(math.floor(free / self.unit_mb + 1e-9))


def driver_instance(
    base: Instance,
    manifest: Manifest,
    calibration: Calibration,
    *,
    memory_mb: list[float] | None = None,
) -> DriverInstance:
    """The driver problem of `base` (`planner.build.instance_for`), for `manifest`'s model.

    `memory_mb` replaces the driver's memory options (a plan's own memory, to re-evaluate it).
    """
    sizes = {(s.role, s.layer, s.expert): s.bytes for s in manifest.stages}
    layer_bytes = np.array([sizes[("layer", e, None)] for e in range(base.layers)], float)
    nonmoe = sizes[("head", None, None)] + sizes[("tail", None, None)] + layer_bytes.sum()
    experts_mb = np.asarray(base.expert_bytes, float) / MB
    runtime = calibration.required("driver_runtime_mb", "a driver or monolithic plan")
    states = calibration.required("driver_activation_states", "a driver or monolithic plan")
    memory = driver_options_mb(calibration)
    token_bytes = int(max(base.token_bytes_in, base.token_bytes_out))

    def acts(remote: bool) -> float:
        return activation_bytes(base.tokens, token_bytes, manifest.top_k, states, remote=remote)

    # the smallest function that holds every expert: a monolithic plan's cheapest size
    whole = runtime + (nonmoe + float(np.sum(base.expert_bytes)) + acts(False)) / MB
    smallest = math.ceil(whole / 64) * 64
    if smallest <= calibration.lambda_max_memory_mb:
        memory = np.unique(np.r_[memory, smallest])
    if memory_mb is not None:
        memory = np.asarray(memory_mb, dtype=float)
    precision = manifest.precision

    def flops(stage_bytes: float, role: str) -> float:
        return flops_per_token(stage_bytes, precision.bytes_per_weight(role))

    def seconds(stage_flops: float, role: str) -> np.ndarray:
        """Per-token seconds at each memory option, at `role`'s precision's speed."""
        at = compute_s_at(calibration, stage_flops, memory)
        return np.asarray(at) * calibration.speed_ratio(precision.of(role))

    layer_flops = np.array([flops(b, "layer") for b in layer_bytes])
    tail_flops = flops(sizes[("tail", None, None)], "tail")
    expert_flops = flops(float(np.asarray(base.expert_bytes).mean()), "expert")
    return DriverInstance(
        base=base,
        top_k=manifest.top_k,
        runtime_mb=float(runtime),
        nonmoe_mb=float(nonmoe) / MB,
        unit_mb=float(experts_mb.max()),
        experts_mb=experts_mb,
        layer_flops=layer_flops,
        tail_flops=tail_flops,
        expert_flops=expert_flops,
        memory_mb=memory,
        u_layer=np.stack([seconds(f, "layer") for f in layer_flops], axis=1),
        u_expert=seconds(expert_flops, "expert"),
        u_tail=seconds(tail_flops, "tail"),
        activations_mb=acts(True) / MB,
        activations_local_mb=acts(False) / MB,
        payload_limit=calibration.invoke_payload_bytes,
        round_trip_s=calibration.required("invoke_round_trip_s", "a driver's remote calls"),
        max_memory_mb=float(calibration.lambda_max_memory_mb),
        meta={"model": manifest.model},
    )


@dataclass(frozen=True, eq=False)
class RemoteOptions:
    """Every (memory j, replicas g) option of every expert of one layer as a remote expert of
    the driver, (E, J, G) arrays; an expert with no tokens costs nothing and is not invoked."""

    cost: np.ndarray  # $: replicas' GB-s, their Lambda requests, overflow's S3 requests
    experts_usd: np.ndarray  # $ of the replicas' GB-s alone
    time: np.ndarray  # billed seconds of one busy replica
    finish: np.ndarray  # from the driver's first invoke to the last result in its hands
    feasible: np.ndarray
    overflow: np.ndarray  # shards that go through S3 (int)


@functools.lru_cache(maxsize=256)
def remote_options(dinst: DriverInstance, layer: int) -> RemoteOptions:
    """The remote options of layer `layer`'s experts (formulas in the module docstring).

    Cached per instance (compared by identity: instances are immutable), since evaluating a
    choice reads every layer's options again."""
    b = dinst.base
    d = np.ceil(b.counts[layer])[:, None, None]
    g = b.replicas[None, None, :].astype(float)
    r = np.ceil(d / g)
    u = b.compute_s[None, :, None]
    m = b.memory_mb[None, :, None]
    dl, start, bs, bf = b.s3_delay_s, b.warm_start_s, b.s3_bandwidth, b.invoke_bandwidth
    d_in, d_out = b.token_bytes_in, b.token_bytes_out
    token_bytes = int(max(d_in, d_out))
    over = np.asarray(overflows(r, token_bytes, dinst.payload_limit))
    inline_time = start + r * (d_out / bf + u)
    s3_time = start + 2 * dl + r * ((d_in + d_out) / bs + u)
    time_ = np.where(over, s3_time, inline_time)
    finish = remote_call_s(
        dinst.round_trip_s,
        r,
        d_in + d_out,
        bf,
        r * u,
        through_s3=over,
        s3_delay_s=dl,
        s3_bandwidth=bs,
    )
    busy = np.minimum(d, g)
    q = np.floor(d / g)
    rem = d - q * g
    big = np.asarray(overflows(q + 1, token_bytes, dinst.payload_limit))
    small = np.asarray(overflows(q, token_bytes, dinst.payload_limit)) & (q > 0)
    shards_over = rem * big + (g - rem) * small
    need = dinst.experts_mb[layer][:, None, None] + b.runtime_mb
    feasible = (need + r * (d_in + d_out) / MB <= m) & (time_ <= b.max_timeout_s)
    experts_usd = busy * time_ * m * b.price_mb_s
    cost = experts_usd + busy * b.request_usd + shards_over * 2 * (b.s3_put_usd + b.s3_get_usd)
    shape = (b.experts, b.memory_mb.size, b.max_replicas)
    arrays = [np.broadcast_to(a, shape).copy() for a in (cost, experts_usd, time_, finish)]
    over_count = np.broadcast_to(shards_over, shape).astype(int)
    feasible = np.broadcast_to(feasible, shape).copy()
    idle = np.broadcast_to(d == 0, shape)
    for a in arrays:
        a[idle] = 0.0
    one = np.broadcast_to(need + (d_in + d_out) / MB <= m, shape)
    feasible[idle] = one[idle]
    return RemoteOptions(*arrays, feasible, over_count)


@dataclass(frozen=True)
class DriverChoice:
    """A complete decision: the driver's memory option, its local experts, and per remote
    expert a memory option index and replicas (ignored where local)."""

    memory: int
    local: np.ndarray  # (L, E) bool
    remote_memory: np.ndarray  # (L, E) index into base.memory_mb
    replicas: np.ndarray  # (L, E) 1..G

    @property
    def monolithic(self) -> bool:
        return bool(np.all(self.local))


@dataclass(frozen=True, eq=False)
class DriverEvaluation:
    """A driver choice as the model prices it, with every violated constraint named."""

    cost: float  # $ as the solvers price it
    latency: float
    layer_latency: np.ndarray  # (L,) expert step of each layer (local and remote)
    expert_cost: np.ndarray  # (L, E) $ of each remote expert (0 where local)
    expert_time: np.ndarray  # (L, E) billed seconds of one busy remote replica
    experts_usd: float  # remote experts' GB-s
    overflow: bool
    memory_need_mb: float
    violations: list[str]

    @property
    def feasible(self) -> bool:
        return not self.violations


def evaluate_driver(
    dinst: DriverInstance, choice: DriverChoice, slo_s: float | None = None
) -> DriverEvaluation:
    """Cost and latency of `choice`, with every violated constraint named."""
    L, E = dinst.layers, dinst.experts
    d = choice.memory
    local = np.asarray(choice.local, bool)
    cost = np.zeros((L, E))
    times = np.zeros((L, E))
    layer_t = np.zeros(L)
    experts_usd = 0.0
    overflow = False
    violations: list[str] = []
    idx = np.arange(E)
    for e in range(L):
        opts = remote_options(dinst, e)
        j, g = choice.remote_memory[e], choice.replicas[e] - 1
        remote = ~local[e]
        cost[e] = np.where(remote, opts.cost[idx, j, g], 0.0)
        times[e] = np.where(remote, opts.time[idx, j, g], 0.0)
        experts_usd += float(np.where(remote, opts.experts_usd[idx, j, g], 0.0).sum())
        overflow |= bool((remote & (opts.overflow[idx, j, g] > 0)).any())
        for i in np.flatnonzero(remote & ~opts.feasible[idx, j, g]):
            violations.append(f"layer {e} expert {i}: memory or timeout limit")
        if dinst.local_s is None:
            rows = float(np.ceil(dinst.base.counts[e])[local[e]].sum())
            local_s = float(dinst.u_expert[d]) * rows
        else:
            local_s = float(dinst.local_s[e][local[e]].sum())
        remote_s = float(np.where(remote, opts.finish[idx, j, g], 0.0).max(initial=0.0))
        if dinst.side_finish_s is not None:
            remote_s = max(remote_s, float(dinst.side_finish_s[e]))
        layer_t[e] = float(layer_seconds(local_s, remote_s))
    latency = dinst.fixed_s(d, overflow) + float(layer_t.sum())
    need = (
        dinst.runtime_mb
        + dinst.nonmoe_mb
        + int(local.sum()) * dinst.unit_mb
        + (dinst.activations_local_mb if local.all() else dinst.activations_mb)
    )
    if need > float(dinst.memory_mb[d]) + 1e-9:
        violations.append(
            f"the driver needs {need:,.0f} MB (runtime, stages, {int(local.sum())} local "
            f"experts, activations), over its {dinst.memory_mb[d]:,.0f} MB"
        )
    if latency > dinst.base.max_timeout_s:
        violations.append(
            f"the driver runs {latency:,.1f} s, over Lambda's {dinst.base.max_timeout_s:g} s"
        )
    if slo_s is not None and latency > slo_s * (1 + SLO_RTOL):
        violations.append(f"latency {latency:.4f} s exceeds the SLO {slo_s:.4f} s")
    total = float(cost.sum()) + dinst.fixed_usd(overflow) + dinst.rho(d) * latency
    return DriverEvaluation(
        total, latency, layer_t, cost, times, experts_usd, overflow, need, violations
    )


def driver_usage(
    dinst: DriverInstance, choice: DriverChoice, evaluation: DriverEvaluation
) -> dict[str, float]:
    """What one execution of `choice` uses (`ground.semantics.USAGE_KEYS`), as a metered run
    counts it: the requests from `ground.driver.driver_request_counts`, the GB-s."""
    b = dinst.base
    tokens = np.ceil(b.counts).astype(int)
    token_bytes = int(max(b.token_bytes_in, b.token_bytes_out))
    counts, payload = driver_request_counts(
        tokens, choice.replicas, choice.local, token_bytes, dinst.payload_limit
    )
    driver_gb_s = float(dinst.memory_mb[choice.memory]) * evaluation.latency / 1024.0
    experts_gb_s = evaluation.experts_usd / b.price_mb_s / 1024.0
    return counts.as_dict() | {
        "gb_s": driver_gb_s + experts_gb_s,
        "experts_gb_s": experts_gb_s,
        "payload_max_bytes": payload,
    }


def driver_bill(
    dinst: DriverInstance, choice: DriverChoice, evaluation: DriverEvaluation
) -> dict[str, float]:
    """The full bill of one request by item, from its exact request counts."""
    return price(dinst.base, driver_usage(dinst, choice, evaluation), evaluation.latency)


@dataclass(frozen=True, eq=False)
class DriverSolution:
    """The solver's answer: the choice, its evaluation, and how it was found."""

    deployment: str  # "driver" or "monolithic"
    choice: DriverChoice
    evaluation: DriverEvaluation
    seconds: float
    optimal: bool | None
    min_latency: float  # the smallest SLO any plan of this shape meets
    note: str = ""

    @property
    def cost(self) -> float:
        return self.evaluation.cost

    @property
    def latency(self) -> float:
        return self.evaluation.latency
