"""Commands on the model: profile its routing, export stage weights, benchmark the profiler."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ground.errors import UsageError
from moelambda.cli import _render
from moelambda.cli._app import (
    DEFAULT_BATCH,
    CacheOpt,
    CorrectionOpt,
    DistilOpt,
    ExpertsOpt,
    FitCorpusOpt,
    FitTokensOpt,
    ForceOpt,
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
    check_out,
    err,
    load_with_status,
    moefy_flags,
    progress,
    stdout,
    user_errors,
    weights_flag,
)

if TYPE_CHECKING:
    from predictor import RoutingTrace


def run_profile(
    *,
    model: str,
    experts: int | None,
    top_k: str | int | None,
    corpus: str,
    tokens: int,
    window: int,
    seed: int,
    batch_size: int,
    cache: bool = True,
    moefy: Any = None,
    weights: Any = None,
) -> tuple[Any, Any, float]:
    from rich.progress import BarColumn, MofNCompleteColumn, TimeRemainingColumn

    from moe import load_corpus, make_windows
    from predictor import profile_windows

    if tokens < 1:
        raise UsageError(
            f"--tokens {tokens} is not a positive number.", "pass --tokens 1 or more."
        )
    if batch_size < 1:
        raise UsageError(
            f"--batch-size {batch_size} is not positive.", "pass --batch-size 1 or more."
        )
    text = load_corpus(corpus)
    started = time.perf_counter()
    moe_model = load_with_status(model, experts, top_k, seed, cache, moefy, weights)
    load_s = time.perf_counter() - started
    windows = make_windows(text, moe_model.tokenizer, tokens=tokens, window=window, seed=seed)
    with progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
    ) as bar:
        task = bar.add_task("profiling tokens", total=windows.size)
        result = profile_windows(
            moe_model,
            windows,
            tokens=tokens,
            batch_size=batch_size,
            meta={"corpus": text.name, "seed": seed, "window": window},
            advance=lambda n: bar.advance(task, n),
        )
    return moe_model, result, load_s


@app.command()
@user_errors
def profile(
    out: Annotated[Path, typer.Option(help="Directory to write trace.npz into.")] = Path(
        "out/profile"
    ),
    model: ModelOpt = "minilm",
    experts: ExpertsOpt = None,
    top_k: TopKOpt = None,
    corpus: Annotated[str, typer.Option(help="'wiki' (embedded) or a text/JSONL file.")] = "wiki",
    tokens: Annotated[int, typer.Option(help="Tokens to profile.")] = 10240,
    window: Annotated[int, typer.Option(help="Tokens per window (request).")] = 128,
    seed: SeedOpt = 0,
    shared: SharedOpt = 0.0,
    router: RouterOpt = "mass",
    correction: CorrectionOpt = False,
    distil_steps: DistilOpt = 0,
    local_steps: LocalOpt = 0,
    ridge: RidgeOpt = None,
    fit_tokens: FitTokensOpt = 8192,
    fit_corpus: FitCorpusOpt = None,
    batch_size: Annotated[int, typer.Option(help="Windows per forward pass.")] = DEFAULT_BATCH,
    weights: WeightsOpt = "fp32",
    force: ForceOpt = False,
    cache: CacheOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Record which experts every token picks (routing trace) on real text.

    A MoEfied model is fitted on --fit-corpus, by default the --corpus profiled (its fit part).
    """
    from moe import load_corpus

    check_out(out, force)
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
    moe_model, result, load_s = run_profile(
        model=model,
        experts=experts,
        top_k=top_k,
        corpus=corpus,
        tokens=tokens,
        window=window,
        seed=seed,
        batch_size=batch_size,
        cache=cache,
        moefy=options,
        weights=precision,
    )
    trace = result.trace
    path = trace.save(out, force=force)
    popularity = trace.popularity()
    summary = {
        "model": moe_model.name,
        "layers": trace.num_layers,
        "experts": trace.num_experts,
        "top_k": trace.top_k,
        "tokens": trace.num_tokens,
        "tokens_per_s": round(result.tokens_per_s, 1),
        "popularity": popularity.tolist(),
        "corpus": trace.meta["corpus"],
        # Repeats of an earlier document, dropped before the corpus was split (`moe.Corpus`).
        "corpus_duplicates_dropped": load_corpus(corpus).duplicates_dropped,
        "seed": seed,
        "window": window,
        "load_s": round(load_s, 2),
        "trace": str(path),
        "router_fit": [
            {
                "accuracy": round(f.router_accuracy, 4),
                "mass_captured": round(f.mass_captured, 4),
                "ffn_rel_error": round(f.ffn_rel_error, 4),
            }
            for f in moe_model.fits
        ],
        "moefy": None if moe_model.options is None else moe_model.options.describe(),
        "weights": moe_model.weights.label(),
        "quality": moe_model.quality,
    }
    if as_json:
        print(json.dumps(summary))
        return
    _render.popularity(stdout(), summary)


