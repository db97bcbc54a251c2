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
    from planner.calibration import Calibration
    from planner.confidence import CountDistribution
    from planner.costmodel import Solution
    from planner.exact import Frontier
    from planner.generation import GenerationSolution
    from planner.instance import Method

__all__ = [
    "DEFAULT_CONFIDENCE",
    "SOLVERS",
    "PlanOptions",
    "PlannedDeployment",
    "PlanningCounts",
    "check_plan_options",
    "check_stream_options",
    "counts_for_plan",
    "plan_confidence",
    "plan_deployment",
    "serverless_best",
    "shape_counts_for_plan",
    "slo_of",
    "write_pareto",
]

SOLVERS = ("exact", "ods", "milp")
DEFAULT_CONFIDENCE = 0.99  # with a counts file that carries its predictive distribution


@dataclass(frozen=True, eq=False)
class PlanningCounts:
    """The expert counts a plan is made for, scaled to its batch, and where they came from.

    Attributes:
        counts: Predicted tokens per (MoE layer, expert) in a batch of `tokens`.
        tokens: Tokens per batch the counts are scaled to.
        source: Where the counts came from, as the plan's `counts_source` records it.
        model: The identity of the model they were predicted for (model, experts, top_k,
            seed, moefy), to load it; None for a shape (see `manifest`).
        dist: Their predictive distribution at `tokens`; None when the input holds none.
        manifest: A shape's synthetic manifest (a model known by its architecture alone).
    """

    counts: np.ndarray
    tokens: int
    source: dict[str, Any]
    model: dict[str, Any] | None = None
    dist: CountDistribution | None = None
    manifest: Manifest | None = None


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


@dataclass(frozen=True)
class PlanOptions:
    """How a batch is planned: `moelambda plan`'s options, with its defaults.

    Attributes:
        solver: One of `SOLVERS`.
        method: Force one method on every layer (pipelined, s3, direct); None: any.
        arch: Lambda architecture, x86_64 or arm64.
        workflow: express or standard; None: express when the plan's latency fits.
        objective: "full" (the whole bill) or "experts" (the paper's objective).
        confidence: See `plan_confidence`; None: its default.
        pack: Experts per function: "auto" (the cheapest of every divisor) or a number.
        concurrency_quota: Refuse a plan whose reserved concurrency does not fit this account
            quota; None: no check.
        deployment: "auto" (every shape, the cheapest kept), "monolithic", "driver" or
            "workflow" (`planner.deployments`).
        slo_ttft_s: Plan generation (`planner.generation`): time to first token, seconds;
            None: no bound. Setting any of it, `slo_tpot_s`, `batch_sequences`,
            `prompt_tokens` or `new_tokens` plans a decoder's generation instead of a batch.
        slo_tpot_s: Time per output token, seconds; None: no bound.
        batch_sequences: Sequences decoded together; None: `DEFAULT_SEQUENCES`.
        prompt_tokens: Prompt tokens per sequence; None: `DEFAULT_PROMPT_TOKENS`.
        new_tokens: Tokens generated per sequence; None: `DEFAULT_NEW_TOKENS`.
    """

    solver: str = "exact"
    method: str | None = None
    arch: str = "x86_64"
    workflow: str | None = None
    objective: str = "full"
    confidence: float | None = None
    pack: str = "auto"
    concurrency_quota: int | None = 1000
    deployment: str = "auto"
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    batch_sequences: int | None = None
    prompt_tokens: int | None = None
    new_tokens: int | None = None

    @property
    def generating(self) -> bool:
        """Whether to plan a decoder's generation (TTFT, TPOT) rather than one batch."""
        return any(
            value is not None
            for value in (
                self.slo_ttft_s,
                self.slo_tpot_s,
                self.batch_sequences,
                self.prompt_tokens,
                self.new_tokens,
            )
        )

    def shapes(self) -> list[str]:
        """The deployment shapes to plan, cheapest-first on ties: one function, a driver, the
        workflow; only the workflow under the experts objective, a forced --method or packing
        of K > 1 experts per function, choices only it has; one function and a driver when
        generating (the workflow does not decode)."""
        if self.deployment != "auto":
            return [self.deployment]
        if self.generating:
            return ["monolithic", "driver"]
        if (
            self.objective == "experts"
            or self.method is not None
            or self.pack not in ("auto", "1")
        ):
            return ["workflow"]
        return ["monolithic", "driver", "workflow"]

    def check(self, counts: PlanningCounts) -> tuple[tuple[Method, ...], float]:
        """The methods the layers may use and the confidence level to plan `counts` at.

        Raises:
            UsageError: An unknown workflow type, objective, solver or architecture, an
                empty batch, or a confidence level `plan_confidence` refuses.
        """
        if self.workflow not in (None, "express", "standard"):
            raise UsageError(f"unknown --workflow '{self.workflow}'.", "use express or standard.")
        if self.objective not in ("full", "experts"):
            raise UsageError(f"unknown --objective '{self.objective}'.", "use full or experts.")
        from planner.deployments import check_deployment

        check_deployment(
            self.deployment, objective=self.objective, method=self.method, pack=self.pack
        )
        methods = check_plan_options(
            solver=self.solver, arch=self.arch, tokens=counts.tokens, method=self.method
        )
        if self.generating:
            self._check_generation()
        return methods, plan_confidence(self.confidence, counts)

    def _check_generation(self) -> None:
        """Refuse options that a generation plan cannot honour.

        Raises:
            UsageError: The workflow shape, a workflow-only option, a confidence level, or a
                non-positive SLO.
        """
        from planner.deployments import check_deployment

        if self.deployment == "workflow":
            raise UsageError(
                "the fan-out workflow does not generate: a decode step would pay a Step "
                "Functions transition and S3 round trips per layer and per token.",
                "pass --deployment driver, monolithic or auto with --slo-ttft/--slo-tpot.",
            )
        check_deployment("driver", objective=self.objective, method=self.method, pack=self.pack)
        if self.confidence:
            raise UsageError(
                "--confidence is not planned for generation: it is planned for the predicted "
                "routing shares.",
                "drop --confidence (or pass 0).",
            )
        for flag, value in (("--slo-ttft", self.slo_ttft_s), ("--slo-tpot", self.slo_tpot_s)):
            if value is not None and not value > 0:
                raise UsageError(f"{flag} {value} is not positive.", f"pass a positive {flag}.")


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
    }
    source = {"traces": str(traces), "method": DEFAULT_METHOD, "tokens": batch, "seed": seed}
    return PlanningCounts(predicted, tokens, source, model)


