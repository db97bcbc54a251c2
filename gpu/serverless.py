"""A decoder on a GPU platform billed per second (Modal): what `bench generate` sets beside
Lambda for the same arrivals.

Such a platform runs a container per GPU and bills it per second while it is up, whether it
computes or waits: from its start, through the cold start (the container, then the model's
weights onto the GPU), to its scale-down once it has idled `idle_timeout_s`. Its list prices,
cold-start and idle assumptions live in planner/data/gpu_catalogue.json under
`serverless_platforms`, each with its source and `source_kind`; the GPU's speed and usable
memory are the catalogue type's, and a step's time is the GPU backend's model
(`gpu.generation.decode_step_s`: each weight a step uses read once at `memory_gbps`, the rows
computed at `mfu` of `peak_tflops`), so the platform is priced on the same physics as the GPU
rows it sits beside.

A container holds the model in bf16 on the fewest GPUs of a type that hold it (`fit`: 1, 2,
4 ... up to the platform's `max_gpus_per_container`, placed as `gpu.compare` places them): the
weights, the CUDA context (the calibration's `gpu_runtime_gib`) and the KV cache of one
sequence at least must fit the type's usable memory, or the model does not run there and the
row says so. It batches continuously
(`simulate_containers`): a request joins a container with a free slot (the fullest, so the
others can idle out) or starts a new one; its prompt is prefilled ahead of the running decode
steps, which pause meanwhile (a prefill of P tokens takes the step model at P rows); then it
decodes one token per step with every sequence in flight, a step of B sequences taking
step(B). Slots per container are the most sequences whose KV cache fits (at the stream's p99
context) and whose step meets the TPOT SLO, at most `max_batch`.

Left out, as `gpu.generation` leaves them out: the attention's reads of the KV cache, chunked
prefill, and a platform's cap on concurrent GPUs (Modal: 10 on Starter, 50 on Team; the peak
is reported); and Modal's opt-in GPU memory snapshots, which cut cold starts.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import TYPE_CHECKING, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ground.errors import UsageError

if TYPE_CHECKING:
    from gpu.cluster import Catalogue, GpuType
    from ground.manifest import Manifest
    from planner.traffic.spec import Arrivals

__all__ = [
    "ContainerRun",
    "Fit",
    "ServerlessPlatform",
    "fit",
    "load_platform",
    "serverless_generation",
    "simulate_containers",
]

_GIB = 2**30
_BF16 = 2  # bytes per weight on GPUs, as gpu.generation holds them
_PREFILL_GRID = 48  # prompt lengths the prefill time is computed at, then interpolated


class _Figure(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: float = Field(ge=0)
    unit: str
    source: str
    source_kind: str
    as_of: str


class ServerlessPlatform(BaseModel):
    """One GPU platform billed per second: its list prices and its container assumptions."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str
    billing: str
    gpus: dict[str, _Figure]  # catalogue type -> USD per GPU-second
    cpu_core_usd_per_s: _Figure
    memory_gib_usd_per_s: _Figure
    container_cpu_cores: _Figure
    container_memory_gib: _Figure
    container_start_s: _Figure
    weights_load_gbps: _Figure
    idle_timeout_s: _Figure
    billing_increment_s: _Figure
    max_batch: _Figure
    max_gpus_per_container: _Figure

    def usd_per_second(self, gpu: str, count: int = 1) -> float:
        """What one container with `count` GPUs of `gpu` costs per second up: the GPUs, its
        CPU cores and its memory."""
        host = (
            self.container_cpu_cores.value * self.cpu_core_usd_per_s.value
            + self.container_memory_gib.value * self.memory_gib_usd_per_s.value
        )
        return count * self.gpus[gpu].value + host

    def cold_start_s(self, weight_bytes: float) -> float:
        """Seconds from a container's start to its first prefill: the container, then the
        weights onto the GPU."""
        return self.container_start_s.value + weight_bytes / (self.weights_load_gbps.value * 1e9)

    def sources(self) -> dict[str, Any]:
        """Every figure with its source, for a report."""
        return self.model_dump(exclude={"name", "url", "billing"})


@cache
def _platforms() -> dict[str, ServerlessPlatform]:
    import json

    text = resources.files("planner").joinpath("data/gpu_catalogue.json").read_text()
    raw = json.loads(text).get("serverless_platforms", {})
    return {name: ServerlessPlatform.model_validate(entry) for name, entry in raw.items()}


