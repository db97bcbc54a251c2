"""A chain of GPU-backed Lambda functions, each running a range of whole layers: `stages`.

A model larger than Lambda's largest accelerator (48 GiB) cannot sit in one GPU function, and
splitting it by experts (`planner.hardware.gpu_model`'s driver and expert groups) sends every
routed row of every remote expert across the network at each layer: at Lambda's bandwidths that is
most of a request's time. Splitting it by layers sends one hidden state per boundary instead. Stage
s holds layers [a_s, b_s) whole (their attention blocks, routers and every expert; the first also
the embeddings, the last the final norm and LM head), filled greedily in layer order up to the
room of the largest accelerator size the GPU type offers (the fewest contiguous stages that fit),
and asks for the smallest size whose room holds it: a size's room is at most what the device
exposes (`GpuSpeed.room_gib`: a 48-GiB function on an L40S has 44.99 GiB), less the runtime and a
batch's tensors.

One request, n tokens (seconds): each stage starts warm (T^str), reads its input from S3 (the
token ids, 8 n bytes, for the first; the hidden states, n x hidden values at the wire's width,
`Weights.wire_bytes`, 2 bytes for a bf16 stack and 4 otherwise, for the others:
T^dl + bytes / B^s), computes its layers on the GPU (`GpuSpeed`: every expert local, in turn,
on its routed rows), and writes its output (T^dl + bytes / B^s). The state machine runs the
stages one after another (an Express workflow of one Task per stage). Each stage is a pool of c_s
started environments serving one request at a time, which throttles a request finding all busy
and retries it as the state machine does, failing it after the last retry
(`planner.hardware.gpu_model.pool_latency` per stage); a request enters stage s + 1 when it
leaves stage s. From Little's law's bound per stage, an environment is added to the stage that
failed the most requests, else to the one whose retries waited longest (p99), until the p99
latency meets the SLO (a failed request's latency infinite, within the p99, as the traffic
simulator counts it). The scaling target is the stages' GPU computing share
of the period (their layers, not their S3 reads and writes).

The bill of the period: the stages' environments (one GPU each) packed onto the cheapest GPU
instance type (`ManagedPrices`, at least its default instances) for the whole period, one
Lambda request per stage per request, the S3 requests (the input's GET, a PUT and a GET per
boundary, the output's PUT) and the Express executions.

This shape is planned and priced only: the handlers run one driver or the fan-out workflow
today, so `moelambda synth` cannot emit it yet (`HardwarePlan.detail["deployable"]`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.hardware.gpu_model import (
    DRIVER_VCPUS,
    GpuSpeed,
    HardwarePlan,
    Stream,
    _Model,
    activations_gib,
    express_usd,
    front_door,
    host_memory_mb,
    pool_latency,
    runtime_gib,
    scaling_target,
)

if TYPE_CHECKING:
    from planner.calibration import Calibration
    from planner.traffic.managed import ManagedPrices

__all__ = ["stage_ranges", "stages_candidate"]

_MAX_ROUNDS = 100_000  # servers added before a stream is declared beyond any pool


def stage_ranges(
    model: _Model, room_gib: float, fixed_gib: float, bound: str | None = None
) -> list[tuple[int, int, float]] | str:
    """Contiguous layer ranges (start, stop, GiB held with `fixed_gib` of runtime and a batch's
    tensors), greedily filled up to `room_gib`; a string says why none fits, naming the room
    as `bound` (default: a `room_gib` accelerator)."""
    per_layer = model.device_gib(model.layer_params + model.expert_params.sum(axis=1))
    head = model.device_gib(model.head_params)
    tail = model.device_gib(model.tail_params)
    ranges: list[tuple[int, int, float]] = []
    start, held = 0, fixed_gib + head
    for layer, gib in enumerate(per_layer):
        last = layer == per_layer.size - 1
        need = gib + (tail if last else 0.0)
        if held + need > room_gib + 1e-9 and layer > start:
            ranges.append((start, layer, held))
            start, held = layer, fixed_gib
        if held + need > room_gib + 1e-9:
            return (
                f"layer {layer} alone ({need:.1f} GiB with {held:.1f} GiB of runtime, "
                f"activations{' and embeddings' if layer == 0 else ''}) exceeds "
                f"{bound or f'a {room_gib:g}-GiB accelerator'}"
            )
        held += need
    ranges.append((start, per_layer.size, held))
    return ranges


def _service_s(
    model: _Model, speed: GpuSpeed, cal: Calibration, ranges: list[tuple[int, int, float]], n: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each stage's warm seconds for one request of `n` tokens (see the module docstring), and
    of them the seconds its GPU computes."""
    hidden_bytes = n * model.token_bytes
    out = []
    gpu = []
    for s, (a, b, _) in enumerate(ranges):
        rows = n * model.share[a:b]
        compute = float(
            speed.seconds(model.layer_params[a:b], np.full(b - a, float(n))).sum()
            + speed.seconds(model.expert_params[a:b], rows).sum()
        )
        if s == len(ranges) - 1:
            compute += float(speed.seconds(np.array(model.tail_params), np.array(float(n))))
        read = 8 * n if s == 0 else hidden_bytes
        write = n * model.token_bytes if s == len(ranges) - 1 else hidden_bytes
        io = 2 * cal.s3_access_delay_s + (read + write) / cal.s3_bandwidth_bytes_per_s
        out.append(cal.warm_start_s + io + compute)
        gpu.append(compute)
    return np.array(out), np.array(gpu)


