"""Readable summaries of the commands' JSON results: rich tables and a few lines each.

Every function takes the console to print on and the summary the command prints with `--json`,
so what a person reads and what a script parses come from the same numbers. This module holds the
shared helpers (`table`, `facts`) and the serverless path's summaries (profile, plan, the
profiler, predictor and planner benchmarks); `_render_gpu`, `_render_cluster` and
`_render_traffic` hold the other topics'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from ground.topology import topology


def _titled(title: str, body: Table) -> Group:
    """The title on a line of its own above the table: a rich title is folded to the table's
    width, and these titles say more than a narrow table is wide."""
    return Group(Text(title, style="bold"), body)


def table(
    title: str, columns: Sequence[str], rows: Iterable[Sequence[str]], *, left: int = 1
) -> Group:
    """A titled table whose first `left` columns (text) are left-aligned and the others
    (numbers) right-aligned."""
    out = Table()
    for i, column in enumerate(columns):
        out.add_column(column, justify="left" if i < left else "right")
    for row in rows:
        out.add_row(*row)
    return _titled(title, out)


def facts(title: str, pairs: Iterable[tuple[str, str]]) -> Group:
    """A titled two-column table of named values."""
    out = Table(show_header=False)
    out.add_column("", justify="left")
    out.add_column("", justify="right")
    for name, value in pairs:
        out.add_row(name, value)
    return _titled(title, out)


def optional(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def yes_no(flag: bool | None) -> str:
    return {None: "-", True: "yes", False: "NO"}[flag]


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


# Profiling


def popularity(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda profile`: each layer's tokens per expert, the speed and the trace."""
    grid = Table(
        title=f"Expert popularity: {summary['model']}, E={summary['experts']}, "
        f"top-{summary['top_k']}, {summary['tokens']:,} tokens of '{summary['corpus']}'"
    )
    grid.add_column("layer", justify="right")
    for e in range(summary["experts"]):
        grid.add_column(f"e{e}", justify="right")
    grid.add_column("max/mean", justify="right")
    fits = summary["router_fit"]
    if fits:
        grid.add_column("router acc.", justify="right")
    mean = summary["tokens"] * summary["top_k"] / summary["experts"]
    for layer, counts in enumerate(summary["popularity"]):
        row = [str(layer), *(f"{c:,}" for c in counts), f"{max(counts) / mean:.2f}"]
        if fits:
            row.append(f"{fits[layer]['accuracy']:.1%}")
        grid.add_row(*row)
    out.print(grid)
    out.print(
        f"{summary['tokens_per_s']:,.0f} tokens/s profiling (model load and MoEfication "
        f"{summary['load_s']:.1f} s). Trace: {summary['trace']}"
    )
    if summary["quality"]:
        from moe import Quality

        quality = Quality(**summary["quality"])
        out.print(f"Served model against the dense one: {quality.headline()}. {quality.where()}")


# Planning