def load_platform(name: str = "modal") -> ServerlessPlatform:
    """A platform of planner/data/gpu_catalogue.json's `serverless_platforms`.

    Raises:
        UsageError: No such platform.
    """
    platforms = _platforms()
    if name not in platforms:
        raise UsageError(
            f"no serverless GPU platform '{name}' in planner/data/gpu_catalogue.json.",
            f"use one of {', '.join(sorted(platforms)) or '(none)'}.",
        )
    return platforms[name]


@dataclass(frozen=True)
class Fit:
    """Whether a model runs on n GPUs of a type, and how many sequences' KV cache fit."""

    fits: bool
    gpus: int
    weight_gib: float  # the fullest GPU's
    usable_gib: float  # per GPU
    runtime_gib: float
    kv_slots: int  # sequences at `context` tokens whose keys and values fit beside the weights
    reason: str


def fit(
    manifest: Manifest,
    kind: GpuType,
    *,
    runtime_gib: float,
    kv_bytes_per_token: float,
    context: int,
    gpus: int = 1,
) -> Fit:
    """Whether `manifest` in bf16 fits `gpus` GPUs of `kind` as `gpu.compare` places it (the
    non-MoE weights on every GPU, expert e on GPU e mod n), each beside the CUDA context, with
    room for one sequence of `context` tokens at least (its keys and values spread over them);
    and how many such sequences fit."""
    shared = sum(manifest.params(s) for s in manifest.stages if s.role != "expert") * _BF16
    experts = np.zeros(gpus)
    for stage in manifest.stages:
        if stage.role == "expert":
            experts[stage.expert % gpus] += manifest.params(stage) * _BF16
    fullest = shared + float(experts.max())
    room = gpus * ((kind.usable_gib - runtime_gib) * _GIB - fullest)
    slots = max(0, math.floor(room / (kv_bytes_per_token * context)))
    reason = ""
    if slots < 1:
        total = (shared * gpus + experts.sum()) / _GIB
        reason = (
            f"does not fit {gpus} x {kind.gpu}: {total:,.1f} GiB of bf16 weights "
            f"({fullest / _GIB:,.1f} on the fullest GPU), {runtime_gib:g} GiB of CUDA context "
            f"each and one sequence's KV cache exceed {kind.usable_gib:,.1f} GiB a GPU"
        )
    return Fit(slots >= 1, gpus, fullest / _GIB, kind.usable_gib, runtime_gib, slots, reason)


@dataclass
class _Container:
    index: int
    start: float
    ready: float
    clock: float
    idle_since: float
    queue: deque[int] = field(default_factory=deque)
    prefilling: tuple[int, float] | None = None  # (request, end)
    active: list[tuple[float, int]] = field(default_factory=list)  # heap (finish, request)
    progress: float = 0.0  # decode steps the container has run (fractional between events)
    end: float | None = None
    prefill_s: float = 0.0
    decode_s: float = 0.0

    @property
    def occupancy(self) -> int:
        return len(self.queue) + (self.prefilling is not None) + len(self.active)


@dataclass(frozen=True)
class ContainerRun:
    """What `simulate_containers` found: per request and per container."""

    ttft_s: np.ndarray  # (N,) arrival to the first token (the prefill's)
    tpot_s: np.ndarray  # (N,) mean seconds per later token; NaN for one-token generations
    e2e_s: np.ndarray  # (N,)
    container: np.ndarray  # (N,) the container that served each request
    start_s: np.ndarray  # (C,) when each container started (billing starts)
    end_s: np.ndarray  # (C,) when each scaled down (billing ends)
    prefill_busy_s: float
    decode_busy_s: float
    peak_containers: int


