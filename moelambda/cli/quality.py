"""`moelambda quality`: how far the served MoE model is from the user's dense model."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
from moelambda.cli._app import (
    CacheOpt,
    CorrectionOpt,
    DistilOpt,
    ExpertsOpt,
    FitCorpusOpt,
    FitTokensOpt,
    JsonOpt,
    LocalOpt,
    ModelOpt,
    RidgeOpt,
    RouterOpt,
    SeedOpt,
    SharedOpt,
    TopKOpt,
    WeightsOpt,
    app,
    bench_app,
    err,
    load_with_status,
    moefy_flags,
    stdout,
    user_errors,
    weights_flag,
)

_ENCODER = (
    ("cosine_mean", "mean cosine to dense"),
    ("cosine_p05", "5th-percentile cosine"),
    ("cosine_min", "lowest cosine"),
    ("neighbour_overlap_10", "10 nearest neighbours kept"),
)
_DECODER = (
    ("perplexity_dense", "perplexity, dense"),
    ("perplexity_moe", "perplexity, MoE"),
    ("ppl_ratio", "perplexity ratio"),
    ("next_token_agreement", "next token as dense"),
    ("kl_mean", "mean KL(dense || MoE)"),
)


@app.command()
@user_errors
def quality(
    model: ModelOpt = "minilm",
    experts: ExpertsOpt = None,
    top_k: TopKOpt = None,
    shared: SharedOpt = 0.0,
    router: RouterOpt = "mass",
    correction: CorrectionOpt = False,
    distil_steps: DistilOpt = 0,
    local_steps: LocalOpt = 0,
    ridge: RidgeOpt = None,
    fit_tokens: FitTokensOpt = 8192,
    corpus: Annotated[
        str,
        typer.Option(
            help="The text to judge on, its test part: 'wiki' (embedded) or a text/JSONL file."
        ),
    ] = "wiki",
    fit_corpus: FitCorpusOpt = None,
    tokens: Annotated[int, typer.Option(help="Tokens to compare on.")] = 16384,
    window: Annotated[int, typer.Option(help="Tokens per window (one embedding each).")] = 64,
    split: Annotated[
        str,
        typer.Option(
            help="The part of --corpus to judge on: test (what is reported) or validation "
            "(where options are chosen)."
        ),
    ] = "test",
    seed: SeedOpt = 0,
    weights: WeightsOpt = "fp32",
    cache: CacheOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Compare the MoE model with the dense model on held-out text: the test part of --corpus,
    which no fit or choice read. The model is fitted on --fit-corpus (by default --corpus
    itself, so a model fitted on your text is judged on documents of it that it never saw)."""
    from moe import load_corpus, quality_of

    precision = weights_flag(weights)
    load_corpus(corpus)  # a missing or unreadable --corpus is said as such, first
    options = moefy_flags(
        model,
        experts,
        top_k,
        seed,
        shared=shared,
        router=router,
        correction=correction,
        distil_steps=distil_steps,
        local_steps=local_steps,
        ridge=ridge,
        fit_tokens=fit_tokens,
        fit_corpus=fit_corpus,
        corpus=corpus,
    )
    from moe._quality import check_held_out, check_quality_size, native_model_error

    check_quality_size(tokens, window)
    if split not in ("test", "validation"):
        raise UsageError(f"--split '{split}' is not a held-out part.", "pass test or validation.")
    if options is None:
        raise native_model_error(model)
    check_held_out(corpus, tokens, window)
    from moe._model import check_judged_text

    check_judged_text(model, options, corpus)  # not judged on text it fits on, said now
    loaded = load_with_status(model, experts, top_k, seed, cache, options, precision)
    with err.status("comparing with the dense model"):
        measured, fresh = quality_of(
            loaded,
            corpus=corpus,
            tokens=tokens,
            window=window,
            seed=seed,
            split=split,  # type: ignore[arg-type]
        )
    summary: dict[str, Any] = {
        "model": loaded.name,
        "moefy": loaded.options.describe() if loaded.options else None,
        "weights": loaded.weights.label(),
        "quality": measured.model_dump(),
        "measured_now": fresh,
        # Repeats of an earlier document, dropped before the corpus was split (`moe.Corpus`).
        "corpus_duplicates_dropped": load_corpus(corpus).duplicates_dropped,
    }
    if as_json:
        print(json.dumps(summary))
        return
    label = options.label() if options else loaded.name
    _print(summary, label if precision.is_fp32 else f"{label} at {precision.label()}")


