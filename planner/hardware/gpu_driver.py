"""A GPU's speed, and a driver's problem with its driver on that GPU: what the GPU-backed Lambda
candidates (`planner.hardware.gpu_model`) and the one re-scorer (`planner.replay.evaluate_plan`,
which run-local reads) both price a GPU driver with.

Compute on a GPU is the GPU backend's per-token model (the speeds in
planner/data/gpu_catalogue.json): a stage of p parameters on n tokens takes
max(2 p n / (peak x mfu), 2 p / memory bandwidth) + kernel_s: bfloat16 weights, read once per
call, whatever the export's precision (`DEVICE_BYTES`: the precision a GPU-backed function's
handler runs, `ground.placement.GPU`, casting fp32 weights as it loads them; int8 weights have
no GPU kernel, so `planner.hardware.why_not` refuses them before any GPU is priced).

Below the candidates and the re-scorer: it imports neither, nor the traffic simulator.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ground.errors import UsageError
from ground.precision import BYTES

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.calibration import Calibration
    from planner.driver import DriverInstance
    from planner.hardware.catalogue import Catalogue

__all__ = ["DEVICE_BYTES", "GpuSpeed", "gpu_driver_of", "gpu_s", "model_sizes", "on_gpu"]

DEVICE_BYTES = BYTES["bf16"]  # bytes a weight takes on a GPU, whatever the export's precision


@dataclass(frozen=True)
class GpuSpeed:
    """One GPU type's speed from the GPU backend's catalogue, and the memory its device exposes
    (`GpuType.usable_gib`), which bounds every placement on it (`room_gib`)."""

    name: str
    flops: float  # FLOP/s at the catalogue's mfu
    bytes_per_s: float  # memory bandwidth
    kernel_s: float
    usable_gib: float = math.inf

    @classmethod
    def of(cls, catalogue: Catalogue, name: str) -> GpuSpeed:
        gpu = catalogue.get(name)
        if gpu.memory_gbps is None:
            raise UsageError(
                f"the GPU catalogue gives {name} no memory bandwidth.",
                "add memory_gbps to its entry in planner/data/gpu_catalogue.json.",
            )
        return cls(
            name,
            gpu.flops(catalogue.mfu),
            gpu.memory_gbps * 1e9,
            catalogue.kernel_s,
            gpu.usable_gib,
        )

    def room_gib(self, size: float) -> float:
        """The accelerator memory a function asking `size` GiB has on this GPU: Lambda
        guarantees the size, and the device may expose less than its nominal memory (a 48-GB
        L40S 44.99 GiB), whatever size is asked."""
        return min(size, self.usable_gib)

    def bound(self, size: float) -> str:
        """The words a reason names the bound of `size` with."""
        if self.usable_gib < size:
            return (
                f"the {self.usable_gib:.2f} GiB a {size:g}-GiB accelerator exposes on {self.name}"
            )
        return f"a {size:g}-GiB accelerator"

    def smallest_size(self, sizes: Sequence[int], gib: float) -> int | None:
        """The smallest accelerator size whose room holds `gib` (None: none does)."""
        return next((s for s in sizes if self.room_gib(s) >= gib - 1e-9), None)

    def seconds(self, params: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Seconds of stages of `params` parameters on `tokens` tokens each (0 where a stage
        gets no token)."""
        params, tokens = np.broadcast_arrays(np.asarray(params, float), np.asarray(tokens, float))
        compute = 2.0 * params * tokens / self.flops
        read = DEVICE_BYTES * params / self.bytes_per_s
        return np.where(tokens > 0, np.maximum(compute, read) + self.kernel_s, 0.0)


def model_sizes(manifest: Manifest) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Parameters of each layer stage (L,), each expert (L, E), the tail and the head, from the
    export's stage sizes at each stage kind's precision (`Manifest.params`)."""
    layers = np.zeros(manifest.num_layers)
    experts = np.zeros((manifest.num_layers, manifest.experts))
    tail = head = 0.0
    for stage in manifest.stages:
        params = manifest.params(stage)
        if stage.role == "layer":
            layers[stage.layer] = params
        elif stage.role == "expert":
            experts[stage.layer, stage.expert] = params
        elif stage.role == "tail":
            tail = params
        else:
            head += params
    return layers, experts, tail, head


def on_gpu(
    dinst: DriverInstance,
    manifest: Manifest,
    speed: GpuSpeed,
    local: np.ndarray,
    side_finish_s: np.ndarray | None = None,
) -> DriverInstance:
    """`dinst` (a driver's problem on a batch, `dinst.base.counts` rows per expert) with its
    driver on a GPU of `speed`: its layer stages, its `local` experts (each on its own rows)
    and its tail at the GPU's speed, `side_finish_s` a call each layer also waits on (its GPU
    expert group). The candidates and the re-scorer build a GPU driver this one way."""
    layers, experts, tail_params, _ = model_sizes(manifest)
    n = float(dinst.base.tokens)
    rows = np.asarray(dinst.base.counts, float)
    stages = speed.seconds(layers, np.full_like(layers, n))
    tail = float(speed.seconds(np.array(tail_params), np.array(n)))
    return dataclasses.replace(
        dinst,
        u_layer=(stages / n)[None, :],
        u_tail=np.array([tail / n]),
        local_s=np.where(local, speed.seconds(experts, rows), 0.0),
        side_finish_s=side_finish_s,
    )


def gpu_s(dinst: DriverInstance) -> float:
    """The seconds a GPU driver (`on_gpu`) keeps its GPU computing on one request: its layer
    stages, local experts and tail, not its S3 reads and Invoke waits."""
    assert dinst.local_s is not None
    n = float(dinst.base.tokens)
    return n * float(dinst.u_layer[0].sum() + dinst.u_tail[0]) + float(dinst.local_s.sum())


def gpu_driver_of(
    plan: Plan, cal: Calibration, manifest: Manifest, dinst: DriverInstance, local: np.ndarray
) -> DriverInstance:
    """`dinst` (`planner.replay.driver_of`) as the plan runs it: on its GPU where the plan's
    driver is GPU-backed (its capacity has accelerator memory, on the plan's instance type's
    GPU, `on_gpu`), else unchanged."""
    from planner.hardware.catalogue import load_catalogue

    traffic = plan.traffic
    gpu_backed = traffic is not None and any(
        c.function == "driver" and c.accelerator_memory_gib is not None for c in traffic.capacity
    )
    if not gpu_backed:
        return dinst
    assert traffic is not None and traffic.managed_instance_type is not None
    instance = (cal.ec2_instance_prices or {}).get(traffic.managed_instance_type)
    if instance is None or instance.gpu is None:
        raise UsageError(
            f"the plan's GPU instance type {traffic.managed_instance_type} is not a GPU type of "
            "its calibration.",
            "make the plan again with `moelambda plan --hardware gpu`.",
        )
    return on_gpu(dinst, manifest, GpuSpeed.of(load_catalogue(), instance.gpu), local)
