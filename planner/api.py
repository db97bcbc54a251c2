"""Planning one batch in a few calls: what `moelambda plan` (and `compare`'s Lambda side) do.

Each function takes loaded inputs (the model's manifest, the predicted counts, the
calibration), checks them, does the work and returns the plan with a JSON-ready summary; the
command line only parses, loads the model and renders. `plan --traffic` is
`planner.traffic.planning.plan_traffic`.

Example (counts written by `moelambda predict --counts-out out/counts.json`)::

    from moe import describe_model, load_model
    from planner import counts_for_plan, load_calibration, plan_deployment

    counts = counts_for_plan(counts=Path("out/counts.json"), tokens=10240)
    model = load_model(counts.model["model"], experts=counts.model["experts"],
                       top_k=counts.model["top_k"], seed=counts.model["seed"])
    planned = plan_deployment(describe_model(model), counts, load_calibration(), slo_s=30)
    planned.plan.save("out/plan.json")
    print(planned.summary["bill_usd"]["total_usd"])
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import InfeasibleError, UsageError
from ground.plan import PlanError

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from ground.precision import Weights
    from planner.calibration import Calibration
    from planner.costmodel import Solution
    from planner.deployments import Candidate
    from planner.exact import Frontier
    from planner.generation import GenerationSolution

from planner.options import (
    DEFAULT_CONFIDENCE,
    SOLVERS,
    PlanningCounts,
    PlanOptions,
    check_plan_options,
    check_stream_flags,
    check_stream_options,
    plan_confidence,
    slo_of,
)

__all__ = [
    "DEFAULT_CONFIDENCE",
    "SOLVERS",
    "PlanOptions",
    "PlannedDeployment",
    "PlanningCounts",
    "check_plan_command",
    "check_plan_options",
    "check_stream_flags",
    "check_stream_options",
    "counts_for_plan",
    "plan_confidence",
    "plan_deployment",
    "serverless_best",
    "shape_counts_for_plan",
    "slo_of",
    "weights_on_cpu",
    "write_pareto",
]


@dataclass(frozen=True, eq=False)
class PlannedDeployment:
    """A plan, its summary (what `plan --json` prints, without the file names), the
    workflow solver's solution (None when another shape was chosen) and the workflow's
    cost-vs-SLO curve (None when the workflow was not planned)."""

    plan: Plan
    summary: dict[str, Any]
    solution: Solution | None
    frontier: Frontier | None
    shapes: dict[str, Plan] = field(default_factory=dict)  # every feasible shape's plan


def counts_for_plan(
    *, traces: Path | None = None, counts: Path | None = None, tokens: int, seed: int = 0
) -> PlanningCounts:
    """The counts `moelambda plan --counts/--traces` plans for, scaled to `tokens`.

    Example::

        planning = counts_for_plan(counts=Path("out/counts.json"), tokens=10240)
        print(planning.model["model"], planning.dist is not None)

    Args:
        traces: A routing-trace directory: the default predictor's counts on a held-out
            batch drawn from it with `seed`.
        counts: A counts file (`moelambda predict --counts-out`), with its distribution when
            it holds one.
        tokens: Tokens per batch to plan for.
        seed: Seeds the held-out batch drawn from `traces`. Defaults to 0.

    Raises:
        UsageError: Neither or both of `traces` and `counts`.
    """
    from planner.confidence import CountDistribution
    from predictor import DEFAULT_METHOD, PredictedCounts, RoutingTrace, predict_batch

    if (traces is None) == (counts is None):
        raise UsageError(
            "pass exactly one of --traces and --counts.",
            "use --counts FILE from `moelambda predict --counts-out`, or --traces DIR.",
        )
    if counts is not None:
        doc = PredictedCounts.load(counts)
        model = {
            "model": doc.model,
            "experts": doc.experts,
            "top_k": doc.top_k,
            "seed": doc.seed,
            "moefy": doc.moefy,
        }
        source = {"counts": str(counts), "method": doc.method, "tokens": doc.tokens}
        dist = None
        if doc.std is not None:
            z = None if doc.residual_z is None else np.asarray(doc.residual_z)
            dist = CountDistribution(doc.array(), np.asarray(doc.std), doc.tokens, z)
            dist = dist.scaled(tokens)
        return PlanningCounts(doc.array() * tokens / doc.tokens, tokens, source, model, dist)
    assert traces is not None
    trace = RoutingTrace.load(traces)
    predicted, batch = predict_batch(trace, tokens, seed=seed)
    model = {
        "model": trace.meta["model"],
        "experts": trace.num_experts,
        "top_k": trace.top_k,
        "seed": int(trace.meta.get("moefy_seed", 0)),
        "moefy": trace.meta.get("moefy"),
        "weights": trace.meta.get("weights"),  # the precision it was profiled at (None: fp32)
    }
    source = {"traces": str(traces), "method": DEFAULT_METHOD, "tokens": batch, "seed": seed}
    return PlanningCounts(predicted, tokens, source, model)


def check_plan_command(
    options: PlanOptions,
    *,
    tokens: int | None,
    default_tokens: int,
    hardware: str,
    traffic: str | None,
    slo_s: float | None,
    throughput: float | None,
    slo_p99_s: float | None,
    stream_flags: dict[str, bool],
) -> float | None:
    """Every cross-option rule of `moelambda plan`, before anything loads, in the order a user
    meets them: the solver, architecture, batch and method; the shape (`check_deployment`); what
    the hardware and the stream would drop (`check_stream_options`); the stream's flags
    (`check_stream_flags`); the batch's SLO (`slo_of`).

    Args:
        options: The plan's options.
        tokens: `--tokens` when given, None when left at `default_tokens`.
        default_tokens: The batch planned when `tokens` is None.
        hardware, traffic, slo_p99_s: `--hardware`, `--traffic`, `--slo-p99`.
        slo_s, throughput: `--slo` and `--throughput` (one batch's SLO).
        stream_flags: Each flag describing a stream and whether it was given.

    Returns:
        The batch SLO in seconds (None: the cheapest plan).

    Raises:
        UsageError: The first rule broken, naming the flags and the fix.
    """
    from planner.batch_shapes import check_deployment

    o = options
    batch = default_tokens if tokens is None else tokens
    check_plan_options(solver=o.solver, arch=o.arch, tokens=batch, method=o.method)
    check_deployment(o.deployment, objective=o.objective, method=o.method, pack=o.pack)
    check_stream_options(o, hardware=hardware, traffic=traffic, tokens=tokens)
    check_stream_flags(
        traffic=traffic,
        slo_p99_s=slo_p99_s,
        batch_slo=bool(slo_s or throughput),
        generating=o.generating,
        stream_flags=stream_flags,
    )
    return slo_of(slo_s, throughput, batch)


def shape_counts_for_plan(
    shape: str,
    popularity: str,
    *,
    traces: Path | None = None,
    counts: Path | None = None,
    tokens: int,
    seed: int = 0,
    weights: str | Weights | None = None,
) -> PlanningCounts:
    """The counts (labelled synthetic) and manifest of a model known by its architecture alone,
    its weights at the precision `weights` names.

    Example::

        planning = shape_counts_for_plan("olmoe", "zipf:1.0", tokens=1024)
        planned = plan_deployment(planning.manifest, planning, load_calibration())

    Args:
        shape: A built-in shape (olmoe, mixtral, qwen-moe, deepseek-v2-lite) or a Hugging
            Face config.json.
        popularity: 'uniform', 'zipf:S' or 'trace' (mapped from `traces` of a smaller model).
        traces: A smaller model's routing traces, for popularity 'trace'.
        counts: Must be None: a counts file is a measured model's, refused here.
        tokens: Tokens per batch to plan for.
        seed: Seeds the synthetic popularity.
        weights: The weights' precision (`ground.precision.parse_weights`: "int8",
            "stack=bf16,experts=int8"). Defaults to None: the shape's published precision.

    Raises:
        UsageError: A counts file, or `weights` that name no precision.
    """
    from ground.precision import parse_weights
    from planner.shapes import load_shape, shape_counts
    from predictor import RoutingTrace

    if counts is not None:
        raise UsageError(
            "--counts are a measured model's predictions; --shape plans a model without weights.",
            "drop --counts, or drop --shape and plan the model the counts were predicted for.",
        )
    precision = None if weights is None else parse_weights(weights)
    described = load_shape(shape)
    trace = RoutingTrace.load(traces) if traces is not None else None
    predicted, label = shape_counts(described, tokens, popularity, trace, seed)
    source = {"shape": described.name, **label}
    return PlanningCounts(predicted, tokens, source, manifest=described.manifest(precision))


def plan_deployment(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    slo_s: float | None = None,
    options: PlanOptions | None = None,
    whole_curve: bool = False,
    progress: Callable[[str], None] | None = None,
) -> PlannedDeployment:
    """The cheapest deployment of one batch that meets the SLO (no SLO: the cheapest plan).

    Every deployment shape `options.deployment` allows is planned for the same batch and SLO
    (`planner.deployments`): one function holding the whole model, a driver with local and
    remote experts, the fan-out workflow (per MoE layer a scatter-gather method and pipeline
    degree, per expert a Lambda memory size and replica count). The cheapest that meets the
    SLO is kept; the summary's `candidates` lists every shape with its bill and latency or
    why it is infeasible.

    With `options` that plan generation (`PlanOptions.generating`), a decoder's driver or one
    function is planned instead for B sequences of P prompt tokens generating G tokens each,
    under the TTFT and TPOT SLOs (`planner.generation`); the plan carries `generation`, and
    the summary a `generation` block (TTFT, TPOT, the bill per million input and output
    tokens, the local set).

    Example::

        planned = plan_deployment(manifest, planning, load_calibration(), slo_s=30,
                                  options=PlanOptions(pack="1"))
        planned.plan.save("out/plan.json")

    Args:
        manifest: The model's manifest (`moe.describe_model`, or a shape's).
        counts: The counts to plan for (`counts_for_plan`, `shape_counts_for_plan`).
        calibration: The platform's parameters (`planner.load_calibration`).
        slo_s: Latency SLO of one batch, seconds (`slo_of`). Defaults to None (cheapest).
        options: How to plan. Defaults to None: `PlanOptions()`, the command's defaults.
        whole_curve: Build the workflow's whole cost-vs-SLO curve (for `write_pareto`).
            Defaults to False.
        progress: Called with a message per step. Defaults to None.

    Raises:
        UsageError: A bad option (see `PlanOptions.check`, `planner.batch_shapes.check_shape`);
            generation options for an encoder,
            or with `slo_s` or `whole_curve`.
        InfeasibleError: No plan; the message names the binding constraint (of every shape).
        ground.plan.PlanError: The plan's reservations exceed the concurrency quota.
    """
    from planner.batch_shapes import SHAPES, ShapePlanned, ShapeRequest, check_shape, shapes_for
    from planner.deployments import Candidate, infeasible_everywhere

    o = options or PlanOptions()
    methods, confidence = o.check(counts)
    check_shape(o)
    weights = weights_on_cpu(manifest, calibration, o.arch)
    if o.generating:
        if slo_s is not None or whole_curve:
            raise UsageError(
                "--slo and --pareto are a batch's; generation is planned under --slo-ttft (the "
                "prompts') and --slo-tpot (each further token's).",
                "drop --slo/--throughput and --pareto, or the generation options.",
            )
        return _plan_generating(manifest, counts, calibration, o, progress, weights)
    started = time.perf_counter()
    shapes = shapes_for(o)
    request = ShapeRequest(
        manifest, counts, calibration, o, methods, confidence, slo_s, whole_curve, progress
    )
    candidates: list[Candidate] = []
    planned: dict[str, ShapePlanned] = {}
    errors: dict[str, Exception] = {}
    for shape in shapes:
        if progress is not None:
            progress(f"planning the {shape} deployment")
        try:
            done = SHAPES[shape].plan(request)
            if o.concurrency_quota is not None:
                done = dataclasses.replace(
                    done, plan=done.plan.within_concurrency_quota(o.concurrency_quota)
                )
        except (InfeasibleError, PlanError) as error:
            errors[shape] = error
            smallest_slo = _smallest_slo(error)
            candidates.append(Candidate(shape, None, _reason(error), smallest_slo_s=smallest_slo))
            continue
        planned[shape] = done
        candidates.append(
            Candidate(
                shape,
                done.plan,
                None,
                latency_s=done.plan.totals.latency_s,
                bill_usd=done.plan.totals.bill_usd["total_usd"],
                smallest_slo_s=done.smallest_slo_s,
            )
        )
    feasible = [c for c in candidates if c.plan is not None]
    if not feasible:
        if len(shapes) == 1:
            raise errors[shapes[0]]
        raise infeasible_everywhere(candidates, slo_s)
    chosen = min(feasible, key=lambda c: (c.bill_usd, shapes.index(c.deployment)))
    listed = [_weighed(c, chosen, manifest) for c in candidates]
    won = planned[chosen.deployment]
    # the workflow's cost-vs-SLO curve whichever shape won (`write_pareto` draws it)
    frontier = next((p.frontier for p in planned.values() if p.frontier is not None), None)
    document = won.plan.model_copy(update={"candidates": listed})
    summary = (
        won.summary
        | weights
        | {
            "seconds": round(time.perf_counter() - started, 4),
            "deployment": chosen.deployment,
            "candidates": listed,
        }
    )
    shaped = {name: p.plan for name, p in planned.items()}
    shaped[chosen.deployment] = document
    return PlannedDeployment(document, summary, won.solution, frontier, shaped)


def weights_on_cpu(manifest: Manifest, calibration: Calibration, arch: str) -> dict[str, Any]:
    """The summary's `weights` (the precision's label) and `weights_note`: why CPU Lambda
    would not run them (`planner.hardware.why_not`), None when it does. A shape's plan is
    priced all the same (no export of it exists to deploy) and says so; a real export's is
    refused, since its handlers would refuse the weights.

    Raises:
        UsageError: A real export at a precision CPU Lambda does not compute.
    """
    from planner.hardware import why_not

    label = manifest.precision.label()
    reason = why_not("cpu", manifest.precision, calibration, arch)
    if reason is not None and manifest.family != "shape":
        raise UsageError(
            f"{manifest.model}'s {label} weights cannot run on CPU Lambda: {reason}.",
            "plan CPU functions for the model at --weights fp32 or int8 (profile it so: "
            "`moelambda profile --weights int8`), or GPU-backed ones for a stream (plan "
            "--traffic SPEC --slo-p99 S --hardware gpu).",
        )
    note = None
    if reason is not None:
        note = (
            f"priced at {label}, but not runnable as planned: {reason}; plan --weights fp32 or "
            "int8 for CPU functions that run"
        )
    return {"weights": label, "weights_note": note}


def _weighed(candidate: Candidate, chosen: Candidate, manifest: Manifest) -> dict[str, Any]:
    """A shape as `plan --json` lists it (`Candidate.describe`), with the weights its
    function holding the most holds (a driver's or one function's: every weight of the model;
    None for the fan-out workflow, whose functions each hold one stage) and why it was or was
    not chosen: its bill against the chosen one's, or why it is infeasible."""
    from ground.topology import topology
    from planner.instance import MB

    entry = candidate.describe()
    plan = candidate.plan
    if topology(candidate.deployment).expert_functions == "none":  # one function holds all
        entry["weights_mb"] = round(sum(s.bytes for s in manifest.stages) / MB, 1)
    elif plan is not None and plan.driver is not None:
        entry["weights_mb"] = round(plan.driver.weights_mb, 1)
    else:
        entry["weights_mb"] = None
    if candidate.plan is None:
        entry["verdict"] = f"infeasible: {candidate.reason}"
    elif candidate is chosen:
        entry["verdict"] = "chosen: the cheapest feasible shape"
    else:
        assert candidate.bill_usd is not None and chosen.bill_usd is not None
        extra = candidate.bill_usd - chosen.bill_usd
        ratio = candidate.bill_usd / chosen.bill_usd if chosen.bill_usd > 0 else math.inf
        entry["verdict"] = (
            f"not chosen: ${extra:.6f} ({ratio:.2f}x) a batch more than the {chosen.deployment}"
        )
    return entry