def shape_counts_for_plan(
    shape: str,
    popularity: str,
    *,
    traces: Path | None = None,
    counts: Path | None = None,
    tokens: int,
    seed: int = 0,
) -> PlanningCounts:
    """The counts (labelled synthetic) and manifest of a model known by its architecture alone.

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
    """
    from planner.shapes import load_shape, shape_counts
    from predictor import RoutingTrace

    if counts is not None:
        raise UsageError(
            "--counts are a measured model's predictions; --shape plans a model without weights.",
            "drop --counts, or drop --shape and plan the model the counts were predicted for.",
        )
    described = load_shape(shape)
    trace = RoutingTrace.load(traces) if traces is not None else None
    predicted, label = shape_counts(described, tokens, popularity, trace, seed)
    source = {"shape": described.name, **label}
    return PlanningCounts(predicted, tokens, source, manifest=described.manifest())


def check_plan_options(
    *,
    solver: str = "exact",
    arch: str = "x86_64",
    tokens: int = 1,
    method: str | None = None,
) -> tuple[Method, ...]:
    """Refuse an unknown solver or architecture or an empty batch, before any loading.

    Returns:
        The methods the layers may use: every one, or the one `method` names.
    """
    from planner.instance import Method

    if solver not in SOLVERS:
        raise UsageError(f"unknown --solver '{solver}'.", f"use one of: {', '.join(SOLVERS)}.")
    if arch not in ("x86_64", "arm64"):
        raise UsageError(f"unknown --arch '{arch}'.", "use x86_64 or arm64.")
    if tokens < 1:
        raise UsageError(f"--tokens {tokens} is not positive.", "pass --tokens 1 or more.")
    return tuple(Method) if method is None else (Method.parse(method),)