def plan(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda plan`: the deployment shapes weighed, the chosen plan's layers, its latency,
    bill and files."""
    if summary.get("generation") is not None:
        _generation_plan(out, summary)
        return
    slo = "no SLO (cheapest)" if summary["slo_s"] is None else f"SLO {summary['slo_s']:.3f} s"
    title = (
        f"Plan for {summary['model']}{weights_words(summary)}: {summary['tokens']:,} tokens per "
        f"batch, {slo}"
    )
    if len(summary.get("candidates", [])) > 1:
        out.print(candidates(summary, title="Deployment shapes: " + title))
        title = f"The {summary['deployment']} plan"
    if summary.get("driver") is not None:
        _driver_layers(out, summary, title)
    else:
        _workflow_layers(out, summary, title)
    bill = summary["bill_usd"]
    if summary.get("driver") is not None:
        driver = summary["driver"]
        what = (
            f"One {driver['memory_mb']:,} MB function holds every expert"
            if topology(summary["deployment"]).expert_functions == "none"
            else f"A {driver['memory_mb']:,} MB driver runs {driver['local_experts']} experts "
            f"itself and invokes {summary['functions']} expert functions"
        )
        shape = (
            f"{what} ({driver['weights_mb']:,.0f} MB of weights, {driver['activations_mb']:,.0f}"
            " MB of activations). "
        )
    else:
        shape = _packing_line(summary)
    out.print(
        f"Latency {summary['latency_s']:.3f} s (smallest feasible "
        f"{summary['smallest_slo_s']:.3f} s). "
        f"Expert functions ${summary['moe_cost_usd']:.6f} per batch; full bill "
        f"${bill['total_usd']:.6f} (non-MoE ${bill['nonmoe_usd']:.6f}, requests "
        f"${bill['requests_usd']:.6f}, S3 ${bill['s3_usd']:.6f}, {summary['workflow']} "
        f"workflow ${bill['workflow_usd']:.6f}). Solver {summary['solver']} in "
        f"{summary['seconds']:.3f} s. "
        + shape
        + _confidence_line(summary["confidence"])
        + f"Wrote {summary['plan']}"
        + (f", {', '.join(summary['pareto'])}" if "pareto" in summary else "")
    )
    weights_note(out, summary)
    if summary["quality"]:
        from moe import Quality

        quality = Quality(**summary["quality"])
        out.print(
            f"The served model against the dense one (held-out text): {quality.headline()}. "
            f"{quality.where()}"
        )


def weights_words(summary: dict[str, Any]) -> str:
    """ " (int8 weights)": the precision a plan's summary names, for its title."""
    label = summary.get("weights")
    return "" if label is None else f" ({label} weights)"


def weights_note(out: Console, summary: dict[str, Any]) -> None:
    """Why CPU Lambda would not run the plan's weights, when it would not."""
    note = summary.get("weights_note")
    if note:
        out.print(f"[yellow]note:[/] {note}.", highlight=False)


def candidates(summary: dict[str, Any], *, title: str) -> Table:
    """The deployment shapes `plan` weighed: bill, latency, functions, the weights of the
    function holding the most, and why each was or was not chosen."""
    grid = Table(title=title)
    columns = ("shape", "bill per batch", "latency", "smallest SLO", "functions", "local")
    for column in (*columns, "weights"):
        left = column == "shape"
        grid.add_column(column, justify="left" if left else "right", no_wrap=left)
    grid.add_column("why (not)", justify="left")
    for c in summary["candidates"]:
        chosen = c["deployment"] == summary["deployment"]
        name = f"[bold]{c['deployment']}[/bold] (chosen)" if chosen else c["deployment"]
        weights_mb = c.get("weights_mb")
        grid.add_row(
            name,
            "-" if c["bill_usd"] is None else f"${c['bill_usd']:.6f}",
            "-" if c["latency_s"] is None else f"{c['latency_s']:.2f} s",
            "-" if c["smallest_slo_s"] is None else f"{c['smallest_slo_s']:.2f} s",
            "-" if c["functions"] is None else str(c["functions"]),
            "-" if c["local_experts"] is None else str(c["local_experts"]),
            "-" if weights_mb is None else f"{weights_mb:,.0f} MB",
            c.get("verdict") or c["reason"] or "",
        )
    return grid


def _generation_plan(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda plan --slo-ttft/--slo-tpot`: each shape's TTFT, TPOT and bills per million
    tokens, the chosen plan's layers, its generation and bill."""
    g = summary["generation"]
    slos = ", ".join(
        f"{name} SLO {value:.3f} s"
        for name, value in (("TTFT", g["slo_ttft_s"]), ("TPOT", g["slo_tpot_s"]))
        if value is not None
    )
    title = (
        f"Generation plan for {summary['model']}{weights_words(summary)}: "
        f"{g['batch_sequences']} sequence(s) of "
        f"{g['prompt_tokens']:,} prompt tokens, {g['new_tokens']:,} new tokens each"
        + (f", {slos}" if slos else " (no SLO: the cheapest)")
    )
    grid = Table(title=title)
    columns = ("shape", "TTFT", "TPOT", "fastest TPOT", "$/M input", "$/M output", "local")
    for column in columns:
        left = column == "shape"
        grid.add_column(column, justify="left" if left else "right", no_wrap=left)
    refused = []
    for c in summary["candidates"]:
        chosen = c["deployment"] == summary["deployment"]
        name = f"[bold]{c['deployment']}[/bold] (chosen)" if chosen else c["deployment"]
        if not c["feasible"]:
            grid.add_row(name, *["-"] * (len(columns) - 1))
            refused.append(f"{c['deployment']}: {c['reason']}")
            continue
        grid.add_row(
            name,
            f"{c['ttft_s']:.2f} s",
            f"{c['tpot_s']:.3f} s",
            f"{c['smallest_tpot_s']:.3f} s",
            f"${c['bill_per_million_input_usd']:,.2f}",
            f"${c['bill_per_million_output_usd']:,.2f}",
            f"{c['local_per_layer']} per layer",
        )
    out.print(grid)
    for line in refused:  # below the table: a reason is a sentence, not a cell
        out.print(f"Not {line}", highlight=False)
    _driver_layers(out, summary, f"The generating {summary['deployment']} plan")
    out.print(
        f"TTFT {g['ttft_s']:.3f} s, TPOT {g['tpot_s']:.3f} s (the fastest within the TTFT SLO: "
        f"{g['smallest_tpot_s']:.3f} s); one generation runs {g['run_s']:,.1f} s in a "
        f"{g['driver_memory_mb']:,} MB function holding {g['local_per_layer']} experts per layer "
        f"and a {g['kv_cache_mb']:,.0f} MB KV cache, with {g['invokes_per_step']:.1f} remote "
        f"calls per step on average ({summary['workflow']} workflow). Bill "
        f"${g['prefill_usd']:.6f} per prefill, ${g['step_usd']:.6f} per decode step, "
        f"${g['generation_usd']:.6f} per "
        f"generation: ${g['bill_per_million_input_usd']:,.2f} per million input tokens, "
        f"${g['bill_per_million_output_usd']:,.2f} per million output tokens. "
        f"Wrote {summary['plan']}"
    )
    weights_note(out, summary)


def _workflow_layers(out: Console, summary: dict[str, Any], title: str) -> None:
    grid = Table(title=title)
    per = "function" if summary["experts_per_function"] > 1 else "expert"
    for column in ("layer", "method", "beta", f"memory MB per {per}", "replicas"):
        grid.add_column(column, justify="right" if column != "method" else "left")
    for i, layer in enumerate(summary["layers"]):
        beta = str(layer["beta"]) if layer["method"] == "pipelined" else "-"
        grid.add_row(
            str(i),
            layer["method"],
            beta,
            " ".join(str(m) for m in layer["memory_mb"]),
            " ".join(str(r) for r in layer["replicas"]),
        )
    out.print(grid)


def _driver_layers(out: Console, summary: dict[str, Any], title: str) -> None:
    grid = Table(title=title)
    for column in ("layer", "local experts", "remote experts", "memory MB", "replicas"):
        grid.add_column(column, justify="right")
    for i, layer in enumerate(summary["layers"]):
        grid.add_row(
            str(i),
            " ".join(map(str, layer["local"])) or "-",
            " ".join(map(str, layer["remote"])) or "-",
            " ".join(map(str, layer["memory_mb"])) or "-",
            " ".join(map(str, layer["replicas"])) or "-",
        )
    out.print(grid)


def _packing_line(summary: dict[str, Any]) -> str:
    tried = [t for t in summary["packing"] if t["cost_usd"] is not None]
    k = summary["experts_per_function"]
    line = f"{summary['functions']} expert functions ({k} expert{'s' if k > 1 else ''} each"
    if len(summary["packing"]) > 1:
        costs = ", ".join(f"{t['experts_per_function']}: ${t['cost_usd']:.6f}" for t in tried)
        line += f"; cheapest of {costs}"
    return line + "). "


def _confidence_line(confidence: dict[str, Any] | None) -> str:
    if confidence is None:
        return "Sized for the predicted counts (--confidence 0). "
    return (
        f"Sized at each expert's {confidence['quantile_level']:g} quantile: meets the SLO in "
        f"{confidence['attainment_estimate']:.1%} of {confidence['scenarios']} scenarios of "
        f"the predicted counts (asked {confidence['confidence']:g}); expected bill "
        f"${confidence['expected_cost_usd']:.6f}. "
    )


# Benchmarks of the serverless path


def bench_profiler(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench profiler`: throughput against its target."""
    runs = ", ".join(f"{r:,.0f}" for r in summary["tokens_per_s_runs"])
    out.print(
        facts(
            f"bench profiler: {summary['model']} E={summary['experts']} k={summary['top_k']}, "
            f"{summary['tokens']:,} tokens per pass",
            (
                ("tokens/s (median)", f"{summary['tokens_per_s']:,.0f}"),
                ("tokens/s (each pass)", runs),
                ("target tokens/s", f">= {summary['target_tokens_per_s']:,}"),
                ("meets the target", yes_no(summary["meets_target"])),
                ("model load s", f"{summary['load_s']:.2f}"),
                ("torch threads", str(summary["torch_threads"])),
            ),
        )
    )


def bench_predictor(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench predictor`: table building and prediction times against targets."""
    paper = summary["paper_s"]
    rows = [
        (
            "build tables",
            f"{summary['profile_tokens']:,}",
            f"{summary['build_tables_s']:.4f}",
            f"{summary['build_target_s']:g}",
            f"{paper['build']:g}",
        )
    ]
    for name, times in summary["methods"].items():
        rows.append(
            (
                f"{name}: fit",
                "-",
                f"{times['fit_s']:.4f}",
                "-",
                "-",
            )
        )
        rows.append(
            (
                f"{name}: predict",
                f"{summary['predict_tokens']:,}",
                f"{times['predict_s']:.4f}",
                f"{summary['predict_target_s']:g}",
                f"{paper['predict']:g}",
            )
        )
    out.print(
        table(
            f"bench predictor: {summary['model']} E={summary['experts']} k={summary['top_k']}, "
            f"{summary['layers']} layers, {summary['table_entries']:,} table entries",
            ("step", "tokens", "seconds", "target s", "paper s"),
            rows,
        )
    )
    out.print(f"Meets the targets: {yes_no(summary['meets_targets'])}.", highlight=False)


def bench_planner(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench planner`: every solver at a loose, a medium and a tight SLO."""
    names = list(dict.fromkeys(n for entry in summary["slos"] for n in entry["solvers"]))
    rows = []
    for entry in summary["slos"]:
        for name in [*names, "packed"]:
            row = entry["packed"] if name == "packed" else entry["solvers"].get(name)
            if row is None:
                continue
            feasible = row.get("feasible", row.get("cost_usd") is not None)
            optimal = row.get("optimal")
            rows.append(
                (
                    f"{entry['label']} ({entry['slo_s']:.3f} s)",
                    name,
                    f"{row['seconds']:.4f}",
                    f"{row['cost_usd'] * 1e6:.3f}" if feasible else "infeasible",
                    "-" if optimal is None else yes_no(optimal),
                )
            )
    instance = summary["instance"]
    described = (
        f"{instance.get('shape', 'paper-scale instance')}, {instance['layers']} layers x "
        f"{instance['experts']} experts, {instance['tokens']:,} tokens per batch"
    )
    out.print(
        table(
            f"bench planner: {described}",
            ("SLO", "solver", "seconds", "cost µ$", "proved optimal"),
            rows,
        )
    )
    lines = [
        f"Exact solver {summary['exact_total_s']:.3f} s for the three SLOs "
        f"(target <= {summary['exact_target_s']:g} s); frontier of "
        f"{summary['frontier_points']:,} points; packed {summary['packed_total_s']:.3f} s, "
        f"never costlier: {yes_no(summary['packed_never_worse'])}."
    ]
    if "ods_total_s" in summary:
        lines.append(
            f"ODS {summary['ods_total_s']:.3f} s (paper {summary['paper_ods_s']:g} s): the exact "
            f"solver is {summary['exact_speedup_vs_ods']:g}x faster (target >= "
            f"{summary['speedup_target']:g}x)."
        )
    out.print(" ".join(lines), highlight=False)


def bench_shapes(out: Console, report: dict[str, Any]) -> None:
    """`moelambda bench shapes`: per model every shape's batch and stream numbers."""
    stream = report["stream"]
    grid = Table(
        title=f"Deployment shapes: one {report['tokens']:,}-token batch (cheapest plan) and a "
        f"day at {stream['rate_per_s'] * 60:g} request a minute ({stream['trace']})"
    )
    for column in ("model", "shape", "batch USD", "USD/M tokens", "latency", "smallest SLO"):
        grid.add_column(column, justify="left" if column in ("model", "shape") else "right")
    for column in ("stream USD/M", "stream p99", "cold starts"):
        grid.add_column(column, justify="right")
    grid.add_column("why not", justify="left")
    for row in report["models"]:
        for i, s in enumerate(row["shapes"]):
            won = s["deployment"] == row["batch_winner"]
            day = s["stream"]
            grid.add_row(
                f"{row['label']} ({row['params'] / 1e9:.3g} B)" if i == 0 else "",
                f"[bold]{s['deployment']}[/bold]" if won else s["deployment"],
                "-" if s["bill_usd"] is None else f"{s['bill_usd']:.6f}",
                "-"
                if s["per_million_tokens_usd"] is None
                else f"{s['per_million_tokens_usd']:.3f}",
                "-" if s["latency_s"] is None else f"{s['latency_s']:.1f} s",
                "-" if s["smallest_slo_s"] is None else f"{s['smallest_slo_s']:.1f} s",
                "-" if day is None else f"{day['per_million_tokens_usd']:.3f}",
                "-" if day is None or day["p99_s"] is None else f"{day['p99_s']:.1f} s",
                "-" if day is None else str(day["cold_starts"]),
                s["reason"] or "",
            )
    out.print(grid)
    wins = "; ".join(
        f"{row['label']}: {row['batch_winner']} (stream: {row['stream_winner']})"
        for row in report["models"]
    )
    out.print(
        f"Cheapest shape per model: {wins}."
        + (f" Wrote {report['plot']}." if "plot" in report else "")
    )
