"""`moelambda choose`: the cheapest MoEfication whose quality meets a floor."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import InfeasibleError, UsageError
from moelambda.cli._app import (
    ForceOpt,
    JsonOpt,
    ModelOpt,
    SeedOpt,
    app,
    check_out,
    err,
    stdout,
    user_errors,
)


def _split(flag: str, text: str) -> list[str]:
    items = [part.strip() for part in text.split(",") if part.strip()]
    if not items:
        raise UsageError(f"{flag} '{text}' lists nothing.", f"pass a comma-separated {flag}.")
    return items


def _numbers(flag: str, text: str, kind: type) -> list[Any]:
    try:
        return [kind(item) for item in _split(flag, text)]
    except ValueError as error:
        raise UsageError(
            f"{flag} '{text}' is not a comma-separated list of numbers.",
            f"pass e.g. {flag} {'8' if kind is int else '0,0.25'}.",
        ) from error


def grid_of(
    model: str,
    experts: str,
    top_k: str,
    shared: str,
    router: str,
    correction: str,
    seed: int,
    fit_tokens: int = 8192,
) -> list[Any]:
    """Every combination of the grid flags as `moe.MoefyOptions` (each one checked)."""
    from moelambda.cli._app import moefy_flags

    if correction not in ("on", "off", "both"):
        raise UsageError(f"--correction '{correction}' is not on, off or both.", "pass one.")
    corrections = {"on": [True], "off": [False], "both": [False, True]}[correction]
    grid = []
    for e, k, s, r, c in itertools.product(
        _numbers("--experts", experts, int),
        _split("--top-k", top_k),
        _numbers("--shared", shared, float),
        _split("--router", router),
        corrections,
    ):
        options = moefy_flags(
            model, e, k, seed, shared=s, router=r, correction=c, fit_tokens=fit_tokens
        )
        if options is None:
            raise UsageError(
                f"{model} is a native MoE model: it is served exactly as it is, there is no "
                "MoEfication to choose.",
                "run `moelambda plan` for it directly.",
            )
        if options not in grid:
            grid.append(options)
    return grid


@app.command()
@user_errors
def choose(
    model: ModelOpt = "minilm",
    corpus: Annotated[
        str, typer.Option(help="'wiki' (embedded) or a text/JSONL file of your requests.")
    ] = "wiki",
    tokens: Annotated[int, typer.Option(help="Tokens per batch to plan for.")] = 10240,
    slo: Annotated[float | None, typer.Option(help="Latency SLO of one batch, seconds.")] = None,
    min_cosine: Annotated[
        float | None,
        typer.Option(help="Encoders: the least mean cosine to the dense model's embeddings."),
    ] = None,
    max_ppl_ratio: Annotated[
        float | None,
        typer.Option(help="Decoders: the largest perplexity over the dense model's."),
    ] = None,
    experts: Annotated[str, typer.Option(help="Grid: experts per layer, e.g. 4,8.")] = "8",
    top_k: Annotated[
        str, typer.Option("--top-k", help="Grid: experts per token, e.g. 2,4,mass:0.6.")
    ] = "2,4,6",
    shared: Annotated[str, typer.Option(help="Grid: shared-expert fractions, e.g. 0,0.25.")] = (
        "0,0.25"
    ),
    router: Annotated[str, typer.Option(help="Grid: routers, mass and/or output.")] = "mass",
    correction: Annotated[
        str, typer.Option(help="Grid: least-squares correction on, off or both.")
    ] = "both",
    fit_tokens: Annotated[
        int,
        typer.Option(help="Tokens of fit text every option's routers and corrections see."),
    ] = 32768,
    quality_tokens: Annotated[
        int, typer.Option(help="Held-out tokens each option's quality is measured on.")
    ] = 16384,
    seed: SeedOpt = 0,
    out: Annotated[
        Path,
        typer.Option(help="Directory for the chosen plan (plan.json), choose.json, choose.png."),
    ] = Path("out/choose"),
    force: ForceOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Plan every MoEfication of a grid, measure its quality, and keep the cheapest that meets
    the floor (--min-cosine for encoders, --max-ppl-ratio for decoders)."""
    from planner.choose import Floor
    from planner.choose import choose as run_choose

    if (min_cosine is None) == (max_ppl_ratio is None):
        raise UsageError(
            "pass exactly one quality floor.",
            "use --min-cosine Q for an encoder (e.g. 0.95) or --max-ppl-ratio R for a decoder "
            "(e.g. 1.10).",
        )
    if min_cosine is not None and not -1.0 <= min_cosine <= 1.0:
        raise UsageError(f"--min-cosine {min_cosine} is not a cosine.", "pass a value in [-1, 1].")
    if max_ppl_ratio is not None and not max_ppl_ratio > 0:
        raise UsageError(f"--max-ppl-ratio {max_ppl_ratio} is not positive.", "pass e.g. 1.1.")
    if tokens < 1 or quality_tokens < 1:
        raise UsageError("--tokens and --quality-tokens must be positive.", "pass 1 or more.")
    if slo is not None and not slo > 0:
        raise UsageError(f"--slo {slo} is not positive.", "pass a positive --slo.")
    floor = (
        Floor("cosine_mean", min_cosine)
        if min_cosine is not None
        else Floor("ppl_ratio", max_ppl_ratio)  # type: ignore[arg-type]
    )
    check_out(out, force)
    grid = grid_of(model, experts, top_k, shared, router, correction, seed, fit_tokens)
    with err.status(f"evaluating {len(grid)} MoEfications") as status:
        selection = run_choose(
            model,
            grid,
            floor,
            corpus=corpus,
            tokens=tokens,
            quality_tokens=quality_tokens,
            slo_s=slo,
            seed=seed,
            progress=status.update,
        )
    summary = _summary(selection, model, tokens, slo)
    if selection.chosen is None:
        best = selection.best_quality()
        reached = best.quality[floor.metric]
        if as_json:
            print(json.dumps(summary))
        else:
            _print(summary)
        raise InfeasibleError(
            f"no option of the grid meets {floor.describe()}: the best reached is "
            f"{reached:.4f} ({best.options.label()})"
            + ("." if best.feasible else f", which has no plan: {best.why}"),
            "loosen the floor, or widen the grid (more experts per token: --top-k, a shared "
            "expert: --shared, --correction on).",
        )
    _write(out, selection, summary, force)
    summary["out"] = str(out)
    if as_json:
        print(json.dumps(summary))
        return
    _print(summary)


