"""The deployment shapes a batch is planned as: one class and one registry line per shape.

Each shape plans the batch it is given (`BatchShape.plan`: its problem, its solver, the `Plan`
it writes, the summary `plan --json` prints, and the smallest SLO it could meet);
`planner.api.plan_deployment` plans every shape the options allow from `SHAPES` and keeps the
cheapest. Adding a shape is a class with `plan` and one line in `SHAPES` (tests register a toy
one). The shapes themselves:

    monolithic  one function holding the whole model (`planner.driver_solver.solve_monolithic`)
    driver      a driver invoking its remote experts (`planner.driver_solver.solve_driver`)
    workflow    the fan-out Step Functions workflow (`planner.deploy.plan_packed`)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ground.errors import InfeasibleError, UsageError

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.calibration import Calibration
    from planner.costmodel import Solution
    from planner.exact import Frontier
    from planner.instance import Method
    from planner.options import PlanningCounts, PlanOptions

__all__ = [
    "SHAPES",
    "BatchShape",
    "ShapePlanned",
    "ShapeRequest",
    "check_deployment",
    "check_shape",
    "driver_summary",
    "shapes_for",
]


@dataclass(frozen=True)
class ShapeRequest:
    """What every shape is planned from: the model, its counts, the platform, the options (with
    the methods and confidence level they allow) and the SLO."""

    manifest: Manifest
    counts: PlanningCounts
    calibration: Calibration
    options: PlanOptions
    methods: tuple[Method, ...]
    confidence: float
    slo_s: float | None
    whole_curve: bool = False
    progress: Callable[[str], None] | None = None


@dataclass(frozen=True)
class ShapePlanned:
    """A shape's cheapest plan of the batch: the document, the summary `plan --json` prints,
    the smallest SLO the shape meets, and the solver's solution and cost-vs-SLO curve where it
    has them (the workflow's, for `write_pareto`)."""

    plan: Plan
    summary: dict[str, Any]
    smallest_slo_s: float | None
    solution: Any = None
    frontier: Frontier | None = field(default=None, repr=False)


class BatchShape(Protocol):
    """A deployment shape a batch can be planned as: its name, whether it takes the fan-out
    workflow's own options (--objective experts, --method, --pack K), whether it generates."""

    name: str
    workflow_options: bool
    generates: bool

    def plan(self, request: ShapeRequest) -> ShapePlanned:
        """The shape's cheapest plan meeting the request's SLO.

        Raises:
            InfeasibleError: No plan of this shape; the message says why.
        """
        ...


@dataclass(frozen=True)
class _Workflow:
    """The fan-out workflow: per layer a scatter-gather method and pipeline degree, per expert
    a memory size and replicas."""

    name: str = "workflow"
    workflow_options: bool = True
    generates: bool = False  # a decode step would pay a transition and S3 per layer and token

    def plan(self, request: ShapeRequest) -> ShapePlanned:
        r = request
        document, summary, solution, frontier = _plan_workflow(
            r.manifest,
            r.counts,
            r.calibration,
            r.options,
            r.methods,
            r.confidence,
            r.slo_s,
            r.whole_curve,
            r.progress,
        )
        return ShapePlanned(document, summary, frontier.min_latency(), solution, frontier)


@dataclass(frozen=True)
class _Driven:
    """One function holding the model (monolithic), or a driver with its remote experts."""

    name: str
    workflow_options: bool = False
    generates: bool = True

    def plan(self, request: ShapeRequest) -> ShapePlanned:
        r = request
        document, solution = _plan_shape(
            self.name, r.manifest, r.counts, r.calibration, r.options, r.slo_s
        )
        summary = driver_summary(document, r.manifest, r.counts, solution.min_latency)
        return ShapePlanned(document, summary, solution.min_latency)


SHAPES: dict[str, BatchShape] = {
    "monolithic": _Driven("monolithic"),
    "driver": _Driven("driver"),
    "workflow": _Workflow(),
}


def check_deployment(deployment: str, *, objective: str, method: str | None, pack: str) -> None:
    """Refuse a shape that contradicts the other options, before any loading.

    Raises:
        UsageError: An unknown shape, or one that does not take the workflow's own options
            (--objective experts, --method, a --pack other than auto or 1) with one of them.
    """
    choices = ("auto", *SHAPES)
    if deployment not in choices:
        raise UsageError(
            f"unknown --deployment '{deployment}'.", f"use one of: {', '.join(choices)}."
        )
    if deployment == "auto" or SHAPES[deployment].workflow_options:
        return
    for flag, clash in (
        ("--objective experts", objective == "experts"),
        ("--method", method is not None),
        (f"--pack {pack}", pack not in ("auto", "1")),
    ):
        if clash:
            raise UsageError(
                f"{flag} is an option of the fan-out workflow, not of a {deployment} plan.",
                f"drop {flag.split()[0]}, or pass --deployment workflow.",
            )


def check_shape(options: PlanOptions) -> None:
    """Refuse a deployment shape the other options contradict (`check_deployment`), or one
    that does not generate where generation is planned.

    Raises:
        UsageError: As `check_deployment`; a shape that does not generate, with generation.
    """
    o = options
    check_deployment(o.deployment, objective=o.objective, method=o.method, pack=o.pack)
    if o.generating and o.deployment != "auto" and not SHAPES[o.deployment].generates:
        generating = ", ".join(n for n, s in SHAPES.items() if s.generates)
        raise UsageError(
            f"the {o.deployment} deployment does not generate: a decode step would pay a Step "
            "Functions transition and S3 round trips per layer and per token.",
            f"pass --deployment {generating} or auto with --slo-ttft/--slo-tpot.",
        )


def shapes_for(options: PlanOptions) -> list[str]:
    """The deployment shapes to plan, in the registry's order (cheapest-first on ties): the one
    --deployment names, else every shape; only those taking the workflow's own options where
    one is set; only those that generate when generating."""
    o = options
    if o.deployment != "auto":
        return [o.deployment]
    workflow_only = bool(o.workflow_only())
    return [
        name
        for name, shape in SHAPES.items()
        if (shape.generates or not o.generating) and (shape.workflow_options or not workflow_only)
    ]


def _instance(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    o: PlanOptions,
    **extra: Any,
) -> Any:
    """The per-expert problem every shape starts from (`planner.build.instance_for`), with the
    options' architecture and workflow type (Express until a shape finds it too long)."""
    from planner.build import instance_for

    return instance_for(
        manifest,
        counts.counts,
        calibration,
        tokens=counts.tokens,
        arch=o.arch,
        workflow=o.workflow or "express",
        **extra,
    )


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
    from planner.build import make_plan
    from planner.deploy import pack_sizes, plan_packed

    inst = _instance(manifest, counts, calibration, o, objective=o.objective)
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
    from planner.deployments import plan_driver_shape

    base = _instance(manifest, counts, calibration, o)
    return plan_driver_shape(
        shape,
        base,
        manifest,
        calibration,
        slo_s,
        counts.source,
        choose_workflow=o.workflow is None,
    )


def driver_summary(
    plan: Plan, manifest: Manifest, counts: PlanningCounts, smallest_slo_s: float | None
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
        "smallest_slo_s": smallest_slo_s,
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
