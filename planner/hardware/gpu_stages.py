"""A chain of GPU-backed Lambda functions, each running a range of whole layers: `stages`.

A model larger than Lambda's largest accelerator (48 GiB) cannot sit in one GPU function, and
splitting it by experts (`planner.hardware.gpu_model`'s driver and expert groups) sends every
routed row of every remote expert across the network at each layer: at Lambda's bandwidths that is
most of a request's time. Splitting it by layers sends one hidden state per boundary instead. Stage
s holds layers [a_s, b_s) whole (their attention blocks, routers and every expert; the first also
the embeddings, the last the final norm and LM head), filled greedily in layer order up to the
largest accelerator size the GPU type offers (the fewest contiguous stages that fit), and asks for
the smallest size that holds it.

One request, n tokens (seconds): each stage starts warm (T^str), reads its input from S3 (the
token ids, 8 n bytes, for the first; the hidden states, n x hidden x 4 bytes, for the others:
T^dl + bytes / B^s), computes its layers on the GPU (`GpuSpeed`: every expert local, in turn,
on its routed rows), and writes its output (T^dl + bytes / B^s). The state machine runs the
stages one after another (an Express workflow of one Task per stage). Each stage is a c_s-server
FCFS queue of constant service time; the departures of one are the arrivals of the next
(a tandem queue, `planner.hardware.gpu_model.driver_servers` per stage). Servers are added to
the stage whose queue waits longest until the request's p99 meets the SLO.

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
    BF16,
    DRIVER_VCPUS,
    GpuSpeed,
    HardwarePlan,
    Stream,
    _Model,
    activations_gib,
    driver_servers,
    express_usd,
    front_door,
    runtime_gib,
)

if TYPE_CHECKING:
    from planner.calibration import Calibration
    from planner.traffic.managed import ManagedPrices

__all__ = ["stage_ranges", "stages_candidate"]

_MAX_ROUNDS = 100_000  # servers added before a stream is declared beyond any pool


def stage_ranges(
    model: _Model, largest_gib: float, fixed_gib: float
) -> list[tuple[int, int, float]] | str:
    """Contiguous layer ranges (start, stop, GiB held with `fixed_gib` of runtime and a batch's
    tensors), greedily filled up to `largest_gib`; a string says why none fits."""
    per_layer = (model.layer_params + model.expert_params.sum(axis=1)) * BF16 / 2**30
    head = model.head_bytes / 2**30
    tail = model.tail_params * BF16 / 2**30
    fixed = fixed_gib
    ranges: list[tuple[int, int, float]] = []
    start, held = 0, fixed + head
    for layer, gib in enumerate(per_layer):
        last = layer == per_layer.size - 1
        need = gib + (tail if last else 0.0)
        if held + need > largest_gib + 1e-9:
            if layer == start:
                return (
                    f"layer {layer} alone ({need:.1f} GiB) exceeds a {largest_gib:g}-GiB "
                    "accelerator"
                )
            ranges.append((start, layer, held))
            start, held = layer, fixed
            if held + need > largest_gib + 1e-9:
                return f"layer {layer} alone ({need:.1f} GiB) exceeds {largest_gib:g} GiB"
        held += need
    ranges.append((start, per_layer.size, held))
    return ranges


def _service_s(
    model: _Model, speed: GpuSpeed, cal: Calibration, ranges: list[tuple[int, int, float]], n: int
) -> np.ndarray:
    """Each stage's warm seconds for one request of `n` tokens (see the module docstring)."""
    hidden_bytes = n * model.hidden * 4
    out = []
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
    return np.array(out)


def _tandem(arrivals: np.ndarray, service: np.ndarray, servers: np.ndarray) -> np.ndarray:
    """(stages, requests) waits of each request at each stage, and the end-to-end latency
    as the last row."""
    waits = np.empty((service.size + 1, arrivals.size))
    t = arrivals
    for s, (cost, count) in enumerate(zip(service, servers, strict=True)):
        latency = driver_servers(t, float(cost), int(count))
        waits[s] = latency - cost
        t = t + latency
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
) -> HardwarePlan:
    """The cheapest chain of layer stages on `pool`'s GPU type meeting the p99 SLO."""

    largest = max(sizes)
    runtime = runtime_gib(cal)
    ranges = stage_ranges(
        model, largest, runtime + activations_gib(model, stream.prompt_tokens, cal)
    )
    if isinstance(ranges, str):
        return HardwarePlan("gpu", False, ranges, math.inf, None, math.inf, math.inf, {})
    gib = [next(s for s in sizes if s >= held - 1e-9) for _, _, held in ranges]
    service = _service_s(model, speed, cal, ranges, stream.prompt_tokens)
    door_usd, door_s = front_door(cal, stream)
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
        p99 = float(np.quantile(waits[-1], 0.99)) + door_s
        if p99 <= slo_s:
            break
        servers[int(np.argmax(np.quantile(waits[:-1], 0.99, axis=1)))] += 1
    else:
        return HardwarePlan(
            "gpu", False, "no pool meets the SLO", latency, None, math.inf, math.inf, detail
        )
    choice = pool.choose(
        np.full(len(ranges), DRIVER_VCPUS * cal.mb_per_vcpu), servers, np.array(gib)
    )
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
    busy = (
        requests
        * float(service @ np.ones_like(service))
        / max(1.0, float(servers.sum()) * stream.period_s)
    )
    detail.update(
        {
            "instance_type": choice.instance_type,
            "instances": choice.instances,
            "stage_environments": servers.tolist(),
            "scaling_target": round(busy, 4),
            "pool_usd": round(instances_usd, 6),
            "front_door_usd": round(door_usd, 6),
        }
    )
    tokens = requests * stream.prompt_tokens
    return HardwarePlan("gpu", True, None, latency, p99, bill, bill / max(tokens, 1) * 1e6, detail)