def _reason(error: Exception) -> str:
    """An infeasible candidate's reason: the error's problem, without the advice."""
    return str(getattr(error, "problem", None) or error)


def _smallest_slo(error: Exception) -> float | None:
    """The smallest feasible SLO of a shape whose latency binds (else None)."""
    return getattr(error, "smallest_slo_s", None)


def _plan_generating(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    o: PlanOptions,
    progress: Callable[[str], None] | None,
    weights: dict[str, Any],
) -> PlannedDeployment:
    """The cheapest generating plan of every shape `o` allows (`planner.generation`), with
    each shape's TTFT, TPOT and bills, or why it is infeasible, as `candidates`; `weights`
    the summary's precision keys (`weights_on_cpu`)."""
    from planner import generation as gen
    from planner.batch_shapes import driver_summary, shapes_for
    from planner.deployments import generation_plan
    from planner.generation_solver import plan_generation
    from planner.shapes import load_shape

    started = time.perf_counter()
    shape = counts.source.get("shape")
    kv = None if shape is None else load_shape(shape).kv_bytes_per_token(manifest.precision)
    listed: list[dict[str, Any]] = []
    planned: dict[str, tuple[Plan, GenerationSolution]] = {}
    errors: dict[str, Exception] = {}
    for deployment in shapes_for(o):
        if progress is not None:
            progress(f"planning the generating {deployment}")
        try:
            ginst, solution = plan_generation(
                manifest,
                counts.counts / counts.tokens,
                calibration,
                deployment=deployment,
                slo_ttft_s=o.slo_ttft_s,
                slo_tpot_s=o.slo_tpot_s,
                sequences=_given(o.batch_sequences, gen.DEFAULT_SEQUENCES),
                prompt_tokens=_given(o.prompt_tokens, gen.DEFAULT_PROMPT_TOKENS),
                new_tokens=_given(o.new_tokens, gen.DEFAULT_NEW_TOKENS),
                arch=o.arch,
                kv_bytes_per_token=kv,
            )
            plan = generation_plan(ginst, solution, manifest, calibration, counts.source)
            if o.concurrency_quota is not None:
                plan = plan.within_concurrency_quota(o.concurrency_quota)
        except (InfeasibleError, PlanError) as error:
            errors[deployment] = error
            listed.append(
                {"deployment": deployment, "feasible": False, "reason": _reason(error)}
                | {"smallest_slo_s": _smallest_slo(error)}
            )
            continue
        planned[deployment] = (plan, solution)
        listed.append(_generation_entry(plan, solution))
    if not planned:
        if len(errors) == 1:
            raise next(iter(errors.values()))
        reasons = "; ".join(f"{c['deployment']}: {c['reason'].rstrip('.')}" for c in listed)
        fixes = "; ".join(
            f"{d}: {str(getattr(e, 'fix', '')).rstrip('.')}" for d, e in errors.items()
        )
        raise InfeasibleError(f"no deployment shape can generate as asked ({reasons}).", fixes)
    name = min(planned, key=lambda d: planned[d][1].evaluation.total_usd)
    plan, solution = planned[name]
    plan = plan.model_copy(update={"candidates": listed})
    chosen = next(c for c in listed if c["deployment"] == name)
    summary = (
        driver_summary(plan, manifest, counts, None)
        | weights
        | {
            "seconds": round(time.perf_counter() - started, 4),
            "deployment": name,
            "candidates": listed,
            "generation": chosen,
        }
    )
    return PlannedDeployment(plan, summary, None, None, {d: p for d, (p, _) in planned.items()})


