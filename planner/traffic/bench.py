"""The traffic benchmark: today's steady-state plan against the traffic-aware plan.

For each arrival rate (a `--scale` of the shipped Azure conversation trace) and p99 SLO:
today's plan (`steady_state_plan`: a 10,240-token batch planned with the SLO) served one
execution per request with no capacity policy (as `synth` deploys it, each expert function
reserving its `max_replicas` of concurrency, and, as `steady_unreserved`, as
`synth --no-reserve-concurrency` deploys it), and `plan_for_traffic`'s plan, both simulated
over the same day. Where the trace is stretched enough, the plan is made on the first
`plan_hours` and both are judged on the day after them (out of sample); at rates where the
one-hour trace repeats within a day, there is no unseen traffic to judge on, and the report
says so. A (rate, SLO) that no candidate meets is listed under "infeasible" with the best p99
found. It also times a simulated day at the trace's own rate (target <= 10 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ground.driver import remote_table_bytes
from ground.errors import InfeasibleError
from ground.plan import Plan
from planner.calibration import Calibration
from planner.traffic.planning import PlanAt, plan_for_traffic, steady_state_plan
from planner.traffic.platform import platform_for
from planner.traffic.replay import policies_of, simulate_plan
from planner.traffic.simulate import TrafficResult, simulate
from planner.traffic.spec import Arrivals, load_arrivals
from planner.traffic.workflow import workflow_model

__all__ = ["DAY_TARGET_S", "compare", "plot_comparison", "scale_for"]

DAY_TARGET_S = 10.0
DAY_H = 24.0


def scale_for(rate_per_s: float, spec: str = "azure-conv") -> float:
    """The --scale that gives `spec` a mean rate of `rate_per_s` requests per second."""
    native = load_arrivals(spec)
    return rate_per_s / (native.requests / native.period_s)


def _judge(
    plan: Plan, arrivals: Arrivals, cal: Calibration, *, reserve: bool = True
) -> TrafficResult:
    policy, capacity, _ = policies_of(plan)
    largest = int(arrivals.tokens.max()) if arrivals.requests else 1
    model = workflow_model(plan, max(policy.max_tokens, largest))
    platform = platform_for(cal, model.functions, plan.arch, static_bytes=remote_table_bytes(plan))
    return simulate(model, arrivals, policy, platform, capacity, reserve=reserve)


def _row(result: TrafficResult, slo: float) -> dict[str, Any]:
    return {
        "latency_s": result.quantiles(),
        "slo_attainment": result.attainment(slo),
        "meets_p99": result.refused_batches == 0 and (result.quantiles()["p99"] or np.inf) <= slo,
        "cold_starts": int(sum(result.cold_starts.values())),
        "bill_usd": result.bill_usd,
        "per_million_tokens_usd": result.bill_usd["per_million_tokens_usd"],
        "reserved_concurrency_exceeded": result.over_reserved,
        "front_door": result.front_door,  # its bill by item and usage ({} without one)
    }


def compare(
    plan_at: PlanAt,
    fastest_s: Callable[[int], float],
    cal: Calibration,
    arch: str,
    *,
    rates_per_s: tuple[float, ...],
    slos_s: tuple[float, ...],
    plan_hours: Callable[[float], float],
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Steady-state against traffic-aware plans at each rate and SLO (see the module
    docstring), with the latencies of both for plotting under "latencies"."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    runs, latencies, infeasible = [], {}, []
    for rate in rates_per_s:
        scale = scale_for(rate)
        hours = plan_hours(rate)
        after = load_arrivals("azure-conv", scale=scale, hours=hours + DAY_H)
        trace_span_h = load_arrivals("azure-conv", scale=scale).period_s / 3600
        out_of_sample = trace_span_h >= hours + DAY_H
        day = (
            after.window(hours * 3600, (hours + DAY_H) * 3600)
            if out_of_sample
            else after.window(0, DAY_H * 3600)
        )
        planning = load_arrivals("azure-conv", scale=scale, hours=hours)
        for slo in slos_s:
            say(f"{rate:g} req/s, p99 {slo:g} s: today's plan")
            steady = steady_state_plan(plan_at, fastest_s, slo)
            say(f"{rate:g} req/s, p99 {slo:g} s: planning for traffic on {hours:g} h")
            try:
                choice = plan_for_traffic(plan_at, planning, slo, cal, arch, progress=say)
            except InfeasibleError as error:
                infeasible.append(
                    {"rate_per_s": rate, "slo_p99_s": slo, "reason": str(error.problem)}
                )
                continue
            say(f"{rate:g} req/s, p99 {slo:g} s: both over a day")
            steady_day = _judge(steady, day, cal)
            unreserved_day = _judge(steady, day, cal, reserve=False)
            aware_day = _judge(choice.plan, day, cal)
            t = choice.plan.traffic
            assert t is not None
            key = f"{rate:g}/s, p99 {slo:g} s"
            latencies[key] = {
                "steady": steady_day.latency_s,
                "unreserved": unreserved_day.latency_s,
                "traffic": aware_day.latency_s,
            }
            runs.append(
                {
                    "rate_per_s": rate,
                    "scale": scale,
                    "slo_p99_s": slo,
                    "planned_on_h": hours,
                    "judged_on": "the day after the planning period (out of sample)"
                    if out_of_sample
                    else "the same day (the one-hour trace repeats within a day)",
                    "requests_judged": day.requests,
                    "steady_unreserved": _row(unreserved_day, slo),
                    "steady": _row(steady_day, slo)
                    | {
                        "tokens_per_batch": steady.totals.tokens,
                        "batch_slo_s": steady.totals.slo_s,
                    },
                    "traffic_aware": _row(aware_day, slo)
                    | {
                        "max_batch_tokens": t.max_batch_tokens,
                        "max_wait_s": t.max_wait_s,
                        "capacity": t.simulated["capacity"],
                        "capacity_per_function": {
                            c.function: c.model_dump(exclude={"function"})
                            for c in t.capacity
                            if c.policy != "none"
                        },
                        "planned_p99_s": choice.result.quantiles()["p99"],
                        "candidates": len(choice.candidates),
                        "planning_s": round(choice.seconds, 2),
                    },
                    "plan": choice.plan,
                    "steady_plan": steady,
                }
            )
    say("a simulated day at the trace's own rate")
    native_day = load_arrivals("azure-conv", hours=DAY_H)
    steady = runs[0]["steady_plan"] if runs else steady_state_plan(plan_at, fastest_s, slos_s[0])
    timed = simulate_plan(steady, native_day, calibration=cal)
    return {
        "runs": runs,
        "infeasible": infeasible,
        "latencies": latencies,
        "day": {
            "requests": native_day.requests,
            "batches": timed["batches"],
            "wall_s": timed["wall_s"],
            "target_s": DAY_TARGET_S,
            "meets_target": timed["wall_s"] <= DAY_TARGET_S,
        },
        "seconds": round(time.perf_counter() - started, 2),
    }


def plot_comparison(path: Path, report: dict[str, Any], *, force: bool = False) -> str:
    """The PNG `bench traffic --plot` writes from `compare`'s report (with its "latencies"):
    per rate and SLO the latency distributions of today's plan, of it without reserved
    concurrency and of the traffic-aware plan, and beside them the bills. Returns the path.

    Example::

        report = bench_traffic(manifest, planning, load_calibration())
        plot_comparison(Path("out/traffic.png"), report, force=True)
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ground.files import write_file_atomically

    runs = report["runs"]
    fig, axes = plt.subplots(1, len(runs) + 1, figsize=(4.2 * (len(runs) + 1), 3.8))
    for ax, run in zip(axes, runs, strict=False):
        key = f"{run['rate_per_s']:g}/s, p99 {run['slo_p99_s']:g} s"
        for label, name, colour, style in (
            ("steady", "today's plan", "tab:red", "-"),
            ("unreserved", "today's, no reserved concurrency", "tab:orange", "--"),
            ("traffic", "traffic-aware", "tab:blue", "-"),
        ):
            lat = np.sort(report["latencies"][key][label])  # inf: refused or failed
            slower = 1.0 - np.arange(lat.size) / max(lat.size, 1)
            finite = np.isfinite(lat)
            ax.plot(lat[finite], slower[finite], label=name, color=colour, linestyle=style)
        ax.axvline(run["slo_p99_s"], color="grey", linestyle="--", linewidth=1)
        ax.axhline(0.01, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 1.0)
        ax.set_xlabel("request latency (s)")
        ax.set_ylabel("share of requests slower")
        ax.set_title(f"{run['rate_per_s']:g} req/s, p99 SLO {run['slo_p99_s']:g} s", fontsize=10)
        ax.legend(fontsize=7, loc="lower left")
        ax.grid(alpha=0.3)
    ax = axes[-1]
    labels = [f"{r['rate_per_s']:g}/s\n{r['slo_p99_s']:g} s" for r in runs]
    x = np.arange(len(runs))
    ax.bar(x - 0.2, [r["steady"]["per_million_tokens_usd"] for r in runs], 0.4,
           label="today's plan", color="tab:red")  # fmt: skip
    ax.bar(x + 0.2, [r["traffic_aware"]["per_million_tokens_usd"] for r in runs], 0.4,
           label="traffic-aware", color="tab:blue")  # fmt: skip
    ax.set_ylim(0, 1.3 * max(r["steady"]["per_million_tokens_usd"] for r in runs))
    ax.set_xticks(x, labels)
    ax.set_ylabel("bill per million tokens (USD)")
    ax.set_title("bill over the simulated day", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        write_file_atomically(
            path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), force=force
        )
    finally:
        plt.close(fig)
    return str(path)
