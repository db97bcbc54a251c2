"""Readable summaries of the traffic commands: `traffic`, `plan --traffic`, `bench traffic`
and `calibrate --cold`. Each takes the console and the summary the command prints with --json."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def traffic(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda traffic`: the latency quantiles, cold starts, the SLO, the period's bill."""
    lat, bill = summary["latency_s"], summary["bill_usd"]

    def fmt(value: float | None) -> str:  # None: refused or failed requests reach it
        return "unbounded" if value is None else f"{value:.3f} s"

    out.print(
        f"{summary['requests']:,} requests in {summary['batches']:,} batches over "
        f"{summary['period_s'] / 3600:.2f} h ({summary['traffic']['rate_per_s']:.4g} req/s): "
        f"latency p50 {fmt(lat['p50'])}, p95 {fmt(lat['p95'])}, p99 {fmt(lat['p99'])}, "
        f"max {fmt(lat['max'])}; {summary['cold_starts']['count']:,} cold starts.",
        highlight=False,
    )
    for line in _unserved(summary):
        out.print(line, highlight=False)
    if summary["slo_s"] is not None:
        out.print(
            f"SLO {summary['slo_s']:.3f} s met by {summary['slo_attainment']:.2%} of requests.",
            highlight=False,
        )
    for note in summary["notes"]:
        out.print(f"note: {note}.", highlight=False)
    table = Table(title="Bill of the period (USD)")
    table.add_column("item")
    table.add_column("USD", justify="right")
    for name, value in bill.items():
        table.add_row(name, f"{value:.6f}")
    out.print(table)


def _unserved(summary: dict[str, Any]) -> list[str]:
    """Why batches were refused or failed, in words (their requests' latency is unbounded)."""
    lines = []
    batches, refused = summary["batches"], summary.get("refused_batches", 0)
    if refused:
        largest = summary.get("largest_batch_served")
        most = f"the {largest:,} tokens" if largest is not None else "the tokens"
        lines.append(
            f"Refused: {refused:,} of {batches:,} batches held more than {most} the plan "
            "serves in one execution (an expert would need more replicas than its cap, "
            "max_replicas): their requests are not served and miss every SLO. Plan for larger "
            "batches (`moelambda plan --tokens`) or for this stream (`moelambda plan "
            "--traffic`), or send smaller requests."
        )
    failed = summary.get("failed_batches", 0)
    if failed:
        reached = summary.get("reserved_concurrency_reached") or {}
        at = ", ".join(
            f"{name} {row['peak']} of {row['reserved']}" for name, row in list(reached.items())[:3]
        )
        more = f" and {len(reached) - 3} more" if len(reached) > 3 else ""
        why = (
            f" (reserved concurrency reached: {at}{more})"
            if at
            else " (no environment was free within the reserved concurrency)"
        )
        lines.append(
            f"Failed: {failed:,} of {batches:,} batches were still throttled after the state "
            f"machine's last retry{why}: their requests are not served and miss every SLO. "
            "Lower the rate "
            "(--scale), simulate without the reservations (--no-reserve-concurrency), or plan "
            "for this stream (`moelambda plan --traffic`)."
        )
    return lines


