"""Readable summaries of the commands' JSON results: rich tables and a few lines each.

Every function takes the console to print on and the summary the command prints with `--json`,
so what a person reads and what a script parses come from the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text


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


def _opt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _yes(flag: bool | None) -> str:
    return {None: "-", True: "yes", False: "NO"}[flag]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


# GPU backend


def gpu_plan(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda gpu-plan`: one row per MoE layer, then the totals and the extras."""
    types = summary["gpu_types"]
    kinds = ", ".join(f"{types.count(t)} x {t}" for t in dict.fromkeys(types))
    rows = []
    for i, layer in enumerate(summary["layers"]):
        hosted = " | ".join(
            ",".join(str(e) if share == 1 else f"{e}:{share:.2f}" for e, share in gpu)
            for gpu in layer["placement"]
        )
        rows.append(
            (
                str(i),
                hosted,
                str(layer["a2a_rounds"]),
                _ms(layer["a2a_s"]),
                _ms(layer["lower_bound_s"]),
                _ms(layer["layer_s"]),
            )
        )
    out.print(
        table(
            f"GPU plan ({summary['scheduler']}) of {summary['tokens']:,} tokens on {kinds}",
            ("layer", "experts per GPU", "a2a rounds", "a2a ms", "bound ms", "layer ms"),
            rows,
            left=2,
        )
    )
    out.print(
        f"Batch time {summary['total_s']:.4f} s; ${summary['cost_per_million_tokens_usd']:.4f} "
        f"per million tokens. Wrote {summary['plan']}.",
        highlight=False,
    )
    if "lina" in summary:
        lina = summary["lina"]
        persistence = lina["path_persistence"]
        out.print(
            table(
                f"Lina on {lina['batches']} held-out batches of {lina['batch_tokens']:,} tokens "
                f"(thesis re-schedule rate {lina['thesis_reschedule_rate']:.0%})",
                ("estimator", "re-schedule rate", "busiest GPU / mean"),
                (
                    (
                        name,
                        f"{rate:.1%}",
                        ", ".join(
                            f"{k} {v:.2f}" for k, v in lina["busiest_gpu_over_mean"][name].items()
                        ),
                    )
                    for name, rate in lina["reschedule_rate"].items()
                ),
            )
        )
        out.print(
            f"Path persistence k=1 {persistence['k1']:.3f}, k=2 {persistence['k2']:.3f} "
            f"(thesis {persistence['thesis']['k1']}, {persistence['thesis']['k2']}).",
            highlight=False,
        )
    if "colocate" in summary:
        colocated = summary["colocate"]
        out.print(
            table(
                f"Colocation with {colocated['model_b']}: one expert of each model per GPU",
                ("layer", "pairing", "GPU of pair", "cycle ms", "same-index ms"),
                (
                    (
                        str(row["layer"]),
                        " ".join(map(str, row["pairing"])),
                        " ".join(map(str, row["gpu_of_pair"])),
                        _ms(row["cycle_s"]),
                        _ms(row["same_index_cycle_s"]),
                    )
                    for row in colocated["layers"]
                ),
            )
        )


def run_gpu(out: Console, result: dict[str, Any]) -> None:
    """`moelambda run-gpu`: the status, the check against the monolithic model, the times."""
    pairs = [
        ("status", result["status"]),
        ("backend", str(result["backend"])),
        ("ranks", str(result["gpus"])),
        ("tokens", f"{result['tokens']:,}"),
        ("max |diff| vs monolithic", _opt(result["max_abs_diff_vs_monolithic"], ".3g")),
    ]
    for path, seconds in (result.get("a2a_seconds") or {}).items():
        pairs.append((f"all-to-all s ({path})", f"{seconds:.4f}"))
    if result["layer_seconds"]:
        layers = " ".join(f"{s:.4f}" for s in result["layer_seconds"])
        pairs.append(("layer s (slowest rank)", layers))
    out.print(facts("run-gpu: the plan run on torch.distributed", pairs))
    if result.get("error"):
        out.print(f"[red]error:[/red] {result['error']}", highlight=False)


