"""Readable summaries of the GPU-cluster commands: `cluster simulate`, `cluster compare`,
`bench cluster` and `bench lyra` (see `moelambda.cli._render`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from moelambda.cli._render import facts, optional, table, yes_no


def cluster_simulate(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda cluster simulate`: the replay's metrics."""
    hours = lambda s: optional(None if s is None else s / 3600, ".1f", " h")  # noqa: E731
    pairs = [
        ("jobs", f"{summary['jobs']:,}"),
        ("deadline-satisfactory ratio", optional(summary["deadline_ratio"], ".3f")),
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
                    optional(row["deadline_ratio"], ".3f"),
                    optional(None if row["avg_jct_s"] is None else row["avg_jct_s"] / 3600, ".1f"),
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
                optional(row["artifact_met"], "d"),
                yes_no(row["matches_artifact"]),
                events,
                f"{row['wall_s']:.1f}",
                optional(row.get("cpu_s"), ".1f"),
                optional(row["target_s"], "g"),
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
                        optional(row["avg_jct_s"], ",.0f"),
                        f"{row['wall_s']:.1f}",
                        optional(row["target_s"], "g"),
                        yes_no(row["within_target"]),
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
                    optional(row["baseline_jct_s"], ",.0f"),
                    optional(row["lyra_jct_s"], ",.0f"),
                    f"{row['lead']:.2f}x",
                    f"{row['baseline_queue_s']:,.0f} / {row['lyra_queue_s']:,.0f}",
                )
                for row in summary["rows"]
            ),
        )
    )