@app.command()
@user_errors
def export(
    out: Annotated[Path, typer.Option(help="Directory to write the stage weights into.")] = Path(
        "out/weights"
    ),
    model: ModelOpt = "minilm",
    experts: ExpertsOpt = None,
    top_k: TopKOpt = None,
    seed: SeedOpt = 0,
    shared: SharedOpt = 0.0,
    router: RouterOpt = "mass",
    correction: CorrectionOpt = False,
    distil_steps: DistilOpt = 0,
    local_steps: LocalOpt = 0,
    ridge: RidgeOpt = None,
    fit_tokens: FitTokensOpt = 8192,
    fit_corpus: Annotated[
        str | None,
        typer.Option(
            help="The text the MoEfied model is fitted on: 'wiki' (embedded) or a text/JSONL "
            "file, split by document into fit, validation and test parts. Defaults to wiki."
        ),
    ] = None,
    weights: WeightsOpt = "fp32",
    force: ForceOpt = False,
    cache: CacheOpt = True,
    as_json: JsonOpt = False,
) -> None:
    """Write each stage's weights to safetensors, laid out as the functions read them from S3."""
    from moe import export_model

    check_out(out, force)
    precision = weights_flag(weights)
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
    )
    loaded = load_with_status(model, experts, top_k, seed, cache, options, precision)
    manifest = export_model(loaded, out, force=force)
    sizes = manifest.expert_bytes()
    summary = {
        "model": manifest.model,
        "weights": manifest.weights,
        "out": str(out),
        "stages": len(manifest.stages),
        "total_bytes": sum(s.bytes for s in manifest.stages),
        "expert_bytes": sizes,
        "token_bytes_in": manifest.token_bytes_in,
    }
    if as_json:
        print(json.dumps(summary))
        return
    stdout().print(
        f"Exported {summary['stages']} stages ({summary['total_bytes'] / 1e6:.1f} MB, "
        f"{summary['weights']} weights) to {out}; "
        f"each expert is {sizes[0][0] / 1e6:.2f} MB (layer 0)."
    )


@bench_app.command("profiler")
@user_errors
def bench_profiler(
    tokens: Annotated[int, typer.Option(help="Tokens per profiling pass.")] = 10240,
    experts: Annotated[int, typer.Option(help="Experts per layer.")] = 4,
    repeats: Annotated[int, typer.Option(help="Timed passes (after one warm-up pass).")] = 3,
    as_json: JsonOpt = False,
) -> None:
    """Profiler throughput of MiniLM on the embedded corpus (target: >= 5,000 tokens/s).

    One untimed warm-up pass, then `repeats` timed passes over the same windows; the median is
    the result, and every pass is printed (`predictor.bench_profiler`).
    """
    from predictor import bench_profiler as run

    if repeats < 1:
        raise UsageError(f"--repeats {repeats} is not positive.", "pass --repeats 1 or more.")
    started = time.perf_counter()
    model = load_with_status("minilm", experts, 2, 0, True)
    load_s = time.perf_counter() - started
    with err.status(f"profiling {tokens:,} tokens {repeats + 1} times"):
        result = run(model, tokens=tokens, repeats=repeats, batch_windows=DEFAULT_BATCH)
    summary = {"model": "minilm", "experts": experts, "top_k": 2, **result}
    summary["load_s"] = round(load_s, 2)
    if as_json:
        print(json.dumps(summary))
    else:
        _render.bench_profiler(stdout(), summary)


def bench_trace(traces: Path | None, *, experts: int) -> RoutingTrace:
    """The trace a benchmark runs on: `traces` if given, else 10,240 fresh MiniLM tokens."""
    from predictor import RoutingTrace

    if traces is not None:
        return RoutingTrace.load(traces)
    _, result, _ = run_profile(
        model="minilm",
        experts=experts,
        top_k=2,
        corpus="wiki",
        tokens=10240,
        window=128,
        seed=0,
        batch_size=32,
    )
    return result.trace