def compare(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda compare`: Lambda against the cheapest GPU deployment, and the break-even."""
    lam, gpu = summary["serverless"], summary["gpu"]
    deployment = f"{gpu['copies']} x {gpu['gpus']} {gpu['gpu_type']}"
    out.print(
        table(
            f"Serverless or GPU at {summary['rps']:g} requests/s of "
            f"{summary['tokens_per_request']:,} tokens (SLO {summary['slo_s']:g} s)",
            ("backend", "USD per million tokens", "latency s", "GPUs"),
            (
                (
                    "Lambda (cheapest plan)",
                    f"{lam['cost_per_million_tokens_usd']:.4f}",
                    f"{lam['latency_s']:.3f}",
                    "-",
                ),
                (
                    "GPU (cheapest at this rate)",
                    f"{gpu['cost_per_million_tokens_usd']:.4f}",
                    f"{gpu['latency_s']:.3f}",
                    deployment,
                ),
            ),
        )
    )
    cheaper = (
        "Lambda"
        if lam["cost_per_million_tokens_usd"] <= gpu["cost_per_million_tokens_usd"]
        else "the GPUs"
    )
    rate, where = summary["breakeven_rps"], summary["breakeven_deployment"]
    crossing = (
        "the GPUs never cost less than Lambda at any rate"
        if rate is None
        else f"the GPUs break even at {rate:.3g} requests/s ({where['gpus']} {where['gpu_type']})"
    )
    plot = f" Wrote {summary['plot']}." if "plot" in summary else ""
    out.print(f"At this rate {cheaper} cost less; {crossing}.{plot}", highlight=False)


def bench_gpu(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench gpu`: Aurora's checks and the all-to-all orders."""
    ratio = summary["coloc_heuristic_over_opt"]
    out.print(
        facts(
            "bench gpu: Aurora's checks",
            (
                (
                    f"BvN makespan = Theorem 4.2's bound ({summary['bvn_samples']} matrices)",
                    _yes(summary["bvn_makespan_equals_bound"]),
                ),
                (
                    "colocation heuristic / optimum",
                    f"mean {ratio['mean']:.4f}, max {ratio['max']:.4f}",
                ),
            ),
        )
    )
    orders = summary["orders"]
    aurora = orders["aurora"]
    out.print(
        table(
            f"One all-to-all on {summary['orders_traffic']}",
            ("order", "ms", "/ Aurora"),
            ((name, _ms(s), f"{s / aurora:.2f}x") for name, s in orders.items()),
        )
    )


# GPU-cluster schedulers


def cluster_simulate(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda cluster simulate`: the replay's metrics."""
    hours = lambda s: _opt(None if s is None else s / 3600, ".1f", " h")  # noqa: E731
    pairs = [
        ("jobs", f"{summary['jobs']:,}"),
        ("deadline-satisfactory ratio", _opt(summary["deadline_ratio"], ".3f")),
        ("average JCT", hours(summary["avg_jct_s"])),
        ("p95 JCT", hours(summary["p95_jct_s"])),
        ("makespan", hours(summary["makespan_s"])),
        ("preemptions", f"{summary['preemptions']:,}"),
        ("GPU utilisation", f"{summary['gpu_utilisation']:.1%}"),
        ("simulator wall time", f"{summary['wall_s']:.2f} s"),
    ]
    known = {"scheduler", "jobs", "deadline_ratio", "avg_jct_s", "p95_jct_s", "makespan_s"}
    known |= {"preemptions", "gpu_utilisation", "wall_s"}
    pairs += [(k, str(v)) for k, v in summary.items() if k not in known]
    out.print(facts(f"cluster simulate: {summary['scheduler']}", pairs))


def cluster_compare(out: Console, title: str, rows: list[dict[str, Any]]) -> None:
    """`moelambda cluster compare`: one row per scheduler."""
    columns = ("scheduler", "deadline ratio", "avg JCT h", "makespan h", "preemptions")
    out.print(
        table(
            title,
            (*columns, "GPU util.", "wall s"),
            (
                (
                    str(row["scheduler"]),
                    _opt(row["deadline_ratio"], ".3f"),
                    _opt(None if row["avg_jct_s"] is None else row["avg_jct_s"] / 3600, ".1f"),
                    f"{row['makespan_s'] / 3600:.1f}",
                    str(row["preemptions"]),
                    f"{row['gpu_utilisation']:.2f}",
                    f"{row['wall_s']:.2f}",
                )
                for row in rows
            ),
        )
    )


def bench_cluster(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench cluster`: ours beside the artifact's runs, then the other families."""
    rows = []
    for row in summary["runs"]:
        events = f"{row['events']}"
        if row["events_match"] is not None:
            prefix = "" if row["artifact_events_complete"] else "first "
            same = "equal" if row["events_match"] else "DIFFER"
            events += f" ({prefix}{row['artifact_events']} {same})"
        rows.append(
            (
                row["scheduler"],
                row["trace"],
                f"{row['met']} / {row['jobs']} ({row['deadline_ratio']:.5f})",
                _opt(row["artifact_met"], "d"),
                _yes(row["matches_artifact"]),
                events,
                f"{row['wall_s']:.1f}",
                _opt(row.get("cpu_s"), ".1f"),
                _opt(row["target_s"], "g"),
            )
        )
    if rows:
        columns = ("scheduler", "trace", "met / jobs", "artifact", "match", "events", "wall s")
        title = "bench cluster: ours beside the artifact's own runs"
        out.print(table(title, (*columns, "cpu s", "target s"), rows, left=2))
    others = summary["others"]
    if others:
        out.print(
            table(
                "bench cluster: the other families",
                ("scheduler", "trace", "avg JCT s", "wall s", "target s", "within"),
                (
                    (
                        name,
                        row["trace"],
                        _opt(row["avg_jct_s"], ",.0f"),
                        f"{row['wall_s']:.1f}",
                        _opt(row["target_s"], "g"),
                        _yes(row["within_target"]),
                    )
                    for name, row in others.items()
                ),
                left=2,
            )
        )


def bench_lyra(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench lyra`: the lead under each assumption."""
    thesis = summary["thesis"]
    out.print(
        table(
            f"Lyra vs baseline, mean JCT (thesis: {thesis['baseline_jct_s']:,} vs "
            f"{thesis['lyra_jct_s']:,} s, 1.48x)",
            ("assumptions", "baseline JCT s", "Lyra JCT s", "lead", "queue s base/Lyra"),
            (
                (
                    row["assumptions"],
                    _opt(row["baseline_jct_s"], ",.0f"),
                    _opt(row["lyra_jct_s"], ",.0f"),
                    f"{row['lead']:.2f}x",
                    f"{row['baseline_queue_s']:,.0f} / {row['lyra_queue_s']:,.0f}",
                )
                for row in summary["rows"]
            ),
        )
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
                ("meets the target", _yes(summary["meets_target"])),
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
    out.print(f"Meets the targets: {_yes(summary['meets_targets'])}.", highlight=False)


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
                    "-" if optimal is None else _yes(optimal),
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
        f"never costlier: {_yes(summary['packed_never_worse'])}."
    ]
    if "ods_total_s" in summary:
        lines.append(
            f"ODS {summary['ods_total_s']:.3f} s (paper {summary['paper_ods_s']:g} s): the exact "
            f"solver is {summary['exact_speedup_vs_ods']:g}x faster (target >= "
            f"{summary['speedup_target']:g}x)."
        )
    out.print(" ".join(lines), highlight=False)
