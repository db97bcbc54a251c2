"""Readable summaries of the GPU-backend commands: `gpu-plan`, `run-gpu`, `compare` (of a
batch, or of a decoder's generation), `bench gpu` and `bench generate` (see
`moelambda.cli._render`)."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from moelambda.cli._render import facts, ms, optional, table, yes_no


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
                ms(layer["a2a_s"]),
                ms(layer["lower_bound_s"]),
                ms(layer["layer_s"]),
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
                        ms(row["cycle_s"]),
                        ms(row["same_index_cycle_s"]),
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
        ("max |diff| vs monolithic", optional(result["max_abs_diff_vs_monolithic"], ".3g")),
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
    others = [
        (
            f"Lambda {c['deployment']}"
            + (" (cheapest plan)" if c["deployment"] == lam["deployment"] else ""),
            "-"
            if c["cost_per_million_tokens_usd"] is None
            else f"{c['cost_per_million_tokens_usd']:.4f}",
            "-" if c["latency_s"] is None else f"{c['latency_s']:.3f}",
            "-" if c["feasible"] else f"infeasible: {c['reason']}",
        )
        for c in summary.get("serverless_candidates") or []
    ]
    chosen = (
        f"Lambda {lam.get('deployment', '')} (cheapest plan)",
        f"{lam['cost_per_million_tokens_usd']:.4f}",
        f"{lam['latency_s']:.3f}",
        "-",
    )
    out.print(
        table(
            f"Serverless or GPU at {summary['rps']:g} requests/s of "
            f"{summary['tokens_per_request']:,} tokens (SLO {summary['slo_s']:g} s)",
            ("backend", "USD per million tokens", "latency s", "GPUs"),
            (
                *(others or [chosen]),
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


def compare_generation(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda compare --slo-ttft/--slo-tpot`: Lambda, GPUs and a managed API per token."""
    rows = [
        (
            r["backend"],
            r["deployment"],
            optional(r["ttft_s"], ".3f"),
            optional(r["tpot_s"], ".4f"),
            optional(r["per_million_input_usd"], ".4f"),
            optional(r["per_million_output_usd"], ".4f")
            if r["per_million_output_usd"] is not None
            else "no list price",
        )
        for r in summary["rows"]
    ]
    out.print(
        table(
            f"{summary['model']} generating {summary['new_tokens']} tokens for "
            f"{summary['prompt_tokens']:,}-token prompts, {summary['rps']:g} requests/s",
            ("backend", "deployment", "TTFT s", "TPOT s", "USD / M input", "USD / M output"),
            rows,
            left=2,
        )
    )
    for r in summary["rows"]:
        out.print(f"{r['backend']}: {r['source']}", highlight=False)


def _generate_rows(model: dict[str, Any], run: dict[str, Any]) -> list[tuple[str, ...]]:
    """One line per platform of one model at one rate: deployment, TTFT/TPOT p99, USD per
    million output tokens, and whether the numbers are predicted or a list price."""
    rate, label = f"{run['rate_per_s']:.4g}", model["label"]

    def line(platform: str, deployment: str, block: dict[str, Any], basis: str) -> tuple[str, ...]:
        return (
            label,
            rate,
            platform,
            deployment,
            optional(block.get("ttft_p99_s"), ".2f"),
            optional(block.get("tpot_p99_s"), ".4f"),
            optional(block.get("per_million_output_usd"), ".3f"),
            basis,
        )

    lam, planned = run["lambda"], run["planned_for"]
    if lam.get("status") == "infeasible" or planned is None:
        lines = [line("Lambda, a driver per request", "infeasible", {}, "-")]
    else:
        deployment = f"{planned['driver_memory_mb']:,} MB; refused {lam['refused_fraction']:.1%}"
        lines = [line("Lambda, a driver per request", deployment, lam, "simulated")]
    for name, platform in (
        ("worker_cpu", "Lambda workers, CPU"),
        ("worker_gpu", "Lambda workers, GPU"),
    ):
        block = run.get(name, {})
        if block.get("status") == "planned":
            deployment = f"{block['workers']} x {block['slots']} slots, {block['memory_mb']:,} MB"
            lines.append(line(platform, deployment, block, "simulated"))
        else:
            lines.append(line(platform, block.get("status", "-"), {}, "-"))
    gpu = run["gpu"]
    deployment = f"{gpu['copies']} x {gpu['gpus']} {gpu['gpu_type']}, always on"
    lines.append(line("GPU instances (EC2)", deployment, gpu, "model"))
    for row in run.get("gpu_serverless", []):
        platform = f"{row['platform']} {row['gpu'].upper()}"
        if not row["fits"]:
            lines.append(line(platform, "does not fit", {}, "-"))
            continue
        deployment = f"{row['containers']} containers of {row['gpus']} GPU, {row['slots']} slots"
        lines.append(line(platform, deployment, row, "simulated"))
    managed = model["managed_api"]
    if managed["list_price"]:
        lines.append(line("managed API", managed["model_id"], managed, "list price"))
    return lines