def simulate_containers(
    arrival_s: np.ndarray,
    prompt: np.ndarray,
    generated: np.ndarray,
    *,
    prefill_s: Callable[[np.ndarray], np.ndarray],
    step_s: np.ndarray,
    slots: int,
    cold_start_s: float,
    idle_timeout_s: float,
) -> ContainerRun:
    """Containers batching a stream continuously (module docstring).

    Args:
        arrival_s: (N,) sorted arrival times.
        prompt: (N,) prompt tokens of each request.
        generated: (N,) tokens each generates (at least 1: the prefill gives the first).
        prefill_s: Seconds to prefill prompts of these lengths (vectorised).
        step_s: (slots + 1,) seconds of a decode step of B sequences at index B (index 0
            unused).
        slots: Sequences a container admits at once (queued, prefilling and decoding).
        cold_start_s: Seconds from a container's start to its first prefill.
        idle_timeout_s: Seconds an empty container waits before it scales down.
    """
    n = arrival_s.size
    if slots < 1 or step_s.size < slots + 1:
        raise ValueError(f"slots {slots} needs a step time for every batch up to it")
    if n and int(generated.min()) < 1:
        raise ValueError("every request generates at least one token")
    prefill = np.asarray(prefill_s(np.asarray(prompt)), dtype=float)
    first = np.full(n, np.nan)
    done = np.full(n, np.nan)
    where = np.full(n, -1, dtype=np.int64)
    containers: list[_Container] = []
    live: list[_Container] = []
    peak = 0

    def advance(c: _Container, t: float) -> None:
        """Run `c` up to time `t`: its cold start, prefills ahead of decode steps, retires."""
        while True:
            if c.clock < c.ready:
                if t < c.ready:
                    return
                c.clock = c.idle_since = c.ready
            if c.prefilling is not None:
                rid, end = c.prefilling
                if end > t:
                    return
                c.clock, c.prefilling, first[rid] = end, None, end
                if generated[rid] > 1:
                    heapq.heappush(c.active, (c.progress + generated[rid] - 1, rid))
                else:
                    done[rid] = end
                    if not c.occupancy:
                        c.idle_since = end
                continue
            if c.queue:
                rid = c.queue.popleft()
                c.prefilling = (rid, c.clock + prefill[rid])
                c.prefill_s += prefill[rid]
                continue
            if c.active:
                step = step_s[len(c.active)]
                finish = c.clock + (c.active[0][0] - c.progress) * step
                if finish > t:
                    c.progress += (t - c.clock) / step
                    c.decode_s += t - c.clock
                    c.clock = t
                    return
                c.decode_s += finish - c.clock
                c.clock, c.progress = finish, c.active[0][0]
                while c.active and c.active[0][0] <= c.progress + 1e-9:
                    done[heapq.heappop(c.active)[1]] = finish
                if not c.active:
                    c.idle_since = finish
                continue
            if c.idle_since + idle_timeout_s <= t:
                c.end = c.idle_since + idle_timeout_s
            else:
                c.clock = t
            return

    for rid in range(n):
        t = float(arrival_s[rid])
        for c in live:
            advance(c, t)
        live = [c for c in live if c.end is None]
        open_ = [c for c in live if c.occupancy < slots]
        if open_:
            target = max(open_, key=lambda c: c.occupancy)  # the fullest: the others idle out
        else:
            target = _Container(len(containers), t, t + cold_start_s, clock=t, idle_since=t)
            containers.append(target)
            live.append(target)
            peak = max(peak, len(live))
        target.queue.append(rid)
        where[rid] = target.index
    for c in live:
        advance(c, math.inf)
    generated = np.asarray(generated)
    tpot = np.full(n, np.nan)
    more = generated > 1
    tpot[more] = (done[more] - first[more]) / (generated[more] - 1)
    return ContainerRun(
        ttft_s=first - arrival_s,
        tpot_s=tpot,
        e2e_s=done - arrival_s,
        container=where,
        start_s=np.array([c.start for c in containers]),
        end_s=np.array([c.end for c in containers], dtype=float),
        prefill_busy_s=float(sum(c.prefill_s for c in containers)),
        decode_busy_s=float(sum(c.decode_s for c in containers)),
        peak_containers=peak,
    )


def _quantile(values: np.ndarray, q: float) -> float | None:
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q, method="inverted_cdf")) if values.size else None