def _tandem(arrivals: np.ndarray, service: np.ndarray, servers: np.ndarray) -> np.ndarray:
    """(stages, requests) waits of each request's throttled retries at each stage (inf at the
    stage where it failed, 0 at the stages it never reached), and the end-to-end latency as the
    last row (inf: failed). A request enters stage s + 1 when it leaves stage s."""
    waits = np.zeros((service.size + 1, arrivals.size))
    t = np.array(arrivals, float)
    for s, (cost, count) in enumerate(zip(service, servers, strict=True)):
        alive = np.isfinite(t)
        latency = pool_latency(t[alive], float(cost), int(count))
        waits[s, alive] = latency - cost
        t[alive] += latency
    waits[-1] = t - arrivals
    return waits


def stages_candidate(
    model: _Model,
    speed: GpuSpeed,
    pool: ManagedPrices,
    cal: Calibration,
    stream: Stream,
    slo_s: float,
    sizes: list[int],
    door: tuple[float, float] | None = None,
) -> HardwarePlan:
    """The cheapest chain of layer stages on `pool`'s GPU type meeting the p99 SLO, each stage
    within the room of the largest size on it (`GpuSpeed.room_gib`); `door` the stream's front
    door (`front_door`: USD, p99 wait), simulated here when not given."""

    largest = max(sizes)
    runtime = runtime_gib(cal)
    ranges = stage_ranges(
        model,
        speed.room_gib(largest),
        runtime + activations_gib(model, stream.prompt_tokens, cal),
        speed.bound(largest),
    )
    if isinstance(ranges, str):
        return HardwarePlan("gpu", False, ranges, math.inf, None, math.inf, math.inf, {})
    gib = [speed.smallest_size(sizes, held) for *_, held in ranges]
    service, gpu_s = _service_s(model, speed, cal, ranges, stream.prompt_tokens)
    door_usd, door_s = door if door is not None else front_door(cal, stream)
    latency = float(service.sum()) + door_s
    detail: dict[str, Any] = {
        "shape": "stages",
        "deployable": False,
        "stages": [[a, b] for a, b, _ in ranges],
        "stage_accelerator_gib": gib,
        "load_s": {
            "slowest_stage": round(
                max(held - runtime for *_, held in ranges) * 2**30 / cal.s3_bandwidth_bytes_per_s,
                1,
            )
        },
    }
    if latency > slo_s:
        return HardwarePlan(
            "gpu", False, f"a warm request takes {latency:.1f} s, over the SLO",
            latency, None, math.inf, math.inf, detail,
        )  # fmt: skip
    arrivals = stream.arrivals_s
    servers = np.maximum(1, np.ceil(stream.rate * service)).astype(np.int64)
    p99 = latency
    for _ in range(_MAX_ROUNDS):
        if arrivals.size == 0:
            break
        waits = _tandem(arrivals, service, servers)
        p99 = float(np.quantile(waits[-1], 0.99, method="inverted_cdf")) + door_s
        if p99 <= slo_s:
            break
        failed = np.isinf(waits[:-1]).sum(axis=1)
        # the stage that failed most requests, else the one whose retries waited longest
        worst = failed if failed.any() else np.quantile(waits[:-1], 0.99, axis=1)
        servers[int(np.argmax(worst))] += 1
    else:
        return HardwarePlan(
            "gpu", False, "no pool meets the SLO", latency, None, math.inf, math.inf, detail
        )
    layers = np.arange(model.layer_params.size)
    host_mb = [
        host_memory_mb(
            model, cal, DRIVER_VCPUS, ((layers >= a) & (layers < b))[:, None],
            (layers >= a) & (layers < b), head=s == 0, tail=s == len(ranges) - 1,
        )
        for s, (a, b, _) in enumerate(ranges)
    ]  # fmt: skip
    choice = pool.choose(np.array(host_mb), servers, np.array(gib))
    if choice is None:
        return HardwarePlan(
            "gpu", False, "no GPU instance type holds a stage", latency, p99, math.inf,
            math.inf, detail,
        )  # fmt: skip
    requests = arrivals.size
    instances_usd = pool.bill_usd(choice, stream.period_s, requests * len(ranges))
    boundaries = len(ranges) - 1
    s3 = cal.s3_get_request_usd + cal.s3_put_request_usd
    per_request = s3 * (1 + boundaries) + cal.express_request_usd + express_usd(cal, latency)
    bill = instances_usd + requests * per_request + door_usd
    detail.update(
        {
            "instance_type": choice.instance_type,
            "instances": choice.instances,
            "stage_environments": servers.tolist(),
            "scaling_target": scaling_target(
                requests, float(gpu_s.sum()), int(servers.sum()), stream.period_s
            ),
            "pool_usd": round(instances_usd, 6),
            "front_door_usd": round(door_usd, 6),
        }
    )
    tokens = requests * stream.prompt_tokens
    return HardwarePlan("gpu", True, None, latency, p99, bill, bill / max(tokens, 1) * 1e6, detail)
