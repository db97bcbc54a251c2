"""`moelambda bo`: tune the predictor's count table against the billed cost (Alg. 2), compare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    TracesOpt,
    app,
    check_file_out,
    manifest_of_trace,
    progress,
    renamed,
    stdout,
    user_errors,
)

_ALL_STRATEGIES = "multi-eps,single-eps,random,tpe,none"


def _print(report: dict[str, Any]) -> None:
    out = stdout()
    setup = report["setup"]
    table = Table(
        title=f"BO of {setup['predictor']}: {setup['test_batches']} held-out batches of "
        f"{setup['tokens']:,} tokens, SLO {report['slo_s']:.2f} s"
    )
    for column in (
        "method",
        "cost µ$",
        "÷ oracle",
        "saving vs LambdaML: full bill",
        "experts only (the paper's bill)",
        "MAD",
        "iterations",
        "s/iter",
        "converged at",
        "tokens/s",
    ):
        table.add_column(column, justify="left" if column == "method" else "right")
    tput = report["throughput_tokens_per_s"]
    for name, m in report["methods"].items():
        table.add_row(
            name,
            f"{m['final_cost_usd'] * 1e6:.2f}",
            f"{m['cost_vs_oracle']:.4f}",
            f"{m['saving_vs_lambdaml']['full_bill']:.1%}",
            f"{m['saving_vs_lambdaml']['experts']:.1%}",
            f"{m['prediction_mad']:.1f}",
            str(m["iterations"]),
            f"{m['seconds_per_iteration']:.3f}",
            "-" if m["converged_at"] is None else f"{m['converged_at']} ({m['converged_s']} s)",
            f"{tput[name]:,.0f}",
        )
    out.print(table)
    out.print(
        f"Oracle ${report['oracle_cost_usd'] * 1e6:.2f} µ ({tput['oracle']:,.0f} tokens/s), "
        f"LambdaML ${report['lambdaml_cost_usd'] * 1e6:.2f} µ, of which its expert functions "
        f"${report['lambdaml_experts_cost_usd'] * 1e6:.2f} µ ({tput['lambdaml']:,.0f} "
        "tokens/s) per batch, averaged over the held-out batches."
    )
    out.print(
        "Saving vs LambdaML: 'full bill' counts every function, request, S3 access and the "
        "workflow; 'experts only' counts the expert functions' GB-seconds alone, the bill the "
        "paper's -43.41 % is measured on: compare that column with the paper, not the full bill."
    )


def _print_seeds(report: dict[str, Any]) -> None:
    out = stdout()
    first = report["per_seed"][0]
    setup = first["setup"]
    table = Table(
        title=f"BO of {setup['predictor']} over seeds {report['seeds']}: mean ± std "
        f"({setup['test_batches']} held-out batches of {setup['tokens']:,} tokens each)"
    )
    for column in ("method", "learning cut", "held-out ÷ oracle", "SLO attained", "converged at"):
        table.add_column(column, justify="left" if column == "method" else "right")

    def cell(stats: dict[str, Any], metric: str, percent: bool) -> str:
        if metric not in stats:
            return "-"
        m, sd = stats[metric]["mean"], stats[metric]["std"]
        return f"{m:.1%} ± {sd:.1%}" if percent else f"{m:.4f} ± {sd:.4f}"

    for name, stats in report["statistics"].items():
        table.add_row(
            name,
            cell(stats, "learn_improvement", True),
            cell(stats, "cost_vs_oracle", False),
            cell(stats, "slo_attainment", True),
            "-"
            if "converged_at" not in stats
            else f"{stats['converged_at']['mean']:.0f} ± {stats['converged_at']['std']:.0f}",
        )
    out.print(table)
    for claim in report["claims"]:
        out.print(
            f"{claim['verdict']:>9}: {claim['claim']} (mean difference "
            f"{claim['mean_difference']:+.4f} ± {claim['standard_error']:.4f} s.e.)"
        )


@app.command()
@user_errors
def bo(
    traces: TracesOpt = Path("out/profile"),
    slo: Annotated[
        float | None,
        typer.Option(
            help="Latency SLO of one batch, seconds (default: 1.1 x the fastest plan's latency "
            "on the learning batches' real counts)."
        ),
    ] = None,
    iterations: Annotated[int, typer.Option(help="Most BO iterations per method.")] = 100,
    tokens: Annotated[int, typer.Option(help="Tokens per batch.")] = 10240,
    learn_batches: Annotated[int, typer.Option(help="Batches to learn on.")] = 1,
    test_batches: Annotated[int, typer.Option(help="Held-out batches to test on.")] = 20,
    predictor: Annotated[
        str, typer.Option(help="Predictor to tune: bayes-pos-soft, bayes-token-soft, lina-token.")
    ] = "bayes-pos-soft",
    strategies: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated search strategies: multi-eps, single-eps, random, tpe, none "
            "[default: all five]."
        ),
    ] = None,
    methods: Annotated[str | None, typer.Option("--methods", hidden=True)] = None,
    q: Annotated[int, typer.Option("--q", help="Key-value pairs per trial (Q).")] = 1000,
    epsilon0: Annotated[float, typer.Option(help="Initial ε.")] = 0.2,
    rho: Annotated[float, typer.Option(help="Decay ρ of ε.")] = 0.05,
    rho1: Annotated[float, typer.Option(help="Slow-down ρ1 after a memory shortfall.")] = 0.04,
    rho2: Annotated[float, typer.Option(help="Slow-down ρ2 after a payload overflow.")] = 0.03,
    rho3: Annotated[float, typer.Option(help="Slow-down ρ3 after a misprediction.")] = 0.02,
    mu: Annotated[float, typer.Option(help="Share μ of pairs searched within L.")] = 0.5,
    value_max: Annotated[int, typer.Option(help="Largest count written to a key.")] = 16,
    alpha: Annotated[
        float, typer.Option(help="Tokens per replica a prediction may be off (α).")
    ] = 64.0,
    patience: Annotated[int, typer.Option(help="Stopping rule: iterations λ.")] = 20,
    tolerance: Annotated[
        float, typer.Option(help="Stopping rule: relative improvement ζ.")
    ] = 1e-3,
    surrogate: Annotated[str, typer.Option(help="gp or none.")] = "gp",
    candidates: Annotated[int, typer.Option(help="Candidates the GP chooses from.")] = 8,
    calibration: Annotated[
        Path | None, typer.Option(help="Calibration JSON (default: the packaged one).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the split and every sampler.")] = 0,
    seeds: Annotated[
        int,
        typer.Option(
            help="Repeat the comparison with seeds --seed, --seed+1, ...: mean and spread per "
            "method, and a verdict on each of the paper's claims."
        ),
    ] = 1,
    plot: Annotated[Path | None, typer.Option(help="PNG of every method's convergence.")] = None,
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Tune the expert-selection predictor by Bayesian optimisation against the billed cost.

    Learns on --learn-batches batches of --tokens tokens (Alg. 2: multi-dimensional ε-greedy
    search over Q key-value pairs of the count table, on optuna), compares it with no BO, random
    adjustment, single ε and TPE, and tests every result on --test-batches held-out batches
    against the oracle (plans from the real counts) and LambdaML (3,008 MB, no replicas).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn

    from planner import load_calibration
    from planner.bo import BoSettings, EpsilonGreedy, check_bo, compare_strategies
    from predictor import RoutingTrace

    check_bo(
        iterations=iterations,
        seeds=seeds,
        learn_batches=learn_batches,
        test_batches=test_batches,
        slo_s=slo,
    )
    check_file_out(plot, force, "--plot")
    config = EpsilonGreedy(
        q=q,
        epsilon0=epsilon0,
        rho=rho,
        rho_memory=rho1,
        rho_payload=rho2,
        rho_mispredicted=rho3,
        mu=mu,
        value_max=value_max,
        candidates=candidates,
        surrogate=surrogate,
    )
    strategies = renamed("--methods", "--strategies", methods, strategies) or _ALL_STRATEGIES
    settings = BoSettings(
        tokens=tokens,
        learn_batches=learn_batches,
        test_batches=test_batches,
        iterations=iterations,
        patience=patience,
        tolerance=tolerance,
        alpha=alpha,
        slo_s=slo,
        predictor=predictor,
        seed=seed,
        methods=tuple(m.strip() for m in strategies.split(",") if m.strip()),
        config=config,
    )
    trace = RoutingTrace.load(traces)
    manifest = manifest_of_trace(trace)
    with progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn()) as bar:
        tasks: dict[str, Any] = {}

        def on_trial(method: str, done: int, best: float) -> None:
            if method not in tasks:
                tasks[method] = bar.add_task(method, total=iterations)
            bar.update(
                tasks[method], completed=done, description=f"{method}: best ${best * 1e6:.3f} µ"
            )

        report = compare_strategies(
            trace,
            manifest,
            load_calibration(calibration),
            settings,
            seeds=seeds,
            plot=plot,
            force=force,
            on_trial=on_trial,
            on_seed=lambda _: tasks.clear(),
        )
    if as_json:
        print(json.dumps(report))
    elif seeds > 1:
        _print_seeds(report)
    else:
        _print(report)