def check_stream_options(
    options: PlanOptions, *, hardware: str, traffic: str | None, tokens: int | None
) -> None:
    """Refuse `moelambda plan` options that the hardware or the stream would drop unsaid,
    before any loading: what `plan_traffic_on_hardware` (GPU-backed functions, `--hardware
    gpu|auto` with `--traffic`) and `planner.traffic.api.plan_traffic` would not honour.

    Args:
        options: The plan's options (`deployment`, the generation options).
        hardware: cpu, gpu or auto.
        traffic: The request stream, None without one.
        tokens: `--tokens` when given, None when left at its default.

    Raises:
        UsageError: An unknown hardware; GPU-backed functions without a stream or for a
            decoder's generation; a --deployment the GPU-backed candidates would not keep;
            --tokens with a stream (its batching decides the batch size).
    """
    if hardware not in ("cpu", "gpu", "auto"):
        raise UsageError(f"--hardware {hardware!r} is not cpu, gpu or auto.", "pass one of them.")
    generation = [
        flag
        for flag, value in (
            ("--slo-ttft", options.slo_ttft_s),
            ("--slo-tpot", options.slo_tpot_s),
            ("--batch-sequences", options.batch_sequences),
            ("--prompt-tokens", options.prompt_tokens),
            ("--new-tokens", options.new_tokens),
        )
        if value is not None
    ]
    if hardware == "gpu" and generation:
        raise UsageError(
            "--hardware gpu plans GPU-backed functions for a stream of batches, not yet a "
            f"decoder's generation ({', '.join(generation)}).",
            "pass --hardware cpu to plan the generation on CPU functions, or drop "
            f"{', '.join(generation)} and pass --traffic SPEC --slo-p99 SECONDS to plan "
            "GPU-backed functions for the stream's batches.",
        )
    if hardware == "gpu" and traffic is None:
        raise UsageError(
            "--hardware gpu plans GPU-backed functions for a request stream (their pool is "
            "billed by the hour).",
            "pass --traffic SPEC --slo-p99 SECONDS, or --hardware cpu.",
        )
    if (
        traffic is not None
        and not generation
        and hardware != "cpu"
        and options.deployment != "auto"
    ):
        default = " (the default)" if hardware == "auto" else ""
        raise UsageError(
            f"--deployment {options.deployment} with --hardware {hardware}{default}: the "
            "GPU-backed candidates have shapes of their own (one GPU function holding the "
            "model, layer stages, or a GPU driver with CPU experts), so the plan written "
            f"could be another shape than {options.deployment}.",
            f"pass --hardware cpu to plan the {options.deployment} deployment for the "
            "stream, or drop --deployment to weigh every shape.",
        )
    if traffic is not None and tokens is not None:
        raise UsageError(
            f"--tokens {tokens} with --traffic: the stream's batching decides the batch size "
            "(`plan --traffic` chooses the batch policy, the most tokens per batch and the "
            "longest wait, from the stream; a generation plans each request's own prompt).",
            "drop --tokens; the plan says the batch size it chose (max_batch_tokens).",
        )


def slo_of(slo: float | None, throughput: float | None, tokens: int) -> float | None:
    """The batch SLO in seconds: `slo`, or `tokens / throughput` (None: no SLO)."""
    if slo is not None and throughput is not None:
        raise UsageError("--slo and --throughput both set the SLO.", "pass only one of them.")
    for name, value in (("--slo", slo), ("--throughput", throughput)):
        if value is not None and not value > 0:
            raise UsageError(f"{name} {value} is not positive.", f"pass a positive {name}.")
    return tokens / throughput if throughput is not None else slo


