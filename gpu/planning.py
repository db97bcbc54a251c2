"""A GPU plan from a routing trace: placement and all-to-all order per MoE layer, and its times.

Three schedulers over the same data-parallel split of real requests (`gpu.traffic`):

* vanilla: expert e on GPU e mod n, all-to-alls in rank order (what an EP framework does);
* aurora: one expert per GPU (n = E); on a heterogeneous cluster the busiest experts go to the
  fastest GPUs (Theorem 5.1); all-to-alls in Aurora's contention-free rounds (Theorem 4.2);
* lina: from the fourth MoE layer on, experts packed by popularity (FFD, popular experts
  replicated, at most 4 per GPU; the trace's own popularity is the estimate a static plan can
  have, `moelambda gpu-plan` reports how often Lina's phase 2 would re-schedule); all-to-alls in
  rank order, as Lina keeps the framework's collective.

Cost per million tokens: the cluster's GPU-hours while it runs batches back to back.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from gpu.aurora.placement import exclusive_heterogeneous
from gpu.cluster import Catalogue
from gpu.estimate import ModelWork, estimate_layer
from gpu.lina import FIRST_LAYER, ffd_placement, static_placement
from gpu.plan import GpuLayerPlan, GpuModelRef, GpuPlan, Hosted
from gpu.traffic import Placement, shard_counts
from ground.manifest import Manifest
from predictor import RoutingTrace

__all__ = ["plan_gpus"]

Scheduler = Literal["aurora", "lina", "vanilla"]


def _placement(
    scheduler: Scheduler, counts: np.ndarray, layer: int, speeds: np.ndarray
) -> Placement:
    gpus, experts = counts.shape
    if scheduler == "aurora":
        gpu_of = exclusive_heterogeneous(counts.sum(axis=0), speeds)
        placement: Placement = [[] for _ in range(gpus)]
        for expert, gpu in enumerate(gpu_of):
            placement[int(gpu)].append((expert, 1.0))
        return placement
    if scheduler == "lina" and layer >= FIRST_LAYER:
        popularity = counts.sum(axis=0) / max(counts.sum(), 1.0)
        return ffd_placement(gpus * popularity, gpus)
    return static_placement(experts, gpus)


def plan_gpus(
    trace: RoutingTrace,
    manifest: Manifest,
    catalogue: Catalogue,
    types: list[str],
    scheduler: Scheduler,
) -> GpuPlan:
    """The plan of `scheduler` for the trace's batch on GPUs of `types` (one per rank)."""
    gpus, experts = len(types), trace.num_experts
    if scheduler == "aurora" and gpus != experts:
        raise ValueError(
            f"Aurora places one expert per GPU: --gpus must be {experts} (the model's experts), "
            f"not {gpus}; use --scheduler lina or vanilla to pack experts"
        )
    kinds = [catalogue.get(t) for t in types]
    speeds = np.array([k.flops(catalogue.mfu) for k in kinds])
    work = ModelWork.of(manifest)
    order: Literal["aurora", "rank"] = "aurora" if scheduler == "aurora" else "rank"
    layers = []
    counts = shard_counts(trace, gpus)
    for layer in range(trace.num_layers):
        placement = _placement(scheduler, counts[layer], layer, speeds)
        estimate = estimate_layer(counts[layer], placement, layer, work, kinds, catalogue, order)
        layers.append(
            GpuLayerPlan(
                layer=layer,
                placement=[[Hosted(expert=e, share=s) for e, s in hosted] for hosted in placement],
                order=order,
                a2a_rounds=estimate.rounds,
                a2a_s=estimate.a2a_s,
                lower_bound_s=estimate.lower_bound_s,
                layer_s=estimate.layer_s,
            )
        )
    shard_tokens = trace.num_tokens / gpus
    tail_s = catalogue.kernel_s + float(np.max(shard_tokens * work.tail_flops / speeds))
    total_s = sum(layer.layer_s for layer in layers) + tail_s
    usd_per_s = sum(k.usd_per_gpu_hour for k in kinds) / 3600
    return GpuPlan(
        scheduler=scheduler,
        model=GpuModelRef(
            name=str(trace.meta["model"]),
            experts=experts,
            top_k=trace.top_k,
            moefy_seed=int(trace.meta.get("moefy_seed", 0)),
            moefy=trace.meta.get("moefy"),
        ),
        gpu_types=types,
        tokens=trace.num_tokens,
        layers=layers,
        total_s=total_s,
        cost_per_million_tokens_usd=usd_per_s * total_s / trace.num_tokens * 1e6,
    )
