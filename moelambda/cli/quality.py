"""`moelambda quality`: how far the served MoE model is from the user's dense model."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.table import Table

from moelambda.cli._app import (
    CacheOpt,
    CorrectionOpt,
    DistilOpt,
    ExpertsOpt,
    FitTokensOpt,
    JsonOpt,
    ModelOpt,
    RouterOpt,
    SeedOpt,
    SharedOpt,
    TopKOpt,
    app,
    bench_app,
    err,
    load_with_status,
    moefy_flags,
    stdout,
    user_errors,
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
    fit_tokens: FitTokensOpt = 8192,
    corpus: Annotated[
        str, typer.Option(help="'wiki' (embedded, held-out split) or a text/JSONL file.")
    ] = "wiki",
    tokens: Annotated[int, typer.Option(help="Tokens to compare on.")] = 16384,
    window: Annotated[int, typer.Option(help="Tokens per window (one embedding each).")] = 64,
    seed: SeedOpt = 0,
    cache: CacheOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Compare the MoE model with the dense model on text no router was fitted on."""
    from moe import quality_of

    options = moefy_flags(
        model,
        experts,
        top_k,
        seed,
        shared=shared,
        router=router,
        correction=correction,
        distil_steps=distil_steps,
        fit_tokens=fit_tokens,
    )
    if tokens < 1 or window < 2:
        from ground.errors import UsageError

        raise UsageError(
            f"--tokens {tokens} / --window {window} leave nothing to compare.",
            "pass --tokens 1 or more and --window 2 or more.",
        )
    if options is None:
        from moe._quality import native_model_error

        raise native_model_error(model)
    loaded = load_with_status(model, experts, top_k, seed, cache, options)
    with err.status("comparing with the dense model"):
        measured, fresh = quality_of(
            loaded, corpus=corpus, tokens=tokens, window=window, seed=seed
        )
    summary: dict[str, Any] = {
        "model": loaded.name,
        "moefy": options.describe() if options else None,
        "quality": measured.model_dump(),
        "measured_now": fresh,
    }
    if as_json:
        print(json.dumps(summary))
        return
    _print(summary, options.label() if options else loaded.name)