def serverless_generation(
    share: np.ndarray,
    manifest: Manifest,
    arrivals: Arrivals,
    catalogue: Catalogue,
    platform: ServerlessPlatform,
    *,
    runtime_gib: float,
    kv_bytes_per_token: float | None = None,
    slo_tpot_s: float | None = None,
) -> list[dict[str, Any]]:
    """The bill, TTFT and TPOT of `arrivals` on each GPU of `platform`, one row per GPU type
    (module docstring); a model that does not fit a GPU gets a row saying so.

    `share` (L, E) is a token's probability of picking each expert; `kv_bytes_per_token` one
    token's keys and values in bf16, every layer (None: 2 x layers x hidden x 2 bytes, an
    upper bound for grouped-query attention).
    """
    from gpu.estimate import ModelWork
    from gpu.generation import decode_step_s

    if arrivals.generated is None:
        raise UsageError(
            "the stream does not say how many tokens each request generates.",
            "pass a stream with generated tokens (azure-conv).",
        )
    share = np.asarray(share, dtype=float)
    work = ModelWork.of(manifest)
    kv = kv_bytes_per_token or 2.0 * manifest.num_layers * manifest.hidden_size * _BF16
    prompt = arrivals.tokens.astype(np.int64)
    generated = np.maximum(arrivals.generated.astype(np.int64), 1)
    context = int(np.quantile(prompt + generated, 0.99, method="inverted_cdf"))
    weights = sum(manifest.params(s) for s in manifest.stages) * _BF16
    rows = []
    most = int(platform.max_gpus_per_container.value)
    counts = [2**i for i in range(most.bit_length()) if 2**i <= most]
    for name in platform.gpus:
        kind = catalogue.types[name]
        for n in counts:  # the fewest GPUs a container needs to hold the model
            placed = fit(
                manifest,
                kind,
                runtime_gib=runtime_gib,
                kv_bytes_per_token=kv,
                context=context,
                gpus=n,
            )
            if placed.fits:
                break
        n = placed.gpus
        row: dict[str, Any] = {
            "platform": platform.name,
            "gpu": name,
            "gpus": n,
            "fits": placed.fits,
            "weight_gib_per_gpu": round(placed.weight_gib, 2),
            "usable_gib_per_gpu": round(placed.usable_gib, 2),
            "usd_per_container_hour": platform.usd_per_second(name, n) * 3600,
            "price_source_kind": platform.gpus[name].source_kind,
            "basis": "predicted: simulated containers, the GPU backend's step model",
        }
        if not placed.fits:
            rows.append(row | {"reason": placed.reason})
            continue

        def step(batch: float, kind: GpuType = kind, n: int = n) -> float:
            return decode_step_s(work, share, kind, n, batch, catalogue)

        cap = min(placed.kv_slots, int(platform.max_batch.value))
        table = np.array([0.0, *(step(b) for b in range(1, cap + 1))])
        meets = table[1:] <= (slo_tpot_s if slo_tpot_s is not None else math.inf)
        slots = int(np.flatnonzero(meets)[-1]) + 1 if meets.any() else 1
        grid = np.unique(np.geomspace(1, max(int(prompt.max()), 2), _PREFILL_GRID).round())
        at = np.array([step(p) for p in grid])

        def prefill(
            tokens: np.ndarray, grid: np.ndarray = grid, at: np.ndarray = at
        ) -> np.ndarray:
            return np.interp(tokens, grid, at)

        cold = platform.cold_start_s(weights)
        idle = platform.idle_timeout_s.value
        run = simulate_containers(
            arrivals.times_s,
            prompt,
            generated,
            prefill_s=prefill,
            step_s=table[: slots + 1],
            slots=slots,
            cold_start_s=cold,
            idle_timeout_s=idle,
        )
        increment = platform.billing_increment_s.value
        billed = np.ceil((run.end_s - run.start_s) / increment) * increment
        total = float(billed.sum()) * platform.usd_per_second(name, n)
        busy = run.prefill_busy_s + run.decode_busy_s
        decode = run.decode_busy_s / busy if busy else 0.0
        rows.append(
            row
            | {
                "slots": slots,
                "slots_by_memory": placed.kv_slots,
                "step_s_one": float(table[1]),
                "step_s_full": float(table[slots]),
                "cold_start_s": cold,
                "idle_timeout_s": idle,
                "containers": int(run.start_s.size),
                "peak_containers": run.peak_containers,
                "billed_s": float(billed.sum()),
                "busy_fraction": busy / float(billed.sum()) if billed.sum() else 0.0,
                "ttft_p99_s": _quantile(run.ttft_s, 0.99),
                "tpot_p99_s": _quantile(run.tpot_s, 0.99),
                "e2e_p99_s": _quantile(run.e2e_s, 0.99),
                "total_usd": total,
                "per_million_input_usd": total * (1 - decode) / max(int(prompt.sum()), 1) * 1e6,
                "per_million_output_usd": total * decode / max(int(generated.sum()), 1) * 1e6,
            }
        )
    return rows
