"""What `moelambda run-local` prints: a local run's check and bill, a replay's measured
against simulated."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

__all__ = ["agreement_line", "replay", "run_local"]


def replay(console: Console, summary: dict[str, Any]) -> None:
    """Measured against simulated: cold starts, latency quantiles, per function, contention."""
    from rich.table import Table

    measured, simulated = summary["measured"], summary["simulated"]

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.2f}" if isinstance(value, float) else f"{value:,}"

    table = Table(title="replay on real processes vs the traffic simulator, same arrivals")
    for column in ("", "measured", "simulated"):
        table.add_column(column, justify="left" if not column else "right")
    table.add_row("batches", cell(measured["batches"]), cell(simulated["batches"]))
    table.add_row(
        "failed batches", cell(measured["failed_batches"]), cell(simulated["failed_batches"])
    )
    table.add_row(
        "cold starts",
        cell(measured["cold_starts"]["count"]),
        cell(simulated["cold_starts"]["count"]),
    )
    for q in ("p50", "p95", "p99", "max"):
        table.add_row(
            f"latency {q} (s)", cell(measured["latency_s"][q]), cell(simulated["latency_s"][q])
        )
    console.print(table)
    per = Table(title="cold starts per function")
    for column in ("function", "measured", "simulated"):
        per.add_column(column, justify="left" if column == "function" else "right")
    names = dict.fromkeys(
        [*measured["cold_starts"]["per_function"], *simulated["cold_starts"]["per_function"]]
    )
    for name in names:
        per.add_row(
            name,
            str(measured["cold_starts"]["per_function"].get(name, 0)),
            str(simulated["cold_starts"]["per_function"].get(name, 0)),
        )
    if names:
        console.print(per)
    arrivals, idle = summary["arrivals"], summary["idle_reclaim_s"]
    contention = summary["contention"]
    console.print(
        f"{arrivals['requests']:,} request(s) over {arrivals['period_s']:g} s (compressed "
        f"{summary['compression']:g}x from {summary['traffic']['period_s']:g} s), idle reclaim "
        f"{idle['replayed']:g} s ({idle['uncompressed']:g} s uncompressed); trace "
        f"{summary['trace_wall_s']:g} s, all {summary['wall_s']:g} s."
    )
    trace_init = contention["trace_init_s"]
    console.print(
        f"INIT fed to the simulator: median {contention['fed_init_s']['median']} s; "
        + (
            "no cold start in the trace"
            if trace_init["median"] is None
            else f"INIT of the trace's cold starts: median {trace_init['median']} s, max "
            f"{trace_init['max']} s, at most "
            f"{max(map(int, contention['starting_at_once']))} starting at once"
        )
        + f"; warm calls took {contention['warm_call_vs_fed']['median']}x their fed duration "
        "(median)."
    )
    console.print(agreement_line(summary["agreement"]))


def agreement_line(agreement: dict[str, Any]) -> str:
    """A replay's measured over simulated cold starts and p99, and p99 without the requests
    that waited on a crowded start of their own, with how many those were and the verdict (none
    when they were more than a quarter: what is left no longer stands for the trace)."""

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    line = (
        f"measured / simulated: cold starts "
        f"{ratio(agreement['cold_starts_measured_over_simulated'])}, "
        f"p99 {ratio(agreement['p99_measured_over_simulated'])}"
    )
    within = agreement["within_host"]
    bound = len(within["host_bound_requests"])
    if not bound:
        return line + "."
    if within["no_verdict"] is not None:
        verdict = f"no verdict: {within['no_verdict']}"
    else:
        verdict = "within 30 %" if within["p99_within_30pct"] else "not within 30 %"
    share = within["excluded_share"] * 100
    return (
        f"{line}; {bound} of {bound + within['requests']} request(s) ({share:.0f} %) waited on a "
        f"cold start of their own begun while more than {within['cores']} environments were "
        f"starting (this machine's cores), p99 without them "
        f"{ratio(within['p99_measured_over_simulated'])} ({verdict})."
    )


def run_local(console: Console, summary: dict[str, Any]) -> None:
    """Per function predicted against measured seconds, metered against planned, the verdict."""
    from moelambda.cli import _render_local

    console.print(_render_local.seconds_table(summary))
    _render_local.driver_layers(console, summary)
    if summary["metered"] is not None:
        # Polls and GB-seconds depend on timing (handlers here run slower than on Lambda); the
        # requests and transitions of a successful run do not.
        console.print(
            _side_by_side(
                "usage: metered on moto vs planned",
                ("metered", "planned"),
                (summary["metered"], summary["planned"]),
                _amount,
            )
        )
        bill = summary["bill"]
        console.print(
            _side_by_side(
                "bill in USD, at the plan's prices (metered: this machine's seconds)",
                ("planned", "metered"),
                (bill["planned"], bill["metered"]),
                lambda usd: f"{usd:.3g}",
            )
        )
        _render_local.metering(console, summary)
    request = summary["predicted_vs_measured"]["request"]
    diff = summary["max_abs_diff_vs_monolithic"]
    console.print(
        f"{summary['status']}: {summary['succeeded']} of {summary['requests']} request(s) of "
        f"{summary['tokens']} tokens succeeded in {summary['wall_s']} s; "
        f"max |output - monolithic| = {'-' if diff is None else f'{diff:.2g}'}; "
        f"intermediates left: {summary['intermediates_left']}; request latency predicted "
        f"{request['predicted_s']} s, measured {request['measured_s']} s."
    )
    if summary["faults_injected"]:
        injected = ", ".join(f"{k} x{v}" for k, v in sorted(summary["faults_injected"].items()))
        console.print(f"Faults injected: {injected}.")
    denied = summary["access_denied"]
    console.print(
        "Every S3 request and Invoke was checked against its function's IAM policy: "
        + (
            "none refused."
            if not denied
            else f"[red]{len(denied)} refused[/red], e.g. {denied[0]}."
        )
    )
    if summary["metered"] is None:
        console.print("Metering needs one execution and no faults: --requests 1, no --faults.")
    console.print(_beside(summary), highlight=False)
    gpu = summary.get("gpu_backed")
    if gpu:
        sizes = ", ".join(f"{name} {gib} GiB" for name, gib in gpu["accelerator_gib"].items())
        moved = summary.get("placement") or {}
        where = (
            "ran on this machine's CPU at float32 ("
            + ", ".join(f"{name} planned on {p['planned']}" for name, p in moved.items())
            + "), the same handlers on the same stages"
            if moved
            else "ran on their planned device"
        )
        console.print(
            f"GPU-backed plan ({sizes} on {gpu['instances']} x {gpu['instance_type']}): its GPU "
            f"functions {where}; the plan's GPU request time "
            f"({gpu['predicted_request_s']:.3f} s) and its pool's bill are the GPU model's "
            "predictions, not measured here (scripts/gpu-check measures them on a GPU).",
            highlight=False,
        )
    for failure in summary["failed"]:
        console.print(f"[red]{failure['error']}[/red]: {failure['cause']}")


def _beside(summary: dict[str, Any]) -> str:
    """The other shapes the plan was chosen over, as `plan` priced them for its batch."""
    shape = summary.get("deployment") or "workflow"
    others = [c for c in summary.get("candidates") or [] if c["deployment"] != shape]
    mine = next((c for c in summary.get("candidates") or [] if c["deployment"] == shape), None)
    if not others or mine is None:
        return f"A {shape} deployment."
    parts = []
    for c in others:
        if c["feasible"]:
            ratio = c["bill_usd"] / mine["bill_usd"] if mine["bill_usd"] else float("nan")
            parts.append(
                f"the {c['deployment']} would bill ${c['bill_usd']:.6f} per batch "
                f"({ratio:.1f} x) in {c['latency_s']:.2f} s"
            )
        else:
            parts.append(f"the {c['deployment']} is infeasible ({c['reason']})")
    return (
        f"A {shape} deployment, planned at ${mine['bill_usd']:.6f} per batch in "
        f"{mine['latency_s']:.2f} s; beside it " + "; ".join(parts) + " (`moelambda plan`)."
    )


def _side_by_side(
    title: str, columns: tuple[str, str], values: tuple[dict, dict], fmt: Callable[[float], str]
) -> Any:
    """A table of two dicts by key (the first dict's order, then the second's other keys)."""
    from rich.table import Table

    table = Table(title=title)
    for column in ("item", *columns):
        table.add_column(column, justify="left" if column == "item" else "right")
    first, second = values
    for key in [*first, *(k for k in second if k not in first)]:
        cells = [first.get(key), second.get(key)]
        table.add_row(key, *("-" if v is None else fmt(v) for v in cells))
    return table


def _amount(value: float) -> str:
    """A count with thousands separators; a fractional amount (GB-s) to three decimals."""
    return f"{value:,.3f}" if value != int(value) else f"{int(value):,}"


def front_door(console: Console, summary: dict[str, Any]) -> None:
    """The executions the batcher started, each request's check, the front door's billing."""
    from rich.table import Table

    policy = summary["batch_policy"]
    console.print(
        f"{len(summary['requests'])} request(s) -> {len(summary['executions'])} execution(s) "
        f"(batches of at most {policy['max_batch_tokens']:,} tokens, wait "
        f"{policy['max_wait_s']:g} s)"
    )
    table = Table(title="front door: metered on moto vs planned")
    for column in ("item", "metered", "planned"):
        table.add_column(column, justify="left" if column == "item" else "right")
    planned = summary["front_door_planned"]
    for key, value in summary["front_door_metered"].items():
        expected = planned.get(key)
        table.add_row(key, f"{value:g}", "-" if expected is None else f"{expected:g}")
    console.print(table)
    worst = summary["max_abs_diff_vs_monolithic"]
    console.print(
        f"{summary['status']}: max |output - monolithic| "
        f"{'-' if worst is None else f'{worst:.2e}'}; front door metered "
        + ("= planned." if summary["metered_equals_planned"] else "!= planned.")
    )
