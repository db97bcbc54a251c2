"""GPU backend commands: gpu-plan, run-gpu, compare, and `bench gpu`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console

from ground.errors import UsageError
from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    TracesOpt,
    app,
    bench_app,
    err,
    manifest_of_trace,
    user_errors,
)

SCHEDULERS = ("aurora", "lina", "vanilla")
ClusterOpt = Annotated[
    Path | None,
    typer.Option(
        help='Cluster JSON, e.g. {"gpus": [{"type": "a100", "count": 8}]} (types from '
        'gpu/data/catalogue.json or the file\'s own "types"). Default: --gpus of the '
        "catalogue's default type."
    ),
]


def _print(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary))
    else:
        Console().print_json(json.dumps(summary))


def _load_trace(traces: Path) -> Any:
    from predictor import RoutingTrace

    return RoutingTrace.load(traces)


def _layer_rows(plan: Any) -> list[dict[str, Any]]:
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


@app.command("gpu-plan")
@user_errors
def gpu_plan(
    gpus: Annotated[int, typer.Option(help="GPUs (ranks) to plan for.")],
    traces: TracesOpt = Path("out/profile"),
    cluster: ClusterOpt = None,
    scheduler: Annotated[
        str,
        typer.Option(help="aurora (one expert per GPU), lina (popularity packing) or vanilla."),
    ] = "aurora",
    colocate: Annotated[
        Path | None,
        typer.Option(
            help="A second model's trace (same experts): Aurora colocates one expert of each "
            "model per GPU and reports the pairing and the two-model cycle time."
        ),
    ] = None,
    lina_batches: Annotated[
        int,
        typer.Option(
            min=1, help="Held-out batches Lina's phase-2 re-scheduling rate is measured on."
        ),
    ] = 20,
    out: Annotated[Path, typer.Option(help="GPU plan JSON to write.")] = Path("out/gpu-plan.json"),
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Place the experts of every MoE layer on GPUs and order its all-to-alls.

    The batch of the trace is split data-parallel over the GPUs (whole requests each); times come
    from FLOPs at the catalogue's GPU speeds and from the all-to-all order on the network (Aurora:
    contention-free rounds at Theorem 4.2's bound; rank order: fluid network simulation).
    """
    from gpu.cluster import load_catalogue, load_cluster
    from gpu.planning import plan_gpus

    if scheduler not in SCHEDULERS:
        raise UsageError(
            f"unknown --scheduler '{scheduler}'.", f"use one of: {', '.join(SCHEDULERS)}."
        )
    if out.exists() and not force:
        raise UsageError(f"'{out}' already exists.", "pick another --out or pass --force.")
    catalogue, types = load_cluster(cluster, gpus, load_catalogue())
    trace = _load_trace(traces)
    if scheduler == "aurora" and gpus != trace.num_experts:
        raise UsageError(
            f"Aurora places one expert per GPU: the trace's model has {trace.num_experts} "
            f"experts, --gpus is {gpus}.",
            f"pass --gpus {trace.num_experts}, or --scheduler lina or vanilla to pack experts.",
        )
    if (trace.experts >= trace.num_experts).any():
        raise UsageError(
            f"the trace in {traces} routes tokens to a variable number of experts (adaptive "
            "top-k); the GPU backend dispatches a fixed top-k.",
            "profile the model with an integer --top-k for gpu-plan; adaptive routing is "
            "planned and served on Lambda (`moelambda plan`).",
        )
    manifest = manifest_of_trace(trace)
    with err.status(f"planning {trace.num_layers} MoE layers on {gpus} GPUs ({scheduler})"):
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
        "plan": str(out),
    }
    if scheduler == "lina":
        summary["lina"] = _lina_statistics(trace, gpus, lina_batches)
    if colocate is not None:
        summary["colocate"] = _colocation(trace, _load_trace(colocate), catalogue, types, manifest)
    plan.save(out, force=force)
    _print(summary, as_json)


