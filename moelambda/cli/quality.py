"""`moelambda quality`: how far the served MoE model is from the user's dense model."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.console import Console
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
    err,
    load_with_status,
    moefy_flags,
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
    out = Console()
    out.print(table)
    when = "measured now" if summary["measured_now"] else "measured when the model was MoEfied"
    out.print(f"({when}; {q['wall_s']:.1f} s)")