def _print(summary: dict[str, Any], label: str) -> None:
    q = summary["quality"]
    table = Table(
        title=f"{summary['model']} {label} against the dense model: {q['tokens']:,} tokens of "
        f"the {q.get('split', 'whole')} part of '{q['corpus']}' in {q['windows']} windows of "
        f"{q['window']}"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, name in _ENCODER if q["kind"] == "encoder" else _DECODER:
        table.add_row(name, f"{q[key]:.4f}")
    table.add_row("FFN FLOPs per token / dense", f"{q['expert_flops_share']:.3f}")
    table.add_row("  per layer", " ".join(f"{s:.2f}" for s in q["flops_share_per_layer"]))
    out = stdout()
    out.print(table)
    from moe import Quality

    where = Quality(**q)
    if where.fit_corpus is not None:
        style = "" if where.judged_on_fit_text else "[yellow]"
        out.print(f"{style}{where.where()}", highlight=False)
    if where.distil_text is not None:
        out.print(
            f"Distilled on {where.distil_text['windows']:,} distinct windows of the fit part, "
            f"{where.distil_text['epochs']:g} epochs; the step kept on validation text: "
            f"{where.distil_kept_step}.",
            highlight=False,
        )
    if summary.get("corpus_duplicates_dropped"):
        out.print(
            f"{summary['corpus_duplicates_dropped']:,} documents of '{q['corpus']}' repeating an "
            "earlier one were dropped before it was split.",
            highlight=False,
        )
    when = "measured now" if summary["measured_now"] else "measured when the model was MoEfied"
    out.print(f"({when}; {q['wall_s']:.1f} s)")


@bench_app.command("quality")
@user_errors
def bench_quality(
    models: Annotated[str, typer.Option(help="Comma-separated: minilm, smollm2.")] = (
        "minilm,smollm2"
    ),
    tokens: Annotated[int, typer.Option(help="Tokens per planned batch.")] = 10240,
    seeds: Annotated[
        str,
        typer.Option(help="Comma-separated MoEfication seeds; each also seeds its windows."),
    ] = "0,1",
    cached_only: Annotated[
        bool,
        typer.Option(
            help="Leave out each option not in the model cache yet and name it, instead of "
            "converting it (a distilled MiniLM option takes about 48 minutes on 2 cores)."
        ),
    ] = False,
    corpus: Annotated[
        str,
        typer.Option(
            help="'wiki', or a text/JSONL file of your own: then MiniLM's E8 k4 options with "
            "the correction, without and with distillation, each fitted on the embedded text "
            "and on the file's fit part, judged on its test part."
        ),
    ] = "wiki",
    as_json: JsonOpt = False,
) -> None:
    """The served model against the dense one for each MoEfication option, with its bill.

    Per model and seed: quality on 16,384 tokens of the embedded text's test part (no choice
    saw it), FFN FLOPs share and the bill of a batch (the cheapest plan, exact solver) for each
    option; the best option at no more than half the dense FFN's FLOPs, chosen on the
    validation part, against the target (MiniLM: mean cosine >= 0.97 and 10-neighbour overlap
    >= 0.80; SmolLM2: perplexity ratio <= 1.05); the cheapest option that keeps the floor, as
    `moelambda choose` picks it; and the time `quality` takes on MiniLM once it is cached
    (target 60 s). Models are MoEfied on first use (SmolLM2: minutes per option; a distilled
    MiniLM option about 48 minutes per seed).
    """
    from planner.bench import bench_quality as run_bench

    try:
        seed_list = tuple(int(s) for s in seeds.split(",") if s.strip())
    except ValueError:
        raise UsageError(
            f"--seeds {seeds!r} is not a list of integers.", "pass e.g. 0,1."
        ) from None
    report = run_bench(
        models,
        tokens,
        seeds=seed_list,
        cached_only=cached_only,
        corpus=corpus,
        status=err.status,
    )
    if as_json:
        print(json.dumps(report))
        return
    _print_bench(report)


def _print_bench(report: dict[str, Any]) -> None:
    from planner.bench import HALF_FLOPS

    out = stdout()
    for name, result in report["models"].items():
        metric = result["floor"]["metric"]
        columns = (
            ("cosine_mean", "cos mean"),
            ("cosine_p05", "cos p5"),
            ("neighbour_overlap_10", "10-NN kept"),
        )
        if metric == "ppl_ratio":
            columns = (
                ("perplexity_moe", "perplexity"),
                ("ppl_ratio", "ppl ratio"),
                ("next_token_agreement", "next token"),
            )
        for run in result["seeds"]:
            first = run["options"][0]["quality"]
            dense = (
                "dense: cosine 1, 10-NN 100 %"
                if metric == "cosine_mean"
                else f"dense perplexity {first['perplexity_dense']:.2f}"
            )
            table = Table(
                title=f"{name}, seed {run['seed']}, against the dense model ({dense}) on "
                f"{first['tokens']:,} tokens of the test part of '{first['corpus']}'; bill per "
                f"{report['tokens']:,}-token batch"
            )
            table.add_column("option")
            for _, label in columns:
                table.add_column(label, justify="right")
            table.add_column("FFN FLOPs", justify="right")
            table.add_column("bill", justify="right")
            for row in run["options"]:
                q = row["quality"]
                bill = "no plan" if row["bill_usd"] is None else f"${row['bill_usd']:.6f}"
                table.add_row(
                    row["label"],
                    *(f"{q[key]:.4f}" for key, _ in columns),
                    f"{row['expert_flops_share']:.3f}",
                    bill,
                )
            out.print(table)
            for pair in run.get("fit_comparison", []):
                wiki, user, option = pair.get("wiki"), pair.get("user"), pair["moefy"]
                if wiki and user and metric == "cosine_mean":
                    distil = f" distil {option['distil_steps']}" if option["distil_steps"] else ""
                    out.print(
                        f"E{option['experts']} k{option['top_k']}{distil}, fitted on wiki vs "
                        f"on this text: cosine {wiki['cosine_mean']:.4f} vs "
                        f"{user['cosine_mean']:.4f}, 10-NN {wiki['neighbour_overlap_10']:.1%} "
                        f"vs {user['neighbour_overlap_10']:.1%}"
                    )
            if run.get("not_converted"):
                out.print(
                    f"not converted (not in the model cache): {', '.join(run['not_converted'])}"
                )
            out.print(
                f"best at <= {HALF_FLOPS:.0%} FFN FLOPs (chosen on validation text): "
                f"{run['best_at_half_flops']} (target met on test text: "
                f"{run['half_flops_target_met']}); cheapest keeping {metric} "
                f"{'>=' if metric == 'cosine_mean' else '<='} {result['floor']['value']} on "
                f"validation text: {run['chosen_for_floor']}"
            )
    if "quality_16384_tokens_s" in report:
        out.print(
            f"quality on 16,384 MiniLM tokens: {report['quality_16384_tokens_s']:.1f} s "
            f"(target {report['quality_target_s']} s)"
        )