def _given(value: int | None, default: int) -> int:
    return default if value is None else value


def _generation_entry(plan: Plan, solution: GenerationSolution) -> dict[str, Any]:
    """One generating shape as `plan --json` lists it: what `Plan.generation` holds, the
    prefill's and a step's bill, the local set and the fastest TPOT within the TTFT SLO."""
    from ground.generation import decode_steps

    assert plan.generation is not None and plan.driver is not None
    ev = solution.evaluation
    prefill_usd = plan.totals.bill_usd["total_usd"]
    steps = decode_steps(plan.generation.new_tokens)
    return {
        "deployment": solution.deployment,
        "feasible": True,
        "reason": None,
        **plan.generation.model_dump(),
        "run_s": plan.generation.run_s,
        "smallest_tpot_s": solution.smallest_tpot_s,
        "prefill_usd": prefill_usd,
        "step_usd": ev.step_usd,
        "generation_usd": prefill_usd + steps * ev.step_usd,
        "driver_memory_mb": plan.nonmoe_memory_mb,
        "local_per_layer": solution.choice.local_per_layer,
        "local": plan.driver.local,
        "remote_memory_mb": sorted({e.memory_mb for layer in plan.layers for e in layer.experts}),
        "replicas": solution.choice.replicas,
        "functions": 1 + sum(len(layer.experts) for layer in plan.layers),
    }


