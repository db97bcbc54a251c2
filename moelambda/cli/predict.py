"""Commands on expert-selection prediction: evaluate the predictors, write the planner's counts,
benchmark table building and prediction."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli import _render
from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    TracesOpt,
    app,
    bench_app,
    check_file_out,
    check_out,
    err,
    renamed,
    stdout,
    user_errors,
)

PredictorsOpt = Annotated[
    str | None,
    typer.Option(
        help="Comma-separated predictors to evaluate (default: all; see --list-predictors)."
    ),
]


def _method_list(methods: str | None, with_tables: bool) -> list[str]:
    from predictor import METHODS, make_predictor

    if methods is None:
        names = list(METHODS)
        return [n for n in names if n != "lina-path"] if with_tables else names
    names = [m.strip() for m in methods.split(",") if m.strip()]
    if not names:
        raise UsageError("--predictors is empty.", f"name one or more of: {', '.join(METHODS)}.")
    for name in names:
        make_predictor(name)  # an unknown name fails here, before any work
    return names


@app.command()
@user_errors
def predict(
    traces: TracesOpt = Path("out/profile"),
    eval_tokens: Annotated[
        int, typer.Option(help="Tokens per held-out batch (whole windows).")
    ] = 10240,
    repeats: Annotated[int, typer.Option(help="Held-out batches, each drawn with the seed.")] = 5,
    seed: Annotated[int, typer.Option(help="Seeds the choice of held-out batches.")] = 0,
    predictors: PredictorsOpt = None,
    predictor: Annotated[
        str | None, typer.Option(help="Predictor for --counts-out (default: the planner's).")
    ] = None,
    methods: Annotated[str | None, typer.Option("--methods", hidden=True)] = None,
    method: Annotated[str | None, typer.Option("--method", hidden=True)] = None,
    profile_tokens: Annotated[
        int | None,
        typer.Option(help="Profile on only this many of the remaining tokens (default: all)."),
    ] = None,
    tables: Annotated[
        Path | None,
        typer.Option(
            help="Predict with count tables saved by --tables-out (profiled on other traces) "
            "instead of profiling on the rest of --traces."
        ),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="PNG of real vs predicted counts per layer.")
    ] = None,
    counts_out: Annotated[
        Path | None,
        typer.Option(help="JSON of the predicted counts of one batch, which the planner reads."),
    ] = None,
    tables_out: Annotated[
        Path | None,
        typer.Option(help="Directory to save the count tables of the whole trace into."),
    ] = None,
    force: ForceOpt = False,
    list_predictors: Annotated[
        bool, typer.Option("--list-predictors", help="List the predictors and exit.")
    ] = False,
    list_methods: Annotated[bool, typer.Option("--list-methods", hidden=True)] = False,
    as_json: JsonOpt = False,
) -> None:
    """Evaluate the expert-selection predictors on held-out batches of a routing trace.

    Each repeat holds out --eval-tokens tokens of whole windows, profiles on the rest, and
    compares every method's predicted tokens per expert with the real ones.
    """
    from predictor import (
        DEFAULT_METHOD,
        METHODS,
        CountTable,
        PredictedCounts,
        RoutingTrace,
        build_tables,
        evaluate_methods,
        make_predictor,
        plot_counts,
        sample_batches,
        split_windows,
    )

    predictors = renamed("--methods", "--predictors", methods, predictors)
    predictor = renamed("--method", "--predictor", method, predictor)
    if renamed("--list-methods", "--list-predictors", list_methods, list_predictors):
        for name, spec in METHODS.items():
            mark = " (default)" if name == DEFAULT_METHOD else ""
            stdout().print(f"[bold]{name}[/]{mark}: {spec.description}", highlight=False)
        return
    chosen = predictor or DEFAULT_METHOD
    make_predictor(chosen)
    names = _method_list(predictors, tables is not None)
    if counts_out is not None and chosen not in names:
        names.append(chosen)
    check_file_out(plot, force, "--plot")  # fail before the work, not after it
    check_file_out(counts_out, force, "--counts-out")
    if tables_out is not None:
        check_out(tables_out, force, "--tables-out")

    trace = RoutingTrace.load(traces)
    saved = None
    if tables is not None:
        saved = CountTable.load(tables)
        saved.check_matches(trace)
        splits = sample_batches(trace, eval_tokens=eval_tokens, repeats=repeats, seed=seed)
    else:
        splits = split_windows(
            trace,
            eval_tokens=eval_tokens,
            repeats=repeats,
            seed=seed,
            profile_tokens=profile_tokens,
        )
    with err.status(f"evaluating {len(names)} methods on {repeats} held-out batches"):
        evaluation = evaluate_methods(splits, names, tables=saved)

    scores = {name: s.summary() for name, s in evaluation.scores.items()}
    lina = scores.get("lina-token", {}).get("mean_abs_diff")
    for name, entry in scores.items():
        entry["description"] = METHODS[name].description
        if lina:
            entry["mad_ratio_vs_lina_token"] = round(entry["mean_abs_diff"] / lina, 4)
    summary: dict[str, Any] = {
        "default": DEFAULT_METHOD,
        "model": trace.meta["model"],
        "experts": trace.num_experts,
        "top_k": trace.top_k,
        "layers": trace.num_layers,
        "corpus": trace.meta.get("corpus"),
        "trace_tokens": trace.num_tokens,
        "eval_tokens": eval_tokens,
        "profile_tokens": None if splits[0].profile is None else splits[0].profile.num_tokens,
        "tables": None if tables is None else str(tables),
        "repeats": repeats,
        "seed": seed,
        "methods": scores,
    }

    batch = evaluation.first_batch
    if counts_out is not None:
        first = evaluation.first_predictions[chosen]
        # The first batch's model error from the other batches only: its interval is honest.
        error = evaluation.scores[chosen].error_model(leave_out=0)
        counts = PredictedCounts(
            model=trace.meta["model"],
            experts=trace.num_experts,
            top_k=trace.top_k,
            seed=int(trace.meta.get("moefy_seed", 0)),
            moefy=trace.meta.get("moefy"),
            tokens=batch.num_tokens,
            method=chosen,
            counts=first.counts.round(4).tolist(),
            real=batch.popularity().tolist(),
            std=error.std(first.counts, first.variance).round(4).tolist(),
            model_error=np.sqrt(error.rho2).round(6).tolist(),
            residual_z=error.z.round(4).tolist(),
        )
        summary["counts_out"] = str(counts.save(counts_out, force=force))
    if plot is not None:
        shown = [m for m in (chosen, "lina-token") if m in evaluation.first_predictions]
        plot_counts(
            plot,
            batch.popularity(),
            {m: evaluation.first_predictions[m].counts for m in shown},
            title=f"{trace.meta['model']}, E={trace.num_experts}, top-{trace.top_k}: "
            f"{batch.num_tokens:,} held-out tokens",
            force=force,
        )
        summary["plot"] = str(plot)
    if tables_out is not None:
        summary["tables_out"] = str(build_tables(trace).save(tables_out, force=force))

    if as_json:
        print(json.dumps(summary))
        return
    _print_scores(summary)


def _print_scores(summary: dict[str, Any]) -> None:
    out = stdout()
    profiled = summary["profile_tokens"]
    source = f"tables {summary['tables']}" if profiled is None else f"{profiled:,} tokens"
    table = Table(
        title=f"Expert-selection prediction: {summary['model']}, E={summary['experts']}, "
        f"top-{summary['top_k']}; {summary['repeats']} held-out batches of "
        f"{summary['eval_tokens']:,} tokens, profiled on {source}"
    )
    table.add_column("method", no_wrap=True)
    for column in ("MAD", "÷lina", "top-k", "under", "cov90", "cov99", "fit s", "pred s"):
        table.add_column(column, justify="right", no_wrap=True)
    for name, s in summary["methods"].items():
        mark = " *" if name == summary["default"] else ""
        ratio = s.get("mad_ratio_vs_lina_token")
        table.add_row(
            name + mark,
            f"{s['mean_abs_diff']:.1f}±{s['mean_abs_diff_std']:.1f}",
            "" if ratio is None else f"{ratio:.3f}",
            f"{s['topk_accuracy']:.1%}",
            f"{s['underestimate_rate']:.1%}",
            *("-" if s[c] is None else f"{s[c]:.1%}" for c in ("coverage_90", "coverage_99")),
            f"{s['profile_s']:.3f}",
            f"{s['predict_s']:.3f}",
        )
    out.print(table)
    out.print(
        "MAD: mean |real - predicted| tokens per expert (± spread over batches); ÷lina: MAD "
        "relative to lina-token; top-k: accuracy; under: share of experts predicted below "
        "their real count; cov90, cov99: share of real counts inside the predicted 90 % and "
        "99 % intervals (each batch's model error measured on the other batches); fit s, "
        "pred s: seconds to profile, and to predict one batch."
    )
    files = [f"{k}: {summary[k]}" for k in ("counts_out", "plot", "tables_out") if k in summary]
    out.print("* the planner's method." + (" Wrote " + "; ".join(files) if files else ""))


@bench_app.command("predictor")
@user_errors
def bench_predictor(
    traces: Annotated[
        Path | None,
        typer.Option(help="A real trace to resample (default: profile 10,240 MiniLM tokens)."),
    ] = None,
    batches: Annotated[int, typer.Option(help="Profiling batches of 10,240 tokens.")] = 100,
    predict_batches: Annotated[int, typer.Option(help="Batches to predict.")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """Table building and prediction speed (targets: 100 batches <= 1 s, 10 batches <= 0.2 s).

    The profiling data is a real routing trace resampled by whole windows (with replacement) to
    `batches` × 10,240 tokens, so keys repeat as they do in real text. The paper reports 28.89 s
    and 20.31 s for the same two jobs (`predictor.bench_tables`).
    """
    from moelambda.cli.model import bench_trace
    from predictor import bench_tables

    if batches < 1 or predict_batches < 1:
        raise UsageError("--batches and --predict-batches must be positive.", "pass 1 or more.")
    trace = bench_trace(traces, experts=4)
    with err.status("building tables and predicting"):
        summary = bench_tables(trace, batches=batches, predict_batches=predict_batches)
    if as_json:
        print(json.dumps(summary))
    else:
        _render.bench_predictor(stdout(), summary)
