"""`moelambda choose`: the cheapest MoEfication whose quality meets a floor."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ground.errors import UsageError
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
    weights_flag,
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
    distil_steps: str = "0",
    fit_corpus: str = "wiki",
    corpus: str = "wiki",
    local_steps: str = "0",
    ridge: str = "0.001",
) -> list[Any]:
    """Every combination of the grid flags as `moe.MoefyOptions` (each one checked);
    `fit_corpus` lists the texts to fit on, where "user" is `corpus`."""
    from moe._options import DEFAULT_RIDGE
    from moelambda.cli._app import moefy_flags

    if correction not in ("on", "off", "both"):
        raise UsageError(f"--correction '{correction}' is not on, off or both.", "pass one.")
    corrections = {"on": [True], "off": [False], "both": [False, True]}[correction]
    texts = [corpus if f == "user" else f for f in _split("--fit-corpus", fit_corpus)]
    grid = []
    ridges = _numbers("--ridge", ridge, float)
    for e, k, s, r, (c, lam), d, loc, f in itertools.product(
        _numbers("--experts", experts, int),
        _split("--top-k", top_k),
        _numbers("--shared", shared, float),
        _split("--router", router),
        # The ridge is the correction's: one option without it, one per ridge with it.
        [(on, lam) for on in corrections for lam in (ridges if on else [DEFAULT_RIDGE])],
        _numbers("--distil-steps", distil_steps, int),
        _numbers("--local-steps", local_steps, int),
        dict.fromkeys(texts),
    ):
        options = moefy_flags(
            model,
            e,
            k,
            seed,
            shared=s,
            router=r,
            correction=c,
            distil_steps=d,
            local_steps=loc,
            ridge=lam,
            fit_tokens=fit_tokens,
            fit_corpus=f,
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
    distil_steps: Annotated[
        str,
        typer.Option(help="Grid: steps of end-to-end distillation of the experts, e.g. 0,1500."),
    ] = "0",
    local_steps: Annotated[
        str,
        typer.Option(help="Grid: steps of layer-local distillation per layer, e.g. 0,300."),
    ] = "0",
    ridge: Annotated[
        str,
        typer.Option(help="Grid: the correction's ridge penalties, e.g. 0.001,1."),
    ] = "0.001",
    max_convert_minutes: Annotated[
        float | None,
        typer.Option(
            help="Skip options whose conversion takes longer (measured once converted, else "
            "estimated from rates measured on a 2-core machine); they are named."
        ),
    ] = None,
    fit_corpus: Annotated[
        str,
        typer.Option(
            help="Grid: the texts to fit on, 'user' (--corpus), 'wiki' or a file, e.g. "
            "wiki,user. The chosen option is fitted on --corpus when one fitted on it keeps "
            "the floor."
        ),
    ] = "user",
    fit_tokens: Annotated[
        int,
        typer.Option(help="Tokens of fit text every option's routers and corrections see."),
    ] = 32768,
    quality_tokens: Annotated[
        int,
        typer.Option(
            help="Tokens of the test part (and of the validation part, where the floor is "
            "checked) each option's quality is measured on."
        ),
    ] = 16384,
    weights: Annotated[
        list[str] | None,
        typer.Option(
            help="Grid: weight precisions each option is served at, repeatable: --weights fp32 "
            "--weights int8 (or stack=bf16,experts=int8). Default fp32."
        ),
    ] = None,
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
    from planner.choose import check_choose, write_selection
    from planner.choose import choose as run_choose

    floor = check_choose(
        min_cosine=min_cosine,
        max_ppl_ratio=max_ppl_ratio,
        tokens=tokens,
        quality_tokens=quality_tokens,
        slo_s=slo,
    )
    check_out(out, force)
    precisions = list(dict.fromkeys(weights_flag(spec) for spec in weights or ["fp32"]))
    grid = grid_of(
        model,
        experts,
        top_k,
        shared,
        router,
        correction,
        seed,
        fit_tokens,
        distil_steps,
        fit_corpus,
        corpus,
        local_steps,
        ridge,
    )
    if max_convert_minutes is not None and not max_convert_minutes > 0:
        raise UsageError(
            f"--max-convert-minutes {max_convert_minutes:g} is not positive.",
            "pass e.g. --max-convert-minutes 60.",
        )
    cells = len(grid) * len(precisions)
    with err.status(f"evaluating {cells} MoEfications and precisions") as status:
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
            max_convert_minutes=max_convert_minutes,
            precisions=precisions,
        )
    summary = selection.summary(model, tokens, slo)
    if selection.chosen is None:
        if as_json:
            print(json.dumps(summary))
        else:
            _print(summary)
        raise selection.none_meets()
    write_selection(out, selection, summary, force=force)
    summary["out"] = str(out)
    if as_json:
        print(json.dumps(summary))
        return
    _print(summary)


def _print(summary: dict[str, Any]) -> None:
    floor = summary["floor"]
    metric = floor["metric"]
    table = Table(
        title=f"MoEfications of {summary['model']}: quality against the dense model and the "
        f"bill of a {summary['tokens']:,}-token batch (floor {metric} "
        f"{'>=' if metric == 'cosine_mean' else '<='} {floor['value']:g}, checked on the "
        "validation text; test: text no choice saw)"
    )
    columns = (
        "option",
        f"{metric} validation",
        "test",
        "FFN FLOPs",
        "convert min",
        "bill per batch",
    )
    for column in (*columns, "functions", ""):
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
        validation = row["validation_quality"][metric]
        table.add_row(
            row["label"],
            f"{validation:.4f}" + ("" if row["meets_floor"] else " ✗"),
            f"{row['quality'][metric]:.4f}",
            f"{row['expert_flops_share']:.2f}",
            "-" if row.get("convert_s") is None else f"{row['convert_s'] / 60:.1f}",
            bill,
            "" if row["functions"] is None else str(row["functions"]),
            mark,
        )
    out = stdout()
    out.print(table)
    for skip in summary.get("skipped_for_convert_budget") or []:
        how = "measured" if skip["measured"] else "estimated"
        out.print(
            f"Skipped {skip['label']}: converting takes about {skip['convert_minutes']:g} "
            f"minutes ({how}), over --max-convert-minutes {summary['max_convert_minutes']:g}."
        )
    if summary.get("out"):
        out.print(f"Wrote {summary['out']}/plan.json (the chosen option), choose.json, choose.png")