def plan_confidence(confidence: float | None, counts: PlanningCounts) -> float:
    """The confidence level to plan at: `confidence`, by default `DEFAULT_CONFIDENCE` when the
    counts carry a distribution, else 0 (plan the predicted counts alone).

    Raises:
        UsageError: A level outside [0, 1), or above 0 for counts without a distribution.
    """
    if confidence is None:
        confidence = DEFAULT_CONFIDENCE if counts.dist is not None else 0.0
    if not 0.0 <= confidence < 1.0:
        raise UsageError(
            f"--confidence {confidence:g} is not in [0, 1).",
            "pass e.g. 0.99, or 0 for a plan of the predicted counts alone.",
        )
    if confidence > 0 and counts.dist is None:
        raise UsageError(
            "--confidence needs the predicted counts' distribution, which "
            + (
                "--traces does not measure."
                if "counts" not in counts.source
                else f"{counts.source['counts']} does not hold."
            ),
            "write the counts with `moelambda predict --counts-out FILE` (it measures the "
            "model error on held-out batches) and plan --counts FILE, or pass --confidence 0.",
        )
    return confidence


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
        UsageError: A bad option (see `PlanOptions.check`); generation options for an encoder,
            or with `slo_s` or `whole_curve`.
        InfeasibleError: No plan; the message names the binding constraint (of every shape).
        ground.plan.PlanError: The plan's reservations exceed the concurrency quota.
    """
    from planner.deployments import Candidate, infeasible_everywhere

    o = options or PlanOptions()
    methods, confidence = o.check(counts)
    if o.generating:
        if slo_s is not None or whole_curve:
            raise UsageError(
                "--slo and --pareto are a batch's; generation is planned under --slo-ttft (the "
                "prompts') and --slo-tpot (each further token's).",
                "drop --slo/--throughput and --pareto, or the generation options.",
            )
        return _plan_generating(manifest, counts, calibration, o, progress)
    started = time.perf_counter()
    shapes = o.shapes()
    candidates: list[Candidate] = []
    workflow: tuple[Plan, dict[str, Any], Solution, Frontier] | None = None
    errors: dict[str, Exception] = {}
    for shape in shapes:
        if progress is not None:
            progress(f"planning the {shape} deployment")
        try:
            if shape == "workflow":
                workflow = _plan_workflow(
                    manifest,
                    counts,
                    calibration,
                    o,
                    methods,
                    confidence,
                    slo_s,
                    whole_curve,
                    progress,
                )
                plan, solution = workflow[0], workflow[2]
                smallest = workflow[3].min_latency()
            else:
                plan, solution = _plan_shape(shape, manifest, counts, calibration, o, slo_s)
                smallest = solution.min_latency
            if o.concurrency_quota is not None:
                plan = plan.within_concurrency_quota(o.concurrency_quota)
        except (InfeasibleError, PlanError) as error:
            errors[shape] = error
            smallest_slo = _smallest_slo(error)
            candidates.append(Candidate(shape, None, _reason(error), smallest_slo_s=smallest_slo))
            continue
        candidates.append(
            Candidate(
                shape,
                plan,
                None,
                latency_s=plan.totals.latency_s,
                bill_usd=plan.totals.bill_usd["total_usd"],
                smallest_slo_s=smallest,
            )
        )
    feasible = [c for c in candidates if c.plan is not None]
    if not feasible:
        if len(shapes) == 1:
            raise errors[shapes[0]]
        raise infeasible_everywhere(candidates, slo_s)
    chosen = min(feasible, key=lambda c: (c.bill_usd, shapes.index(c.deployment)))
    assert chosen.plan is not None
    listed = [c.describe() for c in candidates]
    if chosen.deployment == "workflow":
        assert workflow is not None
        _, summary, solution, frontier = workflow
        document = chosen.plan  # with the concurrency quota it was checked against
    else:
        document = chosen.plan
        solution = None
        frontier = None if workflow is None else workflow[3]
        summary = _driver_summary(document, manifest, counts, chosen)
    document = document.model_copy(update={"candidates": listed})
    summary = summary | {
        "seconds": round(time.perf_counter() - started, 4),
        "deployment": chosen.deployment,
        "candidates": listed,
    }
    shaped = {c.deployment: c.plan for c in feasible if c.plan is not None}
    shaped[chosen.deployment] = document
    return PlannedDeployment(document, summary, solution, frontier, shaped)


def _reason(error: Exception) -> str:
    """An infeasible candidate's reason: the error's problem, without the advice."""
    return str(getattr(error, "problem", None) or error)


def _smallest_slo(error: Exception) -> float | None:
    """The smallest feasible SLO of a shape whose latency binds (else None)."""
    return getattr(error, "smallest_slo_s", None)


def _plan_workflow(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    o: PlanOptions,
    methods: tuple[Method, ...],
    confidence: float,
    slo_s: float | None,
    whole_curve: bool,
    progress: Callable[[str], None] | None,
) -> tuple[Plan, dict[str, Any], Solution, Frontier]:
    """The fan-out workflow's plan, its summary, solution and cost-vs-SLO curve."""
    from planner.build import instance_for, make_plan
    from planner.deploy import pack_sizes, plan_packed

    inst = instance_for(
        manifest,
        counts.counts,
        calibration,
        tokens=counts.tokens,
        arch=o.arch,
        workflow=o.workflow or "express",
        objective=o.objective,
    )
    sizes = pack_sizes(o.pack, inst.experts)
    inst, confident, solution, frontier, packings = plan_packed(
        inst,
        sizes,
        counts.dist,
        confidence,
        slo_s,
        o.solver,
        methods,
        whole_curve,
        o.workflow is None,
        calibration,
        progress=progress,
    )
    source = counts.source
    if confident is not None:
        source = source | {"confidence": confident.describe()}
    if inst.workflow == "express" and solution.latency > calibration.express_max_duration_s:
        raise InfeasibleError(
            f"the plan takes {solution.latency:.1f} s, over an Express workflow's "
            f"{calibration.express_max_duration_s:.0f} s.",
            "pass --workflow standard, or plan for fewer --tokens.",
        )
    document = make_plan(inst, solution, manifest, calibration, slo_s=slo_s, counts_source=source)
    summary: dict[str, Any] = {
        "solver": solution.solver,
        "workflow": inst.workflow,
        "objective": o.objective,
        "optimal": solution.optimal,
        "note": solution.note,
        "model": manifest.model,
        "tokens": counts.tokens,
        "slo_s": slo_s,
        "latency_s": round(solution.latency, 6),
        "objective_usd": solution.cost,
        "moe_cost_usd": solution.evaluation.experts_usd,
        "bill_usd": document.totals.bill_usd,
        "smallest_slo_s": round(frontier.min_latency(), 6),
        "experts_per_function": inst.hosted,
        "functions": sum(len(layer.experts) for layer in document.layers),
        "packing": packings,
        "confidence": None if confident is None else confident.describe(),
        "moefy": manifest.moefy,
        "quality": manifest.quality,
        "driver": None,
        "layers": [
            {
                "method": layer.method,
                "beta": layer.beta,
                "memory_mb": [e.memory_mb for e in layer.experts],
                "replicas": [e.replicas for e in layer.experts],
            }
            for layer in document.layers
        ],
    }
    return document, summary, solution, frontier


