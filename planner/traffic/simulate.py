"""The deployment over a request stream: a discrete-event simulation of batches and environments.

1. The front door batches requests (`BatchPolicy`: at most `max_tokens` per execution, a wait
   of `max_wait_s`, which deploys rounded up to whole seconds): with a `FrontDoor` (a plan
   made for traffic is deployed behind an SQS queue and a batching function), by the deployed
   rule, `ground.frontdoor` (the event source mapping's whole-second window and batch size,
   then the batcher's split), which `_kernels.batch_requests` compiles; each execution starts
   when the batcher reaches its StartExecution, after the batcher's INIT if its environment
   was cold. Without one (a plan not made for traffic: clients start one execution per
   request), requests arriving at the same instant share an execution.
2. Each batch is one workflow execution. Its warm latency, its bill by item, and each function's
   start and billed seconds are the plan's cost model at the batch's size (`workflow.py`).
3. Each function has a pool of execution environments (`ground.coldstart`: one invocation at
   a time, most recently used first, reclaimed after the idle time, provisioned ones always
   there, warmers' pings like any invocation). An invocation that finds no idle environment
   starts one and waits its INIT; the batch's later stages wait for the slowest function of
   each stage (`_kernels.run_pools`).
4. A request's latency is its wait in the batcher plus its batch's warm latency plus the cold
   and throttling delays of its batch. A batch larger than the plan can serve (an expert's
   real tokens need more replicas than its cap) is refused, one throttled past the state
   machine's last retry fails; their requests count as missing every SLO.
5. The bill of the period: the batches' bills (cost model), INIT billed at the functions' rate,
   what cold starts make others wait (a direct gate billed while its experts start; a pipelined
   replica billed while its gate starts; an Express execution's longer duration), provisioned
   concurrency (its allocation, less the lower duration rate of the invocations it serves),
   warmers (a request, a warm start's duration and a scheduler invocation per ping), and the
   front door (`front_door_usd`: SQS requests in 64 KB chunks, the event source's receives and
   deletes and its pollers' empty long polls, the batcher's invocations, duration and INIT,
   the S3 PUT of each input too large to travel in the execution's input, and each request's
   result: its S3 PUT and the tail's seconds writing them, `ground.frontdoor.result_write_s`,
   which also lengthen the batch; `ground.frontdoor.planned`), and Lambda Managed Instances
   (`managed_instances_usd`: the instances with their fee and the requests,
   `planner.traffic.managed`, less the duration and requests the cost model's items bill for
   the managed functions' invocations).
6. A function on Lambda Managed Instances (`ground.managed`) keeps its `environments` always
   warm, with no INIT: it is simulated as that many provisioned environments under a reserved
   concurrency of the same number, so an invocation that finds them all busy is throttled and
   retried as any throttled invocation is (`_kernels.run_pools`).

Approximations, each named where it is made: the workflow's timings are the cost model's and
interpolated between grid sizes; a stage's functions start cold independently; a direct gate's
environment is held for its warm duration only; a pipelined layer's replicas are sequenced after
their gate's cold start (they start with it, so this overstates a cold gate's delay when the
replicas are cold too); a throttled invocation's retries wait their mean jittered time; the
bill counts a failed execution whole; the front door is modelled with one event-source poller
(Lambda scales them under load, which can only cut deliveries smaller), its batcher's
environment is cold only after an idle gap longer than the idle time (never because two
deliveries overlap), its duration counts a StartExecution per execution and an S3 request's
delay per stored input, not the bytes (a stored 65,536-token input is 524 KB: 7 ms at B^s),
and which inputs are stored is decided on an upper bound of their JSON size. An
expert function's reserved concurrency (its `max_replicas`, as the stack
reserves it) throttles invocations beyond it (`ground.coldstart`); the summary names the
functions that reached their reservation (`reserved_concurrency_reached`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ground import frontdoor
from ground.coldstart import init_phase, retry_waits
from planner.traffic._kernels import batch_requests, run_pools
from planner.traffic.managed import ManagedPrices
from planner.traffic.spec import Arrivals
from planner.traffic.workflow import BILL_ITEMS, WorkflowModel

__all__ = [
    "BatchPolicy",
    "Capacity",
    "FrontDoor",
    "Platform",
    "TrafficResult",
    "batches_of",
    "front_door_only",
    "simulate",
]


@dataclass(frozen=True)
class BatchPolicy:
    """How the front door turns requests into executions.

    `front_door` False: no queue, clients start one execution per request (a plan not made
    for traffic); requests arriving at the same instant share one, up to `max_tokens`.
    """

    max_tokens: int
    max_wait_s: float
    front_door: bool = True


@dataclass(frozen=True)
class FrontDoor:
    """The front door's limits and prices (calibration file) and the batcher's INIT.

    `batcher_init_s` is its INIT (image start, interpreter, import of `functions.batcher`);
    `start_s` what the batcher spends per execution it starts (a StartExecution call), `put_s`
    more for one whose input exceeds `input_limit_bytes` and is stored (an S3 PUT). An input
    that travels inline saves the head's GET of it, which the workflow's bill (the cost model's
    requests, `ground.semantics.request_counts`) counts for every execution.
    """

    window_limit_s: float
    records_max: int
    records_max_without_window: int
    sqs_request_usd: float
    chunk_bytes: int
    receive_max: int
    idle_pollers: int
    long_poll_s: float
    batcher_memory_mb: float
    batcher_init_s: float
    start_s: float
    put_s: float
    input_limit_bytes: int
    s3_put_usd: float
    s3_get_usd: float

    def deployed(self, policy: BatchPolicy) -> tuple[int, int]:
        """(the event source's window in whole seconds, its batch size) for `policy`."""
        window = frontdoor.deployed_window_s(policy.max_wait_s, self.window_limit_s)
        records = frontdoor.records_per_delivery(
            policy.max_tokens,
            window,
            max_records=self.records_max,
            max_records_without_window=self.records_max_without_window,
        )
        return window, records


@dataclass(frozen=True)
class Capacity:
    """One function's capacity policy: none, a warmer, provisioned concurrency or managed.

    A warmer pings `warmer_concurrency` environments every `warmer_interval_s`; provisioned
    concurrency keeps `provisioned` environments initialised for the whole period; managed
    runs the function on the stack's Lambda Managed Instances with `environments` of its own,
    and no more. `reserved` replaces the stack's reserved concurrency of the function (None:
    the plan's); a managed function's limit is its `environments`.
    """

    kind: str = "none"
    provisioned: int = 0
    warmer_interval_s: float = 0.0
    warmer_concurrency: int = 0
    reserved: int | None = None
    environments: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("none", "warmer", "provisioned", "managed"):
            raise ValueError(f"unknown capacity policy {self.kind!r}")
        if self.kind == "managed" and self.environments < 1:
            raise ValueError("a managed function needs at least one environment")


@dataclass(frozen=True)
class Platform:
    """The platform facts a simulation needs beyond the plan: INIT per function and prices.

    `init_s` (F,) is each function's INIT (`ground.coldstart.InitModel`), `idle_s` the assumed
    idle time before reclaim; prices are USD per GB-second or per call.
    """

    init_s: np.ndarray  # (F,) the INIT phase, under the limit
    init_limit_s: float
    init_billed: bool
    idle_s: float
    gb_second_usd: float
    request_usd: float
    ping_s: float
    scheduler_invocation_usd: float
    billing_mb_per_gb: float
    provisioned_allocated_usd: float | None = None  # per GB-second; None: not sourced
    provisioned_duration_usd: float | None = None
    load_s: np.ndarray | None = None  # (F,) the first call's weight load (None: 0)
    front_door: FrontDoor | None = None  # None: not priced (batching by the policy as given)
    managed: ManagedPrices | None = None  # Lambda Managed Instances (None: not priced)

    def cold_s(self) -> tuple[np.ndarray, np.ndarray]:
        """(seconds a new environment delays its first invocation, seconds it bills): the
        INIT phase under its limit (`ground.coldstart.init_phase`) plus the first load."""
        phase = np.array([init_phase(float(s), self.init_limit_s) for s in self.init_s])
        load = np.zeros(self.init_s.size) if self.load_s is None else self.load_s
        return phase[:, 0] + load, phase[:, 1] + load


@dataclass(frozen=True, eq=False)
class TrafficResult:
    """What a simulated period gives: per request, per function and the bill."""

    latency_s: np.ndarray  # (requests,) inf where the batch was refused
    batch_of: np.ndarray  # (requests,) batch index
    batch_tokens: np.ndarray  # (batches,)
    cold_starts: dict[str, int]  # per function: batches' and pings' cold starts
    peak_environments: dict[str, int]
    environments_in_use: np.ndarray  # (F, 256) histogram at the functions' invocations
    bill_usd: dict[str, float]
    refused_batches: int
    failed_batches: int  # still throttled after the state machine's last retry
    over_reserved: dict[str, dict[str, int]]  # function -> peak environments and reservation
    tokens: int
    period_s: float
    wall_s: float
    notes: list[str] = field(default_factory=list)
    front_door: dict[str, Any] = field(default_factory=dict)  # its deployment and usage
    managed: dict[str, Any] = field(default_factory=dict)  # instance type and count, if any

    def quantiles(self) -> dict[str, float | None]:
        """p50, p95, p99, max of request latency (None where refused requests make it
        unbounded), as observed values (the empirical quantile)."""
        if self.latency_s.size == 0:
            return {"p50": None, "p95": None, "p99": None, "max": None}
        qs = np.quantile(self.latency_s, [0.5, 0.95, 0.99, 1.0], method="inverted_cdf")
        return {
            k: (float(v) if np.isfinite(v) else None)
            for k, v in zip(("p50", "p95", "p99", "max"), qs, strict=True)
        }

    def attainment(self, slo_s: float | None) -> float | None:
        """Share of requests served within `slo_s` (None without an SLO)."""
        if slo_s is None or self.latency_s.size == 0:
            return None
        return float(np.mean(self.latency_s <= slo_s))

    def summary(self, slo_s: float | None) -> dict[str, Any]:
        """The JSON object `moelambda traffic --json` prints."""
        cold = {name: n for name, n in self.cold_starts.items() if n}
        return {
            "requests": int(self.latency_s.size),
            "batches": int(self.batch_tokens.size),
            "refused_batches": self.refused_batches,
            "failed_batches": self.failed_batches,
            "tokens": self.tokens,
            "period_s": self.period_s,
            "latency_s": self.quantiles(),
            "slo_s": slo_s,
            "slo_attainment": self.attainment(slo_s),
            "cold_starts": {"count": int(sum(self.cold_starts.values())), "per_function": cold},
            "peak_environments": self.peak_environments,
            "reserved_concurrency_reached": self.over_reserved,
            "bill_usd": self.bill_usd,
            "front_door": self.front_door,
            "managed_instances": self.managed,
            "wall_s": round(self.wall_s, 3),
            "notes": self.notes,
        }


def batches_of(
    arrivals: Arrivals, policy: BatchPolicy, front_door: FrontDoor | None = None
) -> tuple[np.ndarray, ...]:
    """(first request of each execution plus the end, delivery seconds, tokens, delivery
    index) of `arrivals`: by the deployed rule with `front_door` (`ground.frontdoor`), else
    with the policy's wait as given and no batch-size limit; without a front door at all
    (`policy.front_door` False), only simultaneous requests share."""
    if not policy.front_door:
        window, records = 0.0, max(arrivals.requests, 1)
    elif front_door is not None:
        window, records = front_door.deployed(policy)
    else:
        window, records = float(policy.max_wait_s), max(arrivals.requests, 1)
    return batch_requests(
        np.ascontiguousarray(arrivals.times_s, dtype=np.float64),
        np.ascontiguousarray(arrivals.tokens, dtype=np.int64),
        int(policy.max_tokens),
        float(window),
        int(records),
    )


def _front_door(
    door: FrontDoor,
    policy: BatchPolicy,
    arrivals: Arrivals,
    first: np.ndarray,
    delivery: np.ndarray,
    delivered_at: np.ndarray,
    platform: Platform,
) -> tuple[np.ndarray, np.ndarray, dict[str, float], dict[str, Any]]:
    """(each execution's start after its delivery, whether its input is stored, the front
    door's bill by item, its summary).

    The batcher starts a delivery's executions one after another (`start_s` each, plus `put_s`
    for an input too large to travel inline, `ground.frontdoor.execution_input_bytes`), after
    its INIT when its environment is cold: the first delivery, or one after an idle gap longer
    than the idle time. Its requests, GB-seconds and INIT, the SQS requests (the pollers' empty
    long polls over the period too) and the inputs' S3 PUTs are billed
    (`ground.frontdoor.planned`).
    """
    window, records = door.deployed(policy)
    count = int(delivery[-1]) + 1 if delivery.size else 0
    executions = np.bincount(delivery, minlength=count)
    members = np.diff(first)  # requests per execution
    messages = np.bincount(delivery, weights=members, minlength=count).astype(np.int64)
    size = np.add.reduceat(arrivals.tokens, first[:-1]) if delivery.size else np.zeros(0)
    inline = frontdoor.MESSAGE_ENVELOPE_BYTES + frontdoor.REQUEST_ROW_BYTES * members
    stored = inline + frontdoor.MESSAGE_BYTES_PER_TOKEN * size > door.input_limit_bytes
    step = door.start_s + np.where(stored, door.put_s, 0.0)  # (executions,)
    within = np.cumsum(step)  # each execution's start within its delivery, from the first
    starts_of = np.concatenate([[0], np.cumsum(executions)[:-1]]).astype(np.int64)
    before = np.concatenate([[0.0], within])[starts_of][delivery]
    at = np.zeros(count)
    at[delivery] = delivered_at
    busy = np.bincount(delivery, weights=step, minlength=count)
    gaps = at[1:] - (at[:-1] + busy[:-1])
    cold = np.concatenate([[count > 0], gaps > platform.idle_s])[:count].astype(bool)
    wait_s, billed_s = init_phase(door.batcher_init_s, platform.init_limit_s)
    offset = np.where(cold[delivery], wait_s, 0.0) + within - before
    usage = frontdoor.planned(
        [frontdoor.message_bytes(int(n)) for n in arrivals.tokens],
        messages.tolist(),
        int(delivery.size),
        int(stored.sum()),
        chunk_bytes=door.chunk_bytes,
        receive_max=door.receive_max,
    )
    idle_polls = door.idle_pollers * arrivals.period_s / door.long_poll_s
    gb = door.batcher_memory_mb / platform.billing_mb_per_gb
    gb_s = float(busy.sum()) * gb
    init_gb_s = float(cold.sum()) * billed_s * gb if platform.init_billed else 0.0
    bill = {
        "sqs_usd": (usage.sqs_requests + idle_polls) * door.sqs_request_usd,
        "batcher_usd": usage.batcher_invocations * platform.request_usd
        + gb_s * platform.gb_second_usd,
        "batcher_init_usd": init_gb_s * platform.gb_second_usd,
        "inputs_s3_usd": usage.stored * door.s3_put_usd,
        "results_s3_usd": usage.results * door.s3_put_usd,
    }
    summary = {
        "window_s": window,
        "records_per_delivery": records,
        "deliveries": count,
        "batcher_cold_starts": int(cold.sum()),
        "usage": usage.as_dict() | {"sqs_idle_receive_requests": round(idle_polls)},
        "bill_usd": bill,
    }
    return offset, stored, bill, summary


def front_door_only(
    arrivals: Arrivals, policy: BatchPolicy, platform: Platform
) -> tuple[np.ndarray, dict[str, float]]:
    """The front door of `platform` serving `arrivals` under `policy`, batched, started and
    billed as `simulate` does it, for a deployment the simulator does not replay function by
    function (GPU-backed candidates, `planner.hardware.gpu_model.front_door`): each request's
    seconds from its arrival to its execution's start, and the door's bill by item.

    Raises:
        ValueError: The platform has no front door (its calibration prices none).
    """
    door = platform.front_door
    if door is None:
        raise ValueError("a platform without a front door")
    first, dispatch, _, delivery = batches_of(arrivals, policy, door)
    started_after, _, bill, _ = _front_door(
        door, policy, arrivals, first, delivery, dispatch, platform
    )
    execution = np.repeat(np.arange(first.size - 1), np.diff(first))
    return (dispatch + started_after)[execution] - arrivals.times_s, bill


def _capacity_arrays(
    capacity: list[Capacity] | None, reserved: np.ndarray
) -> tuple[np.ndarray, ...]:
    count = reserved.size
    policies = capacity or [Capacity()] * count
    if len(policies) != count:
        raise ValueError(f"{len(policies)} capacity policies for {count} functions")
    provisioned = np.array([c.provisioned if c.kind == "provisioned" else 0 for c in policies])
    interval = np.array([c.warmer_interval_s if c.kind == "warmer" else 0.0 for c in policies])
    pings = np.array([c.warmer_concurrency if c.kind == "warmer" else 0 for c in policies])
    limit = np.array(
        [r if c.reserved is None else c.reserved for c, r in zip(policies, reserved, strict=True)]
    )
    managed = np.array([c.environments if c.kind == "managed" else 0 for c in policies])
    return (
        provisioned.astype(np.int64),
        interval.astype(float),
        pings.astype(np.int64),
        limit.astype(np.int64),
        managed.astype(np.int64),
    )


def simulate(
    model: WorkflowModel,
    arrivals: Arrivals,
    policy: BatchPolicy,
    platform: Platform,
    capacity: list[Capacity] | None = None,
    *,
    reserve: bool = True,
) -> TrafficResult:
    """Replay `arrivals` through the deployment `model` describes (see the module docstring).

    Args:
        model: The plan's workflow over batch sizes (`workflow.workflow_model`).
        arrivals: The request stream.
        policy: The front door's batching.
        platform: INIT per function, the idle time and prices.
        capacity: One policy per function (`model.functions` order). Defaults to None: none.
        reserve: Whether the stack reserves concurrency (each expert function's
            `max_replicas`, or its capacity's `reserved`), which throttles invocations beyond
            it. Defaults to True, as `moelambda synth` emits the stack; False is
            `--no-reserve-concurrency`. A managed function's environments limit it either way.
    """
    started = time.perf_counter()
    fns = model.functions
    provisioned, interval, ping_count, reserved, environments = _capacity_arrays(
        capacity, fns.reserved
    )
    if not reserve:
        reserved = np.zeros_like(reserved)
    if provisioned.any() and platform.provisioned_allocated_usd is None:
        raise ValueError("provisioned concurrency without its prices")
    managed = environments > 0
    instances = None
    if managed.any():
        if platform.managed is None:
            raise ValueError("managed capacity without Lambda Managed Instances' prices")
        instances = platform.managed.choose(fns.memory_mb[managed], environments[managed])
        if instances is None:
            raise ValueError("a managed environment larger than every instance type")
    # A managed function: its environments always warm (as provisioned), and no more of them.
    reserved = np.where(managed, environments, reserved)
    door = platform.front_door if policy.front_door else None
    first, dispatch, size, delivery = batches_of(arrivals, policy, door)
    door_bill: dict[str, float] = {}
    door_summary: dict[str, Any] = {}
    stored = np.ones(size.size, dtype=bool)  # without a front door every input is stored
    if door is not None:
        started_after, stored, door_bill, door_summary = _front_door(
            door, policy, arrivals, first, delivery, dispatch, platform
        )
        dispatch = dispatch + started_after
    batch_of = np.repeat(np.arange(size.size), np.diff(first))
    served = size <= model.feasible_tokens
    wait_s, billed_init_s = platform.cold_s()
    tokens = size[served]
    grid_i, grid_w = model.interpolate(tokens)
    delay_served, failed, stage_delay, cold_b, cold_p, pings, pc_seconds, peak, hist = run_pools(
        dispatch[served],
        grid_i,
        grid_w,
        tokens.astype(np.int64),
        fns.stage,
        model.offset_s,
        model.duration_s,
        model.replicas,
        wait_s,
        provisioned + environments,
        reserved,
        np.asarray(retry_waits(), dtype=float),
        platform.idle_s,
        interval,
        ping_count,
        platform.ping_s,
        arrivals.period_s,
    )
    warm = model.at(model.latency_s, tokens)
    results_s = np.zeros(tokens.size)
    if door is not None:  # the tail writes each request's result: rounds of parallel PUTs
        results_s = frontdoor.result_write_s(np.diff(first)[served], door.put_s)
        warm = warm + results_s
    finish = np.full(size.size, np.inf)
    finish[served] = np.where(failed, np.inf, dispatch[served] + warm + delay_served)
    latency = finish[batch_of] - arrivals.times_s
    gb = fns.memory_mb / platform.billing_mb_per_gb
    gb_lambda = np.where(managed, 0.0, gb)  # what Lambda bills per second of each function
    rate = platform.gb_second_usd
    bill = {name: float(model.at(model.bill_usd[name], tokens).sum()) for name in BILL_ITEMS}
    if door is not None:  # the head's GET of an input that came inline is not made
        bill["s3_usd"] -= float((~stored[served]).sum()) * door.s3_get_usd
    init_gb_s = (
        ((cold_b + cold_p) * billed_init_s * gb_lambda).sum() if platform.init_billed else 0.0
    )
    bill["init_usd"] = float(init_gb_s * rate)
    bill["cold_wait_usd"] = float(
        _waiting_gb_s(model, stage_delay, gb_lambda) * rate
        + model.express_usd_per_s * float(delay_served.sum())
    )
    period = arrivals.period_s
    if platform.provisioned_allocated_usd is not None:
        assert platform.provisioned_duration_usd is not None
        allocated = float((provisioned * gb).sum() * period * platform.provisioned_allocated_usd)
        credit = float((pc_seconds * gb_lambda).sum() * (platform.provisioned_duration_usd - rate))
        bill["provisioned_usd"] = allocated + credit
    else:
        bill["provisioned_usd"] = 0.0
    bill["warmers_usd"] = float(
        (
            pings
            * (
                platform.request_usd
                + platform.ping_s * gb * rate
                + platform.scheduler_invocation_usd
            )
        ).sum()
    )
    if door is not None:  # the tail writes the results, or the driver that runs it
        tail_gb = gb_lambda[fns.role.index("tail" if "tail" in fns.role else "driver")]
        door_bill["results_tail_usd"] = float(results_s.sum() * tail_gb * rate)
    bill["front_door_usd"] = float(sum(door_bill.values()))
    managed_summary: dict[str, Any] = {}
    if instances is not None:
        assert platform.managed is not None
        # The cost model's items bill every invocation on Lambda (duration and a request):
        # a managed function's are billed by the instances instead.
        invocations = model.replicas[tokens][:, managed].sum(axis=0).astype(float)
        lambda_usd = float(
            (pc_seconds[managed] * gb[managed]).sum() * rate
            + invocations.sum() * platform.request_usd
        )
        bill["managed_instances_usd"] = (
            platform.managed.bill_usd(instances, period, float(invocations.sum())) - lambda_usd
        )
        managed_summary = {
            "instance_type": instances.instance_type,
            "instances": instances.instances,
            "environments": {
                n: int(environments[f]) for f, n in enumerate(fns.names) if managed[f]
            },
        }
    else:
        bill["managed_instances_usd"] = 0.0
    bill["total_usd"] = sum(bill.values())
    total_tokens = arrivals.total_tokens
    bill["per_million_tokens_usd"] = (
        bill["total_usd"] / total_tokens * 1e6 if total_tokens else 0.0
    )
    names = fns.names
    notes = []
    if policy.front_door and door is None:
        notes.append(
            "the front door (the queue and the batching function) is not priced: the "
            "calibration lacks its parameters, and the wait is taken as given"
        )
    elif door is not None and door_summary["window_s"] != policy.max_wait_s:
        notes.append(
            f"the event source batches by whole seconds: a {policy.max_wait_s:g} s wait is "
            f"deployed, and simulated, as {door_summary['window_s']} s"
        )
    if instances is not None:
        assert platform.managed is not None
        sources = platform.managed.sources_note(instances.instance_type)
        if sources is not None:
            notes.append(sources)
    return TrafficResult(
        latency_s=latency,
        batch_of=batch_of,
        batch_tokens=size,
        cold_starts={n: int(cold_b[f] + cold_p[f]) for f, n in enumerate(names)},
        peak_environments={n: int(peak[f]) for f, n in enumerate(names)},
        environments_in_use=hist,
        bill_usd=bill,
        refused_batches=int((~served).sum()),
        failed_batches=int(failed.sum()),
        over_reserved={
            n: {"peak": int(peak[f]), "reserved": int(reserved[f])}
            for f, n in enumerate(names)
            if reserved[f] and peak[f] >= reserved[f]
        },
        tokens=total_tokens,
        period_s=period,
        wall_s=time.perf_counter() - started,
        notes=notes,
        front_door=door_summary,
        managed=managed_summary,
    )


def _waiting_gb_s(model: WorkflowModel, stage_delay: np.ndarray, gb: np.ndarray) -> float:
    """GB-s billed while functions wait on others' cold starts: a direct gate on its experts'
    stage, a pipelined replica (all of its replicas) on its gate's stage, a driver on every
    stage after its own."""
    fns = model.functions
    total = 0.0
    for f in np.flatnonzero(fns.waits_on_later_stages):
        total += float(stage_delay[fns.stage[f] + 1 :].sum()) * gb[f]
    for f in np.flatnonzero(fns.waits_on_next_stage):
        total += stage_delay[fns.stage[f] + 1] * gb[f]
    for f in np.flatnonzero(fns.waits_on_previous_stage):
        total += stage_delay[fns.stage[f] - 1] * gb[f] * int(model.replicas[-1, f])
    return float(total)