def _print(summary: dict[str, Any], label: str) -> None:
    q = summary["quality"]
    table = Table(
        title=f"{summary['model']} {label} against the dense model: {q['tokens']:,} held-out "
        f"tokens of '{q['corpus']}' in {q['windows']} windows of {q['window']}"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, name in _ENCODER if q["kind"] == "encoder" else _DECODER:
        table.add_row(name, f"{q[key]:.4f}")
    table.add_row("FFN FLOPs per token / dense", f"{q['expert_flops_share']:.3f}")
    table.add_row("  per layer", " ".join(f"{s:.2f}" for s in q["flops_share_per_layer"]))
    out = stdout()
    out.print(table)
    when = "measured now" if summary["measured_now"] else "measured when the model was MoEfied"
    out.print(f"({when}; {q['wall_s']:.1f} s)")


# The options `bench quality` compares per model: MoEfication as it was, then quality recovery
# at about half the dense FFN's FLOPs, then the least FLOPs that keep the stated floor.
BENCH_OPTIONS: dict[str, list[dict[str, Any]]] = {
    "minilm": [
        {"experts": 4, "top_k": "2"},
        {"experts": 8, "top_k": "2"},
        {"experts": 8, "top_k": "4"},
        {"experts": 8, "top_k": "4", "correction": True, "fit_tokens": 131072},
        {"experts": 8, "top_k": "4", "correction": True, "router": "output", "fit_tokens": 131072},
        {"experts": 8, "top_k": "2", "shared": 0.25, "correction": True, "fit_tokens": 131072},
        {"experts": 8, "top_k": "6", "correction": True, "fit_tokens": 131072},
    ],
    "smollm2": [
        {"experts": 8, "top_k": "2"},
        {"experts": 8, "top_k": "4"},
        {"experts": 8, "top_k": "4", "correction": True},
        {"experts": 8, "top_k": "6", "correction": True},
    ],
}
FLOORS = {"minilm": ("cosine_mean", 0.97), "smollm2": ("ppl_ratio", 1.05)}
HALF_FLOPS = 0.5


@bench_app.command("quality")
@user_errors
def bench_quality(
    models: Annotated[str, typer.Option(help="Comma-separated: minilm, smollm2.")] = (
        "minilm,smollm2"
    ),
    tokens: Annotated[int, typer.Option(help="Tokens per planned batch.")] = 10240,
    as_json: JsonOpt = False,
) -> None:
    """The served model against the dense one for each MoEfication option, with its bill.

    Per model: quality on 16,384 held-out tokens, FFN FLOPs share and the bill of a batch (the
    cheapest plan, exact solver) for each option; the best quality at no more than half the
    dense FFN's FLOPs against the target (MiniLM: mean cosine >= 0.97 and 10-neighbour overlap
    >= 0.80; SmolLM2: perplexity ratio <= 1.05); the cheapest option that keeps the floor, as
    `moelambda choose` picks it; and the time `quality` takes on MiniLM once it is cached
    (target 60 s). Models are MoEfied on first use (SmolLM2: minutes per option).
    """
    import time

    from moe import dense_reference, load_corpus, load_model, measure_quality
    from planner.choose import Floor, choose

    names = [m.strip() for m in models.split(",") if m.strip()]
    unknown = [m for m in names if m not in BENCH_OPTIONS]
    if unknown or not names:
        from ground.errors import UsageError

        raise UsageError(
            f"--models {models!r}: {', '.join(unknown) or 'nothing'} is not benchmarked.",
            f"pass some of {', '.join(BENCH_OPTIONS)}.",
        )
    report: dict[str, Any] = {"tokens": tokens, "models": {}}
    for name in names:
        grid = grid_of_bench(name)
        metric, value = FLOORS[name]
        with err.status(f"{name}: {len(grid)} options") as status:
            selection = choose(
                name, grid, Floor(metric, value), tokens=tokens, progress=status.update
            )
        rows = [r.describe() for r in selection.results]
        half = [r for r in rows if r["expert_flops_share"] <= HALF_FLOPS + 1e-9]
        if metric == "cosine_mean":
            best = max(half, key=lambda r: r["quality"]["cosine_mean"])
            meets = (
                best["quality"]["cosine_mean"] >= 0.97
                and best["quality"]["neighbour_overlap_10"] >= 0.80
            )
        else:
            best = min(half, key=lambda r: r["quality"]["ppl_ratio"])
            meets = best["quality"]["ppl_ratio"] <= 1.05
        chosen = None if selection.chosen is None else rows[selection.chosen]
        report["models"][name] = {
            "floor": {"metric": metric, "value": value},
            "options": rows,
            "best_at_half_flops": best["label"],
            "best_at_half_flops_quality": best["quality"],
            "half_flops_target_met": meets,
            "chosen_for_floor": None if chosen is None else chosen["label"],
            "chosen_bill_usd": None if chosen is None else chosen["bill_usd"],
        }
    if "minilm" in names:
        model = load_model("minilm", options=grid_of_bench("minilm")[0])
        started = time.perf_counter()
        measure_quality(model, dense_reference("minilm"), load_corpus("wiki"), tokens=16384)
        seconds = time.perf_counter() - started
        report["quality_16384_tokens_s"] = round(seconds, 2)
        report["quality_target_s"] = 60
        report["quality_within_target"] = seconds <= 60
    if as_json:
        print(json.dumps(report))
        return
    _print_bench(report)


def grid_of_bench(name: str) -> list[Any]:
    from moe import MoefyOptions
    from moe._options import parse_top_k

    return [
        MoefyOptions(**{**o, "top_k": parse_top_k(o["top_k"], o["experts"])})
        for o in BENCH_OPTIONS[name]
    ]


def _print_bench(report: dict[str, Any]) -> None:
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
        dense = (
            "dense: cosine 1, 10-NN 100 %"
            if metric == "cosine_mean"
            else (f"dense perplexity {result['options'][0]['quality']['perplexity_dense']:.2f}")
        )
        table = Table(
            title=f"{name} against the dense model ({dense}); bill per "
            f"{report['tokens']:,}-token batch"
        )
        table.add_column("option")
        for _, label in columns:
            table.add_column(label, justify="right")
        table.add_column("FFN FLOPs", justify="right")
        table.add_column("bill", justify="right")
        for row in result["options"]:
            q = row["quality"]
            bill = "no plan" if row["bill_usd"] is None else f"${row['bill_usd']:.6f}"
            table.add_row(
                row["label"],
                *(f"{q[key]:.4f}" for key, _ in columns),
                f"{row['expert_flops_share']:.3f}",
                bill,
            )
        out.print(table)
        out.print(
            f"best at <= {HALF_FLOPS:.0%} FFN FLOPs: {result['best_at_half_flops']} "
            f"(target met: {result['half_flops_target_met']}); cheapest keeping "
            f"{metric} {'>=' if metric == 'cosine_mean' else '<='} {result['floor']['value']}: "
            f"{result['chosen_for_floor']}"
        )
    if "quality_16384_tokens_s" in report:
        out.print(
            f"quality on 16,384 MiniLM tokens: {report['quality_16384_tokens_s']:.1f} s "
            f"(target {report['quality_target_s']} s)"
        )