def _lina_statistics(trace: Any, gpus: int, batches: int) -> dict[str, Any]:
    """Lina's path persistence on the trace, and how often its phase 2 would re-schedule on
    held-out batches, with the path estimator and with our default predictor."""
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


def _colocation(
    trace_a: Any, trace_b: Any, catalogue: Any, types: list[str], manifest: Any
) -> dict[str, Any]:
    """Aurora's colocation of two models' experts, one of each per GPU, per MoE layer: the
    pairing (bottleneck matching; on mixed GPUs the two-stage heuristic also assigns GPUs) and
    Table 2's two-model cycle, against pairing expert i of one model with expert i of the other.
    Both models are timed with the first model's layer cost (the paper colocates two ViT-B)."""
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


@app.command("run-gpu")
@user_errors
def run_gpu(
    plan: Annotated[Path, typer.Option(help="GPU plan from `moelambda gpu-plan`.")],
    tokens: Annotated[int, typer.Option(help="Tokens of real text to run.")] = 1024,
    seed: Annotated[int, typer.Option(help="Seeds the choice of text windows.")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run the plan for real: one process per planned GPU on torch.distributed (gloo on CPU,
    nccl on CUDA), tokens moved in the planned rounds and by all_to_all_single as a baseline,
    the output compared with the monolithic model."""
    from gpu.plan import GpuPlan
    from gpu.run import run_plan

    if tokens < 1:
        raise UsageError(f"--tokens {tokens} is not positive.", "pass --tokens 1 or more.")
    document = GpuPlan.load(plan)
    with err.status(f"running {tokens:,} tokens on {document.gpus} ranks"):
        result = run_plan(document, tokens=tokens, seed=seed)
    _print(result, as_json)
    if result["status"] != "SUCCEEDED":
        raise typer.Exit(1)


@app.command("compare")
@user_errors
def compare(
    counts: Annotated[
        Path, typer.Option(help="Counts file from `moelambda predict --counts-out`.")
    ],
    slo: Annotated[float, typer.Option(help="Latency SLO of one request (batch), seconds.")],
    rps: Annotated[
        float, typer.Option(help="Requests (batches of the counts' tokens) per second.")
    ],
    plot: Annotated[
        Path | None, typer.Option(help="PNG of cost per million tokens against the rate.")
    ] = None,
    confidence: Annotated[
        float | None,
        typer.Option(
            help="Plan Lambda to meet the SLO with this probability under the counts' "
            "distribution (default 0.99 when the file has one, else 0), as `plan` does."
        ),
    ] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Cost per million tokens on Lambda (cheapest plan, full bill) and on GPUs at a request rate,
    and the rate at which the GPUs break even."""
    from gpu.cluster import load_catalogue
    from gpu.compare import breakeven_rps, gpu_cost_per_million, gpu_options
    from moelambda.cli.plan import serverless_best
    from predictor import PredictedCounts

    if rps <= 0 or slo <= 0:
        raise UsageError("--rps and --slo must be positive.", "pass e.g. --rps 1 --slo 30.")
    if confidence is not None and not 0 <= confidence < 1:
        raise UsageError(f"--confidence {confidence} is not in [0, 1).", "pass e.g. 0.99 or 0.")
    if plot is not None and plot.exists() and not force:
        raise UsageError(f"'{plot}' already exists.", "pick another --plot or pass --force.")
    predicted = PredictedCounts.load(counts).array()
    catalogue = load_catalogue()
    with err.status("the cheapest Lambda plan"):
        manifest, solution, tokens = serverless_best(counts, slo, confidence)
    lambda_per_million = solution.cost / tokens * 1e6
    options = [o for o in gpu_options(predicted, manifest, catalogue) if o.latency_s <= slo]
    if not options:
        raise UsageError(
            f"no GPU deployment in the catalogue serves a batch within {slo:g} s.",
            "pass a larger --slo.",
        )
    u = catalogue.max_utilisation

    def cheapest(rate: float) -> Any:
        return min(options, key=lambda o: gpu_cost_per_million(o, rate, tokens, u))

    best = cheapest(rps)
    crossings = [(r, o) for o in options if (r := breakeven_rps(o, lambda_per_million, tokens, u))]
    breakeven = min(crossings, key=lambda c: c[0]) if crossings else None
    summary = {
        "rps": rps,
        "slo_s": slo,
        "tokens_per_request": tokens,
        "serverless": {
            "cost_per_million_tokens_usd": lambda_per_million,
            "latency_s": solution.latency,
        },
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
    if plot is not None:
        breakeven_rate = summary["breakeven_rps"]
        summary["plot"] = _plot_compare(
            plot, options, lambda_per_million, tokens, u, rps, breakeven_rate, force
        )
    _print(summary, as_json)


def _plot_compare(
    path: Path,
    options: list[Any],
    lambda_per_million: float,
    tokens: int,
    u: float,
    rps: float,
    breakeven: float | None,
    force: bool,
) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpu.compare import gpu_cost_per_million
    from ground.files import write_file_atomically

    fastest = min(o.latency_s for o in options)
    rates = np.logspace(math.log10(rps) - 4, math.log10(max(rps, u / fastest)) + 1, 300)
    gpu = [min(gpu_cost_per_million(o, r, tokens, u) for o in options) for r in rates]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.loglog(rates, gpu, label="cheapest GPU deployment (catalogue)")
    ax.axhline(lambda_per_million, color="C1", label="Lambda, cheapest plan (full bill)")
    ax.axvline(rps, color="grey", linestyle=":", label=f"--rps {rps:g}")
    if breakeven is not None:
        ax.axvline(breakeven, color="C2", linestyle="--", label=f"break-even {breakeven:.3g}/s")
    ax.set_xlabel("requests per second")
    ax.set_ylabel("USD per million tokens")
    ax.set_title(f"Serverless or GPU? {tokens:,}-token requests")
    ax.legend()
    fig.tight_layout()
    write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=120), force=force)
    plt.close(fig)
    return str(path)


@bench_app.command("gpu")
@user_errors
def bench_gpu(
    traces: Annotated[
        Path | None, typer.Option(help="A 16-expert trace for the traffic (default: profile).")
    ] = None,
    samples: Annotated[int, typer.Option(help="Random matrices for the BvN check.")] = 200,
    as_json: JsonOpt = False,
) -> None:
    """Aurora's checks: BvN makespan = Theorem 4.2's bound on random matrices; the colocation
    heuristic against brute force; SJF, RCS, rank order and Aurora on one real layer's traffic."""
    from gpu.aurora import a2a, fluid, placement
    from gpu.cluster import load_catalogue
    from gpu.estimate import ModelWork
    from gpu.traffic import gpu_matrix, shard_counts
    from moelambda.cli.model import bench_trace

    with err.status(f"BvN schedules of {samples} random matrices"):
        exact = a2a.verify(samples=samples, max_n=10, seed=0)
    with err.status("colocation heuristic against brute force"):
        mean, worst = placement.heuristic_over_optimum()
    trace = bench_trace(traces, experts=16)
    catalogue = load_catalogue()
    kind = catalogue.get(catalogue.default_type)
    experts = trace.num_experts
    try:
        counts = shard_counts(trace, experts)[0]
    except ValueError as error:
        raise UsageError(
            str(error), f"profile at least {experts} windows (--tokens {experts * 128})."
        ) from error
    matrix = gpu_matrix(counts, [[(e, 1.0)] for e in range(experts)])
    bandwidth = np.full(experts, kind.bandwidth)
    token_bytes = ModelWork.of(manifest_of_trace(trace)).token_bytes
    orders = fluid.order_times(matrix, bandwidth, token_bytes)
    _print(
        {
            "bvn_makespan_equals_bound": exact,
            "bvn_samples": samples,
            "coloc_heuristic_over_opt": {"mean": mean, "max": worst},
            "orders": orders,
            "orders_traffic": f"layer 0 of {trace.meta.get('model')}, {trace.num_tokens:,} "
            f"tokens, {experts} GPUs of {kind.gpu} at {kind.network_gbps:g} Gbps",
        },
        as_json,
    )