def _plan_shape(
    shape: str,
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    o: PlanOptions,
    slo_s: float | None,
) -> tuple[Plan, Any]:
    """A monolithic or driver plan of the predicted counts (`planner.deployments`)."""
    from planner.build import instance_for
    from planner.deployments import plan_driver_shape

    base = instance_for(
        manifest,
        counts.counts,
        calibration,
        tokens=counts.tokens,
        arch=o.arch,
        workflow=o.workflow or "express",
    )
    return plan_driver_shape(
        shape,
        base,
        manifest,
        calibration,
        slo_s,
        counts.source,
        choose_workflow=o.workflow is None,
    )


def _driver_summary(
    plan: Plan, manifest: Manifest, counts: PlanningCounts, chosen: Any
) -> dict[str, Any]:
    """`plan --json`'s summary of a monolithic or driver plan (the workflow's keys)."""
    assert plan.driver is not None
    bill = plan.totals.bill_usd
    return {
        "solver": plan.solver,
        "workflow": plan.workflow,
        "objective": plan.objective,
        "optimal": plan.optimal,
        "note": "",
        "model": manifest.model,
        "tokens": counts.tokens,
        "slo_s": plan.totals.slo_s,
        "latency_s": round(plan.totals.latency_s, 6),
        "objective_usd": bill["total_usd"],
        "moe_cost_usd": plan.totals.moe_cost_usd,
        "bill_usd": bill,
        "smallest_slo_s": None if chosen is None else chosen.smallest_slo_s,
        "experts_per_function": 1,
        "functions": sum(len(layer.experts) for layer in plan.layers),
        "packing": [],
        "confidence": None,
        "moefy": manifest.moefy,
        "quality": manifest.quality,
        "driver": {
            "memory_mb": plan.nonmoe_memory_mb,
            "local_experts": sum(len(x) for x in plan.driver.local),
            "local": plan.driver.local,
            "weights_mb": plan.driver.weights_mb,
            "activations_mb": plan.driver.activations_mb,
        },
        "layers": [
            {
                "method": "driver",
                "beta": 1,
                "local": plan.driver.local[layer.layer],
                "remote": [e.hosted[0] for e in layer.experts],
                "memory_mb": [e.memory_mb for e in layer.experts],
                "replicas": [e.replicas for e in layer.experts],
            }
            for layer in plan.layers
        ],
    }


def _plan_generating(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    o: PlanOptions,
    progress: Callable[[str], None] | None,
) -> PlannedDeployment:
    """The cheapest generating plan of every shape `o` allows (`planner.generation`), with
    each shape's TTFT, TPOT and bills, or why it is infeasible, as `candidates`."""
    from planner import generation as gen
    from planner.deployments import generation_plan
    from planner.shapes import load_shape

    started = time.perf_counter()
    shape = counts.source.get("shape")
    kv = None if shape is None else load_shape(shape).kv_bytes_per_token()
    listed: list[dict[str, Any]] = []
    planned: dict[str, tuple[Plan, GenerationSolution]] = {}
    errors: dict[str, Exception] = {}
    for deployment in o.shapes():
        if progress is not None:
            progress(f"planning the generating {deployment}")
        try:
            ginst, solution = gen.plan_generation(
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
    summary = _driver_summary(plan, manifest, counts, None) | {
        "seconds": round(time.perf_counter() - started, 4),
        "deployment": name,
        "candidates": listed,
        "generation": chosen,
    }
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
