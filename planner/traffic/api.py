"""Planning for a request stream in a call: what `moelambda plan --traffic` (for a batch
plan, or a decoder's generation one request per invocation, `--per-request`) and `moelambda
bench traffic` do (`moelambda traffic` is `planner.traffic.simulate_plan`; a decoder's stream
served by continuously batching workers is `planner.stream.plan_stream`).

Each function takes loaded inputs (the model's manifest, the predicted counts, the
calibration), checks them, does the work and returns JSON-ready results; the command line only
parses, loads the model and renders.

Example (counts from `moelambda predict --counts-out out/counts.json`)::

    from planner import counts_for_plan, load_calibration
    from planner.traffic.api import plan_traffic

    counts = counts_for_plan(counts=Path("out/counts.json"), tokens=10240)
    choice, summary = plan_traffic(manifest, counts, load_calibration(),
                                   traffic="poisson:1", slo_p99_s=10, hours=1)
    choice.plan.save("out/plan-traffic.json")
    print(summary["bill_usd"]["per_million_tokens_usd"])
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from ground.errors import InfeasibleError, UsageError
from ground.progress import Status, quiet

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.api import PlanningCounts, PlanOptions
    from planner.calibration import Calibration
    from planner.traffic.planning import TrafficChoice

__all__ = [
    "BENCH_TOKENS",
    "GENERATION_QUANTILE",
    "bench_traffic",
    "plan_generation_traffic",
    "plan_traffic",
]

BENCH_TOKENS = 10240  # tokens per batch of today's plan in `bench traffic`
GENERATION_QUANTILE = 0.99  # a generating plan for a stream is sized for this request length


def plan_traffic(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    traffic: str,
    slo_p99_s: float,
    scale: float = 1.0,
    hours: float | None = None,
    seed: int = 0,
    idle_s: float | None = None,
    options: PlanOptions | None = None,
    status: Status = quiet,
) -> tuple[TrafficChoice, dict[str, Any]]:
    """The batch policy, MoE plan and capacity policy for a request stream under a p99 SLO.

    The MoE plan of each batch size is `moelambda plan`'s (`planner.api.plan_deployment`);
    `planner.traffic.planning.plan_for_traffic` searches the batch and capacity
    policies and simulates each candidate over the stream, once per deployment shape the
    options allow (one function, a driver, the workflow: its cold starts, its concurrency);
    the cheapest period's bill that meets the SLO is kept, and `deployments` lists each.

    Example::

        choice, summary = plan_traffic(manifest, planning, cal, traffic="azure-conv",
                                       slo_p99_s=10, options=PlanOptions(pack="1"))
        print(summary["max_batch_tokens"], summary["capacity"])

    Args:
        manifest: The model's manifest.
        counts: Predicted counts (`planner.api.counts_for_plan`); scaled to each batch size.
        calibration: With every traffic parameter (`planner.traffic.platform.init_model`).
        traffic: A CSV, 'azure-conv', 'poisson:RATE' or 'diurnal:PEAK,TROUGH'.
        slo_p99_s: The p99 latency per request to meet, seconds.
        scale: Multiply the stream's arrival rate (`planner.traffic.load_arrivals`).
        hours: Hours of the stream to plan on. Defaults to None (the trace's).
        seed: Seeds synthetic arrivals.
        idle_s: Idle seconds before reclaim. Defaults to None (the calibration's).
        options: How each batch size's MoE plan is made (`planner.api.PlanOptions`).
            Defaults to None: the command's defaults.
        status: Wraps the search (a spinner in the CLI); gets a message-taking `update`.

    Returns:
        The choice (its `plan` carries the traffic block) and the summary `plan --traffic
        --json` prints, without the file name.

    Raises:
        UsageError: A bad option, or a stream without a request.
        InfeasibleError: No candidate meets the SLO.
    """
    from planner.api import PlanOptions, weights_on_cpu
    from planner.batch_shapes import check_shape, shapes_for
    from planner.traffic import load_arrivals
    from planner.traffic.planning import moe_plan_at, plan_for_traffic
    from planner.traffic.platform import init_model

    o = options or PlanOptions()
    methods, confidence = o.check(counts)
    check_shape(o)
    weights = weights_on_cpu(manifest, calibration, o.arch)
    if not slo_p99_s > 0:
        raise UsageError(f"--slo-p99 {slo_p99_s} is not positive.", "pass e.g. --slo-p99 10.")
    init_model(calibration)  # fail on missing traffic parameters before any planning
    arrivals = load_arrivals(traffic, scale=scale, hours=hours, seed=seed)
    if arrivals.requests == 0:
        raise UsageError(
            f"--traffic {traffic} gives no request in the period.",
            "raise --scale or --hours.",
        )
    shapes = shapes_for(o)
    choices: dict[str, TrafficChoice] = {}
    reasons: dict[str, str] = {}
    with status("planning for traffic") as shown:
        for shape in shapes:
            plan_at = moe_plan_at(
                manifest,
                counts.counts,
                counts.tokens,
                calibration,
                arch=o.arch,
                workflow=o.workflow,
                objective=o.objective,
                solver=o.solver,
                methods=methods,
                pack=o.pack,
                dist=counts.dist,
                confidence=confidence,
                counts_source=counts.source,
                deployment=shape,
            )
            shown.update(f"planning the {shape} deployment for traffic")
            try:
                choices[shape] = plan_for_traffic(
                    plan_at,
                    arrivals,
                    slo_p99_s,
                    calibration,
                    o.arch,
                    idle_s=idle_s,
                    progress=lambda message, shape=shape: shown.update(f"{shape}: {message}"),
                )
            except InfeasibleError as error:
                if len(shapes) == 1:
                    raise
                reasons[shape] = str(error.problem)
    if not choices:
        raise InfeasibleError(
            "no deployment shape meets the p99 SLO on this traffic ("
            + "; ".join(f"{k}: {v}" for k, v in reasons.items())
            + ").",
            "raise --slo-p99, or plan smaller batches.",
        )
    shape = min(choices, key=lambda k: (choices[k].result.bill_usd["total_usd"], shapes.index(k)))
    choice = choices[shape]
    if o.concurrency_quota is not None:
        choice = dataclasses.replace(
            choice, plan=choice.plan.within_concurrency_quota(o.concurrency_quota)
        )
    t = choice.plan.traffic
    assert t is not None
    summary = weights | {
        "traffic": arrivals.describe(),
        "slo_p99_s": slo_p99_s,
        "max_batch_tokens": t.max_batch_tokens,
        "max_wait_s": t.max_wait_s,
        "capacity": t.simulated["capacity"],
        "capacity_per_function": [c.model_dump() for c in t.capacity if c.policy != "none"],
        "latency_s": t.simulated["latency_s"],
        "slo_attainment": t.simulated["slo_attainment"],
        "bill_usd": t.simulated["bill_usd"],
        "notes": t.simulated["notes"],
        "tokens_per_batch_planned": choice.plan.totals.tokens,
        "batch_latency_s": choice.plan.totals.latency_s,
        "candidates": len(choice.candidates),
        "seconds": round(sum(c.seconds for c in choices.values()), 3),
        "deployment": shape,
        "deployments": [
            {
                "deployment": k,
                "feasible": k in choices,
                "per_million_tokens_usd": (
                    choices[k].result.bill_usd["per_million_tokens_usd"] if k in choices else None
                ),
                "total_usd": choices[k].result.bill_usd["total_usd"] if k in choices else None,
                "p99_s": choices[k].result.quantiles()["p99"] if k in choices else None,
                "reason": reasons.get(k),
            }
            for k in shapes
        ],
    }
    return choice, summary


def plan_generation_traffic(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    traffic: str,
    options: PlanOptions,
    scale: float = 1.0,
    hours: float | None = None,
    seed: int = 0,
    idle_s: float | None = None,
    reserve: bool = True,
    status: Status = quiet,
) -> tuple[Plan, dict[str, Any]]:
    """A decoder's generating plan for a request stream, and the stream simulated through it,
    each request in its own invocation: the per-request path (`plan --traffic --slo-ttft
    --slo-tpot --per-request`, and what `bench generate` compares workers against). The
    default, workers that batch requests continuously over a queue, is
    `planner.stream.plan_stream`.

    Each request is its own driver invocation (one sequence; `planner.traffic.generation`).
    The plan is `moelambda plan --slo-ttft/--slo-tpot`'s (`planner.api.plan_deployment`) for
    one sequence whose prompt and generation are the stream's `GENERATION_QUANTILE` lengths
    (unless the options give them): the driver holds the KV cache of all but the longest
    requests, its workflow is Standard where their generation outlasts Express's duration, and
    the TTFT SLO holds, warm, for that share of the prompts. The simulation then reports what
    cold starts add, the requests refused, and the bill per million input and output tokens.

    Example::

        options = PlanOptions(slo_ttft_s=300, slo_tpot_s=5, concurrency_quota=100_000)
        plan, summary = plan_generation_traffic(manifest, planning, load_calibration(),
                                                traffic="azure-conv", options=options)
        print(summary["traffic"]["ttft_s"]["p99"], summary["traffic"]["bill_usd"])

    `reserve` is whether the stack reserves each expert's `max_replicas` of concurrency, as
    `synth` emits it unless `--no-reserve-concurrency`.

    Raises:
        UsageError: More than one sequence per batch, or a stream without a request or
            without the tokens each generates.
        InfeasibleError: No plan meets the SLOs for those lengths.
    """
    import numpy as np

    from planner.api import plan_deployment
    from planner.traffic import simulate_plan
    from planner.traffic.platform import init_model
    from planner.traffic.spec import generation_arrivals

    if options.batch_sequences not in (None, 1):
        raise UsageError(
            f"--batch-sequences {options.batch_sequences} with --traffic: each request of a "
            "stream is decoded in its own invocation (batching requests together is not built).",
            "drop --batch-sequences.",
        )
    init_model(calibration)
    arrivals = generation_arrivals(traffic, scale=scale, hours=hours, seed=seed)

    def length(given: int | None, values: np.ndarray) -> int:
        if given is not None:
            return given
        return int(np.quantile(values, GENERATION_QUANTILE, method="inverted_cdf"))

    sized = dataclasses.replace(
        options,
        batch_sequences=1,
        prompt_tokens=length(options.prompt_tokens, arrivals.tokens),
        new_tokens=length(options.new_tokens, arrivals.generated),
    )
    with status("planning generation for traffic") as shown:
        planned = plan_deployment(manifest, counts, calibration, options=sized)
        shown.update(f"simulating {arrivals.requests:,} requests")
        simulated = simulate_plan(
            planned.plan, arrivals, idle_s=idle_s, calibration=calibration, reserve=reserve
        )
    return planned.plan, planned.summary | {"traffic": simulated}


def bench_traffic(
    manifest: Manifest,
    counts: PlanningCounts,
    calibration: Calibration,
    *,
    rates_per_s: tuple[float, ...] = (1 / 60, 10.0),
    slos_s: tuple[float, ...] = (10.0,),
    status: Status = quiet,
) -> dict[str, Any]:
    """Today's steady-state plan against the traffic-aware plan on the Azure conversation trace.

    At each rate (the trace's --scale giving it) and p99 SLO: both plans simulated over a
    day, as `planner.traffic.bench.compare` describes; plans are made on 72 h of traffic below 1
    request/s (judged on the day after), on 1 h above. The counts are planned at the default
    confidence (0.99 when they carry a distribution).

    Example::

        report = bench_traffic(manifest, counts_for_plan(counts=path, tokens=BENCH_TOKENS),
                               load_calibration(), rates_per_s=(10.0,))
        plot_comparison(Path("out/traffic.png"), report)

    Args:
        manifest: The model's manifest.
        counts: Predicted counts at `BENCH_TOKENS` tokens (`planner.api.counts_for_plan`).
        calibration: With every traffic parameter.
        rates_per_s: Mean arrival rates, requests per second.
        slos_s: p99 SLOs, seconds.
        status: Wraps the comparison (a spinner in the CLI).

    Returns:
        The report `bench traffic --json` prints (without the plot), plus "latencies" (per run,
        every request's latency under each plan) for `planner.traffic.bench.plot_comparison`.
    """
    from planner.api import plan_confidence
    from planner.traffic.bench import compare
    from planner.traffic.planning import fastest_latency, moe_plan_at
    from planner.traffic.platform import init_model

    if any(not s > 0 for s in slos_s) or any(not r > 0 for r in rates_per_s):
        raise UsageError("--slo-p99 and --rates must be positive.", "pass positive numbers.")
    init_model(calibration)
    plan_at = moe_plan_at(
        manifest,
        counts.counts,
        counts.tokens,
        calibration,
        dist=counts.dist,
        confidence=plan_confidence(None, counts),
        counts_source=counts.source,
    )
    with status("comparing plans") as shown:
        report = compare(
            plan_at,
            fastest_latency(manifest, counts.counts, counts.tokens, calibration),
            calibration,
            "x86_64",
            rates_per_s=rates_per_s,
            slos_s=slos_s,
            plan_hours=lambda rate: 72.0 if rate < 1.0 else 1.0,
            progress=shown.update,
        )
    for run in report["runs"]:
        run.pop("plan")
        run.pop("steady_plan")
    return report