def generation_traffic(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda traffic` of a generating plan: TTFT, TPOT and end to end, refusals, bill."""
    bill, refused = summary["bill_usd"], summary["refused"]

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.4g}"

    out.print(
        f"{summary['requests']:,} requests over {summary['period_s'] / 3600:.2f} h "
        f"({summary['traffic']['rate_per_s']:.4g} req/s), {summary['served']:,} served; "
        f"{summary['cold_starts']['count']:,} cold starts.",
        highlight=False,
    )
    table = Table(title="Latency of the served requests (s)")
    for column in ("", "p50", "p99", "max"):
        table.add_column(column, justify="right" if column else "left")
    rows = (
        ("time to first token", "ttft_s"),
        ("per output token", "tpot_s"),
        ("end to end", "e2e_s"),
    )
    for name, key in rows:
        q = summary[key]
        table.add_row(name, fmt(q["p50"]), fmt(q["p99"]), fmt(q["max"]))
    out.print(table)
    failed = summary["failed"]
    out.print(
        f"Refused: {refused['total']:,} ({summary['refused_fraction']:.2%}): "
        f"{refused['over_time_limit']:,} would outlast the {summary['time_limit_s']:g} s of "
        f"one invocation, {refused['over_memory']:,} need more memory for their KV cache, "
        f"{refused['over_replicas']:,} more replicas; failed: {failed['throttled']:,} "
        f"throttled, {failed['timed_out']:,} timed out.",
        highlight=False,
    )
    if summary["slo_s"] is not None:
        out.print(
            f"End-to-end SLO {summary['slo_s']:.3f} s met by {summary['slo_attainment']:.2%} "
            "of requests.",
            highlight=False,
        )
    out.print(
        f"Bill ${bill['total_usd']:.4f}: ${bill['per_million_input_usd']:.4f} per million "
        f"input tokens ({summary['input_tokens']:,}), ${bill['per_million_output_usd']:.4f} "
        f"per million output tokens ({summary['output_tokens']:,}).",
        highlight=False,
    )


def plan_traffic(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda plan --traffic`: the chosen batch and capacity policies, simulated."""
    bill, stream = summary["bill_usd"], summary["traffic"]
    weights = summary.get("weights")
    out.print(
        (f"{weights} weights. " if weights else "")
        + f"For {stream['requests']:,} requests ({stream['rate_per_s']:.4g}/s) with "
        f"p99 <= {summary['slo_p99_s']:g} s: batches of at most "
        f"{summary['max_batch_tokens']:,} tokens, waiting at most {summary['max_wait_s']:g} s; "
        f"capacity: {summary['capacity']}. Simulated p99 "
        f"{summary['latency_s']['p99']:.3f} s, bill ${bill['total_usd']:.4f} "
        f"(${bill['per_million_tokens_usd']:.4f} per million tokens), best of "
        f"{summary['candidates']} candidates in {summary['seconds']:.1f} s. "
        f"Wrote {summary['plan']}.",
        highlight=False,
    )
    for note in [*summary.get("notes", []), summary.get("weights_note")]:
        if note:
            out.print(f"note: {note}.", highlight=False)


def bench_traffic(out: Console, report: dict[str, Any]) -> None:
    """`moelambda bench traffic`: today's plan and the traffic-aware one per rate and SLO."""
    table = Table(title="Today's steady-state plan vs the traffic-aware plan (simulated day)")
    for column in ("rate /s", "p99 SLO s", "plan", "p99 s", "meets", "USD / M tokens", "policy"):
        table.add_column(column, justify="right" if column != "policy" else "left")
    for run in report["runs"]:
        for name, row in (
            ("today", run["steady"]),
            ("today, unreserved", run["steady_unreserved"]),
            ("traffic", run["traffic_aware"]),
        ):
            p99 = row["latency_s"]["p99"]
            policy = (
                f"{row['max_batch_tokens']:,} tokens, wait {row['max_wait_s']:g} s, "
                f"{row['capacity']}"
                if name == "traffic"
                else f"{run['steady']['tokens_per_batch']:,}-token plan, one execution per request"
            )
            table.add_row(
                f"{run['rate_per_s']:.4g}",
                f"{run['slo_p99_s']:g}",
                name,
                "unbounded" if p99 is None else f"{p99:.2f}",
                "yes" if row["meets_p99"] else "no",
                f"{row['per_million_tokens_usd']:.4f}",
                policy,
            )
    out.print(table)
    for row in report["infeasible"]:
        out.print(
            f"{row['rate_per_s']:.4g} req/s, p99 {row['slo_p99_s']:g} s: {row['reason']}",
            highlight=False,
        )
    day = report["day"]
    out.print(
        f"A simulated day at the trace's own rate ({day['requests']:,} requests): "
        f"{day['wall_s']:.2f} s (target <= {day['target_s']:g} s). Plot: {report['plot']}.",
        highlight=False,
    )


def calibrate_cold(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda calibrate --cold`: each role's INIT, and the fitted load time."""
    table = Table(title=f"Handler INIT on this machine, written to {summary['file']}")
    for column in ("role", "stage MB", "import s", "download s", "build s"):
        table.add_column(column, justify="right")
    for row in summary["samples"]:
        table.add_row(
            str(row["role"]),
            f"{int(row['stage_bytes']) / 1e6:.2f}",
            f"{float(row['import_s']):.2f}",
            f"{float(row['download_s']):.3f}",
            f"{float(row['build_s']):.2f}",
        )
    out.print(table)
    out.print(
        f"Interpreter start {summary['python_start_s']:.3f} s; load = "
        f"{summary['load_fixed_s']:.3f} s + {summary['load_s_per_byte'] * 1e9:.2f} s/GB "
        f"(median of {summary['repeats']} fresh processes per role).",
        highlight=False,
    )


def hardware(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda plan --traffic --hardware`: every candidate, CPU and GPU-backed."""
    table = Table(title="CPU and GPU-backed candidates (GPU timings predicted, not measured)")
    for column in ("hardware", "shape", "p99 s", "USD / M tokens", "pool", "deployable", "note"):
        table.add_column(column, justify="right" if "USD" in column or "p99" in column else "left")
    for name, row in summary["hardware"].items():
        p99 = row.get("p99_s")
        usd = row.get("per_million_tokens_usd")
        pool = (
            f"{row['instances']} x {row['instance_type']}"
            if row.get("instances")
            else row.get("capacity") or "-"
        )
        table.add_row(
            name + (" (chosen)" if name == summary["hardware_chosen"] else ""),
            str(row.get("shape") or "-"),
            "-" if p99 is None else f"{p99:.2f}",
            "-" if usd is None or not row.get("feasible") else f"{usd:.4f}",
            pool,
            "yes" if row.get("deployable") else "no",
            row.get("reason") or row.get("not_chosen_because") or "",
        )
    out.print(table)


def stream_plan(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda plan --traffic --slo-ttft --slo-tpot`: the workers chosen, what the
    simulation of the stream gives them, and the period's bill."""
    s = summary["stream"]
    out.print(
        f"Plan written to {summary['plan']}: {s['workers']} {summary['deployment']} workers "
        f"of {summary['memory_mb']:,} MB, {s['slots']} slots each, idle exit "
        f"{s['idle_exit_s']:g} s; admits prompts up to {s['max_prompt_tokens']:,} tokens "
        f"generating up to {s['max_new_tokens']:,} (decode step: {summary['step_source']}).",
        highlight=False,
    )
    stream_traffic(out, summary, slo=(s["slo_ttft_s"], s["slo_tpot_s"]))


def stream_traffic(
    out: Console, summary: dict[str, Any], slo: tuple[float, float] | None = None
) -> None:
    """`moelambda traffic` of a stream plan (and the rest of `stream_plan`): TTFT and TPOT
    quantiles, throughput, workers, and the period's bill."""

    def q(name: str) -> str:
        v = summary[name]
        return "none" if v["p99"] is None else f"p50 {v['p50']:.3f} s, p99 {v['p99']:.3f} s"

    ttft_slo, tpot_slo = (
        ("", "") if slo is None else (f" (SLO {slo[0]:g} s)", f" (SLO {slo[1]:g} s)")
    )
    out.print(
        f"{summary['requests']:,} requests ({summary['refused']:,} refused as longer than "
        f"admitted) over {summary['period_s'] / 3600:.2f} h: TTFT {q('ttft_s')}{ttft_slo}; "
        f"TPOT {q('tpot_s')}{tpot_slo}; "
        f"{summary['output_tokens_per_s']:.1f} output tokens/s, mean batch "
        f"{summary['mean_decode_batch']:.2f}; {summary['invocations']:,} invocations, "
        f"{summary['cold_starts']:,} cold starts, at most {summary['peak_workers']} workers.",
        highlight=False,
    )
    table = Table(title="Bill of the period (USD)")
    table.add_column("item")
    table.add_column("USD", justify="right")
    for name, value in summary["bill_usd"].items():
        table.add_row(name, f"{value:.6f}")
    out.print(table)