def bench_generate(out: Console, report: dict[str, Any]) -> None:
    """`moelambda bench generate`: per model and rate, each platform's TTFT and TPOT p99 and
    dollars per million output tokens, and whether each is simulated or a list price."""
    rows = [
        line
        for model in report["models"]
        for run in model["runs"]
        for line in _generate_rows(model, run)
    ]
    out.print(
        table(
            f"Generation on the Azure conversation trace (SLOs: TTFT {report['slo_ttft_s']} s, "
            f"TPOT {report['slo_tpot_s']} s); no number here is measured",
            (
                "model",
                "req/s",
                "platform",
                "deployment",
                "TTFT p99 s",
                "TPOT p99 s",
                "USD / M out",
                "basis",
            ),
            rows,
            left=4,
        )
    )
    unfit = [
        f"{model['label']} on {row['platform']} {row['gpu'].upper()}: {row['reason']}"
        for model in report["models"]
        for row in model["runs"][0].get("gpu_serverless", [])
        if not row["fits"]
    ]
    for reason in unfit:
        out.print(reason, highlight=False)
    out.print(f"{report['seconds']:.0f} s.", highlight=False)


def bench_gpu(out: Console, summary: dict[str, Any]) -> None:
    """`moelambda bench gpu`: Aurora's checks and the all-to-all orders."""
    ratio = summary["coloc_heuristic_over_opt"]
    out.print(
        facts(
            "bench gpu: Aurora's checks",
            (
                (
                    f"BvN makespan = Theorem 4.2's bound ({summary['bvn_samples']} matrices)",
                    yes_no(summary["bvn_makespan_equals_bound"]),
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
            ((name, ms(s), f"{s / aurora:.2f}x") for name, s in orders.items()),
        )
    )


def bench_gpu_lambda(out: Console, report: dict[str, Any]) -> None:
    """`moelambda bench gpu-lambda`: per model and rate, each hardware's cheapest plan, the
    cheapest that can run and the cheapest as priced."""
    from planner.hardware.gpu_candidates import HARDWARE, MIXED

    rows = []
    for model in report["models"]:
        api = model["managed_api"]["per_million_input_usd"]
        for run in model["runs"]:
            cells = []
            for hardware in HARDWARE:
                plan = run["plans"][hardware]
                if plan["feasible"]:
                    cells.append(f"{plan['per_million_tokens_usd']:.3f}")
                else:
                    cells.append(f"infeasible ({plan['latency_s']:.0f} s warm)")
            gpu = run["plans"]["gpu"] if run["plans"]["gpu"]["feasible"] else run["plans"][MIXED]
            pool = f"{gpu['instances']} x {gpu['instance_type']}" if gpu.get("instances") else "-"
            rows.append(
                (
                    model["label"],
                    f"{run['rate_per_s']:.4g}",
                    *cells,
                    pool,
                    run["cheapest"] or "none",
                    run["cheapest_priced"] or "none",
                    "no list price" if api is None else f"{api:.2f}",
                )
            )
    out.print(
        table(
            f"USD per million prompt tokens, p99 SLO {report['slo_p99_s']:g} s for "
            f"{report['prompt_tokens']:,}-token prompts (Azure conversation trace)",
            ("model", "req/s", "CPU", "GPU", MIXED, "GPU pool", "cheapest that runs")
            + ("cheapest as priced", "managed API"),
            rows,
        )
    )
    out.print(f"{report['predicted']}. {report['seconds']:.0f} s.", highlight=False)
