"""The GPU backend in a few calls: what `moelambda gpu-plan`, `compare` and `bench gpu` do.

Each function takes loaded inputs (a routing trace, the model's manifest, predicted counts),
checks them, does the work and returns a JSON-ready summary; the command line only parses,
loads and renders. `moelambda run-gpu` is `gpu.run.run_plan`.

Example (a trace profiled with `moelambda profile --experts 4`)::

    from gpu import check_gpu_plan, plan_deployment
    from moe import describe_model, load_model
    from predictor import RoutingTrace

    trace = RoutingTrace.load("out/profile")
    check_gpu_plan(trace, gpus=4, scheduler="aurora")
    manifest = describe_model(load_model("minilm", experts=4, top_k=2))
    plan, summary = plan_deployment(trace, manifest, gpus=4)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import UsageError

if TYPE_CHECKING:
    from gpu.cluster import Catalogue
    from gpu.compare import GpuOption
    from gpu.plan import GpuPlan
    from ground.manifest import Manifest
    from predictor import RoutingTrace

__all__ = [
    "SCHEDULERS",
    "Comparison",
    "bench_aurora",
    "check_gpu_plan",
    "colocation",
    "compare_serverless_gpu",
    "lina_statistics",
    "plan_deployment",
]

SCHEDULERS = ("aurora", "lina", "vanilla")


def check_gpu_plan(
    trace: RoutingTrace, *, gpus: int, scheduler: str = "aurora", cluster: Path | None = None
) -> None:
    """Refuse a plan that cannot be made, before any model is loaded.

    Args:
        trace: The routing trace to plan from.
        gpus: GPUs (ranks) to plan for.
        scheduler: One of `SCHEDULERS`. Defaults to "aurora".
        cluster: A cluster JSON file, read and checked. Defaults to None (the catalogue's
            default type).

    Raises:
        UsageError: An unknown scheduler, Aurora on a GPU count other than the experts', or a
            trace of adaptive top-k routing (the GPU backend dispatches a fixed top-k).
        gpu.cluster.ClusterError: The cluster file is unreadable or too small.
    """
    from gpu.cluster import load_catalogue, load_cluster

    load_cluster(cluster, gpus, load_catalogue())
    if scheduler not in SCHEDULERS:
        raise UsageError(
            f"unknown --scheduler '{scheduler}'.", f"use one of: {', '.join(SCHEDULERS)}."
        )
    if scheduler == "aurora" and gpus != trace.num_experts:
        raise UsageError(
            f"Aurora places one expert per GPU: the trace's model has {trace.num_experts} "
            f"experts, --gpus is {gpus}.",
            f"pass --gpus {trace.num_experts}, or --scheduler lina or vanilla to pack experts.",
        )
    if (trace.experts >= trace.num_experts).any():
        raise UsageError(
            "the trace routes tokens to a variable number of experts (adaptive top-k); the GPU "
            "backend dispatches a fixed top-k.",
            "profile the model with an integer --top-k for gpu-plan; adaptive routing is "
            "planned and served on Lambda (`moelambda plan`).",
        )


def _layer_rows(plan: GpuPlan) -> list[dict[str, Any]]:
    return [
        {
            "placement": [[[h.expert, round(h.share, 6)] for h in gpu] for gpu in layer.placement],
            "a2a_rounds": layer.a2a_rounds,
            "a2a_s": layer.a2a_s,
            "lower_bound_s": layer.lower_bound_s,
            "layer_s": layer.layer_s,
        }
        for layer in plan.layers
    ]


def plan_deployment(
    trace: RoutingTrace,
    manifest: Manifest,
    *,
    gpus: int,
    cluster: Path | None = None,
    scheduler: str = "aurora",
    colocate: RoutingTrace | None = None,
    lina_batches: int = 20,
) -> tuple[GpuPlan, dict[str, Any]]:
    """Place the experts of every MoE layer on GPUs and order its all-to-alls.

    The batch of the trace is split data-parallel over the GPUs (whole requests each); times
    come from FLOPs at the catalogue's GPU speeds and from the all-to-all order on the network
    (Aurora: contention-free rounds at Theorem 4.2's bound; rank order: fluid simulation).

    Args:
        trace: The routing trace (`moelambda profile`) whose batch is planned.
        manifest: The manifest of the model the trace was recorded on.
        gpus: GPUs (ranks) to plan for.
        cluster: A cluster JSON file (`gpu.cluster.load_cluster`). Defaults to None: `gpus`
            GPUs of the catalogue's default type.
        scheduler: "aurora" (one expert per GPU), "lina" (popularity packing) or "vanilla".
            Defaults to "aurora".
        colocate: A second model's trace (same experts): Aurora's colocation of one expert of
            each model per GPU is added to the summary. Defaults to None.
        lina_batches: Held-out batches Lina's re-scheduling rate is measured on (lina only).
            Defaults to 20.

    Returns:
        The plan (save it with `GpuPlan.save`) and a JSON-ready summary: per layer the
        placement, all-to-all rounds and seconds against the lower bound, the total time and
        the cost per million tokens; "lina" and "colocate" blocks when asked for.

    Raises:
        UsageError: See `check_gpu_plan`; also when the trace is too short for the GPUs.
    """
    from gpu.cluster import load_catalogue, load_cluster
    from gpu.planning import plan_gpus

    check_gpu_plan(trace, gpus=gpus, scheduler=scheduler, cluster=cluster)
    catalogue, types = load_cluster(cluster, gpus, load_catalogue())
    try:
        plan = plan_gpus(trace, manifest, catalogue, types, scheduler)  # type: ignore[arg-type]
    except ValueError as error:
        raise UsageError(str(error), "profile more tokens or plan fewer --gpus.") from error
    summary: dict[str, Any] = {
        "scheduler": scheduler,
        "gpus": gpus,
        "gpu_types": types,
        "tokens": plan.tokens,
        "layers": _layer_rows(plan),
        "total_s": plan.total_s,
        "cost_per_million_tokens_usd": plan.cost_per_million_tokens_usd,
    }
    if scheduler == "lina":
        summary["lina"] = lina_statistics(trace, gpus=gpus, batches=lina_batches)
    if colocate is not None:
        summary["colocate"] = colocation(trace, colocate, catalogue, types, manifest)
    return plan, summary


def lina_statistics(trace: RoutingTrace, *, gpus: int, batches: int = 20) -> dict[str, Any]:
    """Lina's path persistence on the trace, and how often its phase 2 would re-schedule on
    held-out batches, with the path estimator and with the default predictor.

    Args:
        trace: The routing trace; a quarter of its windows (at least one) are held out.
        gpus: GPUs the experts are packed on.
        batches: Held-out batches the re-scheduling rate is measured on. Defaults to 20.

    Returns:
        Path persistence at k=1 and 2 (with the thesis's values), the re-scheduling rate and
        the busiest GPU's load over the mean per estimator, the batch size and count.
    """
    from gpu.lina import measure, path_persistence
    from predictor import DEFAULT_METHOD, split_windows

    window = int(trace.meta.get("window", 128))
    windows = np.unique(trace.window_ids).size
    held = max(windows // 4, 1) * window
    split = split_windows(trace, eval_tokens=held, repeats=1, seed=0)[0]
    batch = max(min(8, split.held_out.num_tokens // window // 2), 1) * window
    rates, balance = {}, {}
    for estimator in ("lina-path", DEFAULT_METHOD):
        result = measure(split.profile, split.held_out, gpus, batch, batches, estimator)
        rates[estimator] = result["reschedule_rate"]
        balance[estimator] = result["max_load_ratio"]
    return {
        "path_persistence": {
            "k1": path_persistence(trace, 1),
            "k2": path_persistence(trace, 2),
            "thesis": {"k1": 0.4194, "k2": 0.5459},
        },
        "reschedule_rate": rates,
        "thesis_reschedule_rate": 0.23,
        "busiest_gpu_over_mean": balance,
        "batch_tokens": batch,
        "batches": batches,
    }


def colocation(
    trace_a: RoutingTrace,
    trace_b: RoutingTrace,
    catalogue: Catalogue,
    types: list[str],
    manifest: Manifest,
) -> dict[str, Any]:
    """Aurora's colocation of two models' experts, one of each per GPU, per MoE layer.

    The pairing (bottleneck matching; on mixed GPUs the two-stage heuristic also assigns GPUs)
    and Table 2's two-model cycle, against pairing expert i of one model with expert i of the
    other. Both models are timed with the first model's layer cost (the paper colocates two
    ViT-B).

    Args:
        trace_a: The first model's routing trace.
        trace_b: The second model's, with as many experts.
        catalogue: The GPU catalogue (`gpu.cluster.load_catalogue`).
        types: The GPU type of each rank; as many ranks as experts.
        manifest: The first model's manifest.

    Returns:
        The second model's name and, per layer, the pairing, the GPU of each pair, the cycle
        time and the same-index pairing's cycle time.

    Raises:
        UsageError: The expert counts differ, or differ from the GPUs.
    """
    from gpu.aurora.placement import colocate_heterogeneous, colocate_homogeneous
    from gpu.aurora.timeline import LayerCost, colocated_cycle_s
    from gpu.estimate import ModelWork
    from gpu.traffic import shard_counts

    gpus = len(types)
    if trace_b.num_experts != trace_a.num_experts or gpus != trace_a.num_experts:
        raise UsageError(
            f"colocation pairs the experts of two models with equal expert counts on as many "
            f"GPUs: the models have {trace_a.num_experts} and {trace_b.num_experts} experts, "
            f"--gpus is {gpus}.",
            "profile both models with the same --experts and pass --gpus equal to it.",
        )
    kinds = [catalogue.get(t) for t in types]
    flops = np.array([k.flops(catalogue.mfu) for k in kinds])
    speed, bandwidth = flops / flops.max(), np.array([k.bandwidth for k in kinds])
    work = ModelWork.of(manifest)
    a, b = shard_counts(trace_a, gpus), shard_counts(trace_b, gpus)
    identity = np.arange(gpus)
    layers = []
    for layer in range(min(trace_a.num_layers, trace_b.num_layers)):
        shard_tokens = float(a[layer].sum(axis=1).max()) / work.top_k
        cost = LayerCost(
            gate_s=catalogue.kernel_s + shard_tokens * work.nonmoe_flops[layer] / flops.max(),
            agg_s=catalogue.kernel_s,
            ffn_s_per_token=float(work.expert_flops[layer].mean()) / flops.max(),
            token_bytes=work.token_bytes,
        )
        if len(set(types)) == 1:
            pairing, gpu_of_pair = colocate_homogeneous(a[layer], b[layer]), identity
        else:
            pairing, gpu_of_pair = colocate_heterogeneous(
                a[layer], b[layer], cost, speed, bandwidth
            )
        args = (cost, speed, bandwidth)
        layers.append(
            {
                "layer": layer,
                "pairing": [int(p) for p in pairing],
                "gpu_of_pair": [int(g) for g in gpu_of_pair],
                "cycle_s": colocated_cycle_s(a[layer], b[layer], pairing, gpu_of_pair, *args),
                "same_index_cycle_s": colocated_cycle_s(
                    a[layer], b[layer], identity, identity, *args
                ),
            }
        )
    return {"model_b": str(trace_b.meta["model"]), "layers": layers}


@dataclass(frozen=True)
class Comparison:
    """Serverless against GPUs at one request rate (`compare_serverless_gpu`).

    Attributes:
        summary: JSON-ready: both sides' cost per million tokens and latency, the cheapest GPU
            deployment at the rate, and the break-even rate (None when the GPUs never win).
        options: The catalogue's GPU deployments that meet the SLO.
        lambda_per_million_usd: Lambda's cost per million tokens (full bill).
        tokens: Tokens per request.
        max_utilisation: The catalogue's utilisation cap of a GPU copy.
    """

    summary: dict[str, Any]
    options: list[GpuOption] = field(repr=False)
    lambda_per_million_usd: float
    tokens: int
    max_utilisation: float

    def plot(self, path: Path, *, force: bool = False) -> str:
        """Cost per million tokens against the request rate (PNG), Lambda's flat line, the
        cheapest GPU deployment's curve, the asked rate and the break-even rate marked.

        Args:
            path: The PNG to write (atomically).
            force: Replace `path` if it exists. Defaults to False.

        Returns:
            `path` as a string.
        """
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        from gpu.compare import gpu_cost_per_million
        from ground.files import write_file_atomically

        rps, u, tokens = self.summary["rps"], self.max_utilisation, self.tokens
        breakeven = self.summary["breakeven_rps"]
        fastest = min(o.latency_s for o in self.options)
        rates = np.logspace(math.log10(rps) - 4, math.log10(max(rps, u / fastest)) + 1, 300)
        gpu = [min(gpu_cost_per_million(o, r, tokens, u) for o in self.options) for r in rates]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.loglog(rates, gpu, label="cheapest GPU deployment (catalogue)")
        ax.axhline(
            self.lambda_per_million_usd, color="C1", label="Lambda, cheapest plan (full bill)"
        )
        ax.axvline(rps, color="grey", linestyle=":", label=f"--rps {rps:g}")
        if breakeven is not None:
            ax.axvline(
                breakeven, color="C2", linestyle="--", label=f"break-even {breakeven:.3g}/s"
            )
        ax.set_xlabel("requests per second")
        ax.set_ylabel("USD per million tokens")
        ax.set_title(f"Serverless or GPU? {tokens:,}-token requests")
        ax.legend()
        fig.tight_layout()
        try:
            write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120), force=force)
        finally:
            plt.close(fig)
        return str(path)


def compare_serverless_gpu(
    predicted: np.ndarray,
    manifest: Manifest,
    *,
    lambda_cost_usd: float,
    lambda_latency_s: float,
    tokens: int,
    slo_s: float,
    rps: float,
    lambda_deployment: str = "workflow",
    lambda_candidates: list[dict[str, Any]] | None = None,
) -> Comparison:
    """Cost per million tokens on Lambda and on GPUs at a request rate, and the break-even rate.

    Lambda's side is a plan already made (e.g. `moelambda plan --counts`): its cost per batch
    does not depend on the rate. The GPU side is every deployment of the catalogue that meets
    the SLO (`gpu.compare`), the cheapest at `rps` reported.

    Args:
        predicted: Predicted counts per layer and expert for one request (batch).
        manifest: The model's manifest.
        lambda_cost_usd: Lambda's cost of one request (the plan's full bill), USD.
        lambda_latency_s: Lambda's latency of one request, seconds.
        tokens: Tokens per request.
        slo_s: Latency SLO of one request, seconds.
        rps: Requests per second.
        lambda_deployment: The shape of Lambda's plan (monolithic, driver, workflow).
        lambda_candidates: Every shape `plan` weighed (`planner.deployments.Candidate
            .describe`), listed beside the chosen one. Defaults to None (the chosen alone).

    Returns:
        A `Comparison`; its `summary` is what `moelambda compare --json` prints.

    Raises:
        UsageError: A rate or SLO that is not positive, or no GPU deployment within the SLO.
    """
    from gpu.cluster import load_catalogue
    from gpu.compare import breakeven_rps, gpu_cost_per_million, gpu_options

    if rps <= 0 or slo_s <= 0:
        raise UsageError("--rps and --slo must be positive.", "pass e.g. --rps 1 --slo 30.")
    catalogue = load_catalogue()
    lambda_per_million = lambda_cost_usd / tokens * 1e6
    options = [o for o in gpu_options(predicted, manifest, catalogue) if o.latency_s <= slo_s]
    if not options:
        raise UsageError(
            f"no GPU deployment in the catalogue serves a batch within {slo_s:g} s.",
            "pass a larger --slo.",
        )
    u = catalogue.max_utilisation
    best = min(options, key=lambda o: gpu_cost_per_million(o, rps, tokens, u))
    crossings = [(r, o) for o in options if (r := breakeven_rps(o, lambda_per_million, tokens, u))]
    breakeven = min(crossings, key=lambda c: c[0]) if crossings else None
    summary = {
        "rps": rps,
        "slo_s": slo_s,
        "tokens_per_request": tokens,
        "serverless": {
            "cost_per_million_tokens_usd": lambda_per_million,
            "latency_s": lambda_latency_s,
            "deployment": lambda_deployment,
        },
        "serverless_candidates": [
            {
                "deployment": c["deployment"],
                "cost_per_million_tokens_usd": (
                    None if c["bill_usd"] is None else c["bill_usd"] / tokens * 1e6
                ),
                "latency_s": c["latency_s"],
                "feasible": c["feasible"],
                "reason": c["reason"],
            }
            for c in lambda_candidates or []
        ],
        "gpu": {
            "cost_per_million_tokens_usd": gpu_cost_per_million(best, rps, tokens, u),
            "latency_s": best.latency_s,
            "gpu_type": best.gpu_type,
            "gpus": best.gpus,
            "copies": best.copies(rps, u),
        },
        "breakeven_rps": None if breakeven is None else breakeven[0],
        "breakeven_deployment": None
        if breakeven is None
        else {"gpu_type": breakeven[1].gpu_type, "gpus": breakeven[1].gpus},
    }
    return Comparison(summary, options, lambda_per_million, tokens, u)


def bench_aurora(
    trace: RoutingTrace,
    manifest: Manifest,
    *,
    samples: int = 200,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Aurora's checks: the BvN makespan equals Theorem 4.2's bound on random matrices; the
    colocation heuristic against brute force; SJF, RCS, rank order and Aurora on one real
    layer's traffic (layer 0 of the trace, one expert per GPU).

    Args:
        trace: A routing trace; its expert count is the GPU count.
        manifest: The manifest of the trace's model.
        samples: Random matrices for the BvN check. Defaults to 200.
        progress: Called with a message as each step starts. Defaults to None.

    Returns:
        Whether every BvN makespan equals the bound, the heuristic's mean and worst ratio to
        the optimum, and the all-to-all time of each order on the real traffic.

    Raises:
        UsageError: The trace has fewer windows than GPUs.
    """
    from gpu.aurora import a2a, fluid, placement
    from gpu.cluster import load_catalogue
    from gpu.estimate import ModelWork
    from gpu.traffic import gpu_matrix, shard_counts

    say = progress or (lambda _: None)
    experts = trace.num_experts
    try:
        counts = shard_counts(trace, experts)[0]
    except ValueError as error:
        raise UsageError(
            str(error), f"profile at least {experts} windows (--tokens {experts * 128})."
        ) from error
    say(f"BvN schedules of {samples} random matrices")
    exact = a2a.verify(samples=samples, max_n=10, seed=0)
    say("colocation heuristic against brute force")
    mean, worst = placement.heuristic_over_optimum()
    say("all-to-all orders on the trace's traffic")
    catalogue = load_catalogue()
    kind = catalogue.get(catalogue.default_type)
    matrix = gpu_matrix(counts, [[(e, 1.0)] for e in range(experts)])
    bandwidth = np.full(experts, kind.bandwidth)
    orders = fluid.order_times(matrix, bandwidth, ModelWork.of(manifest).token_bytes)
    return {
        "bvn_makespan_equals_bound": exact,
        "bvn_samples": samples,
        "coloc_heuristic_over_opt": {"mean": mean, "max": worst},
        "orders": orders,
        "orders_traffic": f"layer 0 of {trace.meta.get('model')}, {trace.num_tokens:,} "
        f"tokens, {experts} GPUs of {kind.gpu} at {kind.network_gbps:g} Gbps",
    }
