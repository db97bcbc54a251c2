"""Serverless or GPU? The cost per million tokens of both at a request rate, and where they cross.

A request is one batch of the counts' tokens. Lambda bills per request, so its cost per token does
not depend on the rate: the cheapest plan that meets the SLO (full bill). A GPU deployment bills
by the hour whether busy or not: n GPUs of one type serve a batch in t seconds (`gpu.estimate`,
experts packed e mod n, all-to-alls in Aurora's rounds, each GPU sending an equal share of every
expert's tokens), so at R requests/s it needs ceil(R t / u) copies, u the catalogue's
`max_utilisation`, and costs copies * n * price / (R * tokens) per token. Below one copy's
capacity (R <= u/t) that is n * price / (R * tokens), so the GPU option breaks even with Lambda at
R* = n * price / (tokens * Lambda's cost per token) when R* <= u/t, and never otherwise (adding
copies cannot go below one copy's full-load cost). Queueing beyond the utilisation cap, cold
starts and Lambda's free tier are left out; all GPU options hold every weight in bf16 within
90 % of the GPU's memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpu.cluster import Catalogue
from gpu.estimate import ModelWork, estimate_layer
from gpu.lina import static_placement
from ground.manifest import Manifest

__all__ = ["GpuOption", "breakeven_rps", "free_bytes", "gpu_cost_per_million", "gpu_options"]

_MEMORY_HEADROOM = 0.9


@dataclass(frozen=True)
class GpuOption:
    gpu_type: str
    gpus: int
    latency_s: float  # one batch on one copy
    usd_per_hour: float  # one copy

    def copies(self, rps: float, max_utilisation: float) -> int:
        return max(1, math.ceil(rps * self.latency_s / max_utilisation - 1e-12))


def free_bytes(manifest: Manifest, gpus: int, memory_gb: float) -> float:
    """Bytes left on the fullest GPU of n within the headroom (negative: the weights do not
    fit), every GPU holding the non-MoE weights and its experts (e mod n), in bf16."""
    shared = sum(manifest.params(s) for s in manifest.stages if s.role != "expert") * 2
    per_gpu = np.zeros(gpus)
    for stage in manifest.stages:
        if stage.role == "expert":
            per_gpu[stage.expert % gpus] += manifest.params(stage) * 2
    return float(_MEMORY_HEADROOM * memory_gb * 1e9 - shared - per_gpu.max())


def _weights_fit(manifest: Manifest, gpus: int, memory_gb: float) -> bool:
    """Every GPU holds the non-MoE weights and its experts (e mod n), in bf16."""
    return free_bytes(manifest, gpus, memory_gb) >= 0


def gpu_options(
    counts: np.ndarray,
    manifest: Manifest,
    catalogue: Catalogue,
    order: Literal["aurora", "bound"] = "aurora",
) -> list[GpuOption]:
    """Every (type, n) deployment whose weights fit: n = 1, 2, 4, ... up to E GPUs; `order`
    as `gpu.estimate.estimate_layer` takes it ("bound": the same seconds, faster)."""
    layers, experts = counts.shape
    work = ModelWork.of(manifest)
    tokens = float(counts[0].sum()) / manifest.top_k
    options = []
    sizes = sorted({2**i for i in range(int(math.log2(experts)) + 1)} | {experts})
    for name, kind in catalogue.types.items():
        for gpus in sizes:
            if not _weights_fit(manifest, gpus, kind.memory_gb):
                continue
            kinds = [kind] * gpus
            placement = static_placement(experts, gpus)
            total = catalogue.kernel_s + tokens / gpus * work.tail_flops / kind.flops(
                catalogue.mfu
            )
            for layer in range(layers):
                shards = np.repeat(counts[layer][None, :] / gpus, gpus, axis=0)
                total += estimate_layer(
                    shards, placement, layer, work, kinds, catalogue, order
                ).layer_s
            options.append(GpuOption(name, gpus, total, gpus * kind.usd_per_gpu_hour))
    return options


def gpu_cost_per_million(
    option: GpuOption, rps: float, tokens: int, max_utilisation: float
) -> float:
    copies = option.copies(rps, max_utilisation)
    return copies * option.usd_per_hour / 3600 / (rps * tokens) * 1e6


def breakeven_rps(
    option: GpuOption, serverless_per_million: float, tokens: int, max_utilisation: float
) -> float | None:
    """The least rate at which `option` costs no more per token than Lambda (None: never)."""
    rate = option.usd_per_hour / 3600 * 1e6 / (tokens * serverless_per_million)
    return rate if rate <= max_utilisation / option.latency_s else None