def _summary(selection: Any, model: str, tokens: int, slo: float | None) -> dict[str, Any]:
    chosen = selection.chosen
    return {
        "model": model,
        "tokens": tokens,
        "slo_s": slo,
        "floor": {"metric": selection.floor.metric, "value": selection.floor.value},
        "options": [r.describe() for r in selection.results],
        "frontier": selection.frontier,
        "chosen": None if chosen is None else selection.results[chosen].describe(),
        "chosen_index": chosen,
    }


def _write(out: Path, selection: Any, summary: dict[str, Any], force: bool) -> None:
    """plan.json of the chosen option, choose.json (the summary) and choose.png, atomically."""
    from ground.files import write_atomically

    chosen = selection.results[selection.chosen]

    def write(tmp: Path) -> None:
        chosen.plan.save(tmp / "plan.json")
        (tmp / "choose.json").write_text(json.dumps(summary, indent=2) + "\n")
        _plot(tmp / "choose.png", selection)

    write_atomically(out, write, force=force)


def _plot(path: Path, selection: Any) -> None:
    """Quality against bill per batch: every feasible option, the frontier, the floor, the
    chosen point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = selection.floor.metric
    feasible = [r for r in selection.results if r.feasible]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(
        [r.bill_usd * 1e6 for r in feasible],
        [r.quality[metric] for r in feasible],
        color="tab:blue",
        label="options",
    )
    for r in feasible:
        ax.annotate(r.options.label(), (r.bill_usd * 1e6, r.quality[metric]), fontsize=7)
    front = [selection.results[i] for i in selection.frontier]
    ax.plot(
        [r.bill_usd * 1e6 for r in front],
        [r.quality[metric] for r in front],
        color="tab:blue",
        alpha=0.5,
        label="frontier",
    )
    ax.axhline(selection.floor.value, color="tab:red", linestyle="--", label="floor")
    chosen = selection.results[selection.chosen]
    ax.scatter(
        [chosen.bill_usd * 1e6],
        [chosen.quality[metric]],
        marker="*",
        s=250,
        color="tab:orange",
        label=f"chosen: {chosen.options.label()}",
        zorder=3,
    )
    ax.set_xlabel("bill per batch (µ$)")
    ax.set_ylabel(metric.replace("_", " ") + " (against the dense model)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    finally:
        plt.close(fig)


def _print(summary: dict[str, Any]) -> None:
    floor = summary["floor"]
    metric = floor["metric"]
    table = Table(
        title=f"MoEfications of {summary['model']}: quality against the dense model and the "
        f"bill of a {summary['tokens']:,}-token batch (floor {metric} "
        f"{'>=' if metric == 'cosine_mean' else '<='} {floor['value']:g})"
    )
    for column in ("option", metric, "FFN FLOPs", "bill per batch", "functions", ""):
        table.add_column(column, justify="left" if column == "option" else "right")
    order = sorted(
        range(len(summary["options"])),
        key=lambda i: (
            summary["options"][i]["bill_usd"] is None,
            summary["options"][i]["bill_usd"] or 0,
        ),
    )
    for i in order:
        row = summary["options"][i]
        mark = (
            "CHOSEN"
            if i == summary["chosen_index"]
            else ("frontier" if i in summary["frontier"] else "")
        )
        bill = "no plan" if row["bill_usd"] is None else f"${row['bill_usd']:.6f}"
        quality = row["quality"][metric]
        table.add_row(
            row["label"],
            f"{quality:.4f}" + ("" if row["meets_floor"] else " ✗"),
            f"{row['expert_flops_share']:.2f}",
            bill,
            "" if row["functions"] is None else str(row["functions"]),
            mark,
        )
    out = stdout()
    out.print(table)
    if summary.get("out"):
        out.print(f"Wrote {summary['out']}/plan.json (the chosen option), choose.json, choose.png")