def serverless_best(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    slo_s: float,
    confidence: float | None = None,
) -> PlannedDeployment:
    """The plan `moelambda plan --counts FILE --slo S` makes with its defaults (full bill,
    exact solver, packing auto, the default confidence), for commands that compare against it
    (`moelambda compare`); no concurrency quota is checked.

    Example::

        counts = counts_for_plan(counts=path, tokens=PredictedCounts.load(path).tokens)
        best = serverless_best(manifest, counts, load_calibration(), slo_s=60)
        print(best.solution.cost, best.solution.latency)

    Raises:
        UsageError: `confidence` above 0 for counts without a distribution.
    """
    if confidence is not None and confidence > 0 and counts.dist is None:
        raise UsageError(
            "--confidence needs the predicted counts' distribution; "
            f"{counts.source.get('counts')} holds none.",
            "write the counts with `moelambda predict --counts-out FILE`, or pass --confidence 0.",
        )
    options = PlanOptions(confidence=confidence, concurrency_quota=None)
    return plan_deployment(manifest, counts, calibration, slo_s=slo_s, options=options)


def write_pareto(path: Path, planned: PlannedDeployment, *, force: bool = False) -> list[str]:
    """The cost-vs-SLO curve of `planned` (made with `whole_curve=True`) as CSV at `path` and,
    beside it, as a PNG with the chosen plan and the SLO marked.

    Example::

        planned = plan_deployment(manifest, planning, cal, whole_curve=True)
        csv, png = write_pareto(Path("out/pareto.csv"), planned)

    Returns:
        The two files written.

    Raises:
        InfeasibleError: The curve has no feasible point.
    """
    import matplotlib

    from ground.files import write_file_atomically

    frontier, summary = planned.frontier, planned.summary
    if frontier is None:
        raise UsageError(
            "--pareto writes the workflow's cost-vs-SLO curve, and this run did not plan the "
            "workflow.",
            "leave --pareto out, or pass --deployment auto or workflow.",
        )
    if frontier.latency_s.size == 0:
        raise InfeasibleError(
            "no plan is feasible at any SLO: the cost-vs-SLO curve would be empty.",
            "leave --pareto out, or plan for fewer --tokens.",
        )
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    latency, cost = frontier.latency_s, frontier.cost_usd
    rows = "slo_s,cost_usd\n" + "".join(
        f"{lat:.17g},{c:.17g}\n" for lat, c in zip(latency, cost, strict=True)
    )
    write_file_atomically(path, lambda tmp: tmp.write_text(rows), force=force)
    png = path.with_suffix(".png")
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(latency, cost * 1e6, where="post", label="workflow: cheapest plan within the SLO")
    slo_s = summary["slo_s"]
    if slo_s is not None:
        ax.axvline(slo_s, color="grey", linestyle=":", label=f"SLO {slo_s:.3g} s")
    markers = {"monolithic": "s", "driver": "D", "workflow": "o"}
    for candidate in summary.get("candidates", []):
        if not candidate["feasible"]:
            continue
        chosen = candidate["deployment"] == summary["deployment"]
        ax.scatter(
            [candidate["latency_s"]],
            [candidate["bill_usd"] * 1e6],
            marker="*" if chosen else markers[candidate["deployment"]],
            s=200 if chosen else 60,
            color="tab:orange" if chosen else "tab:green",
            zorder=3,
            label=f"{'chosen: ' if chosen else ''}{candidate['deployment']}, "
            f"{candidate['latency_s']:.3g} s, {candidate['bill_usd'] * 1e6:.3g} µ$",
        )
    ax.legend(fontsize=8)
    ax.set_xlabel("SLO (s)")
    ax.set_ylabel("cost per batch (µ$; curve: the solver's price, points: the bill)")
    ax.set_yscale("log")  # the cost rises steeply near the smallest feasible SLO
    experts = planned.plan.model.experts
    ax.set_title(f"{summary['model']}, E={experts}, {summary['tokens']:,} tokens")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    try:
        write_file_atomically(png, lambda tmp: fig.savefig(tmp, dpi=110), force=force)
    finally:
        plt.close(fig)
    return [str(path), str(png)]
