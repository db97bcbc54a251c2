"""`moelambda bench shapes`: every deployment shape of every model size, side by side.

For each model, from a 22-million-parameter MiniLM to a 47-billion-parameter Mixtral, every
deployment shape (`planner.deployments`: one function, a driver, the fan-out workflow) is
planned for one batch of `TOKENS` tokens with no SLO (its cheapest plan), and that plan is
simulated at one request a minute on the shipped Azure conversation trace for a day
(`planner.traffic.simulate_plan`: cold starts, INIT billed, one execution per request). The
report says per model which shape wins on the batch and on the stream, and why it loses where
it does; `plot_shapes` draws the bill against the model's size.

Models: MiniLM and SmolLM2 are real MoEfied models (their routing of `TOKENS` tokens of the
embedded Wikipedia text gives the counts); OLMoE, Mixtral and Qwen1.5-MoE are model shapes
(`planner.shapes`) with a Zipf(1) popularity, labelled synthetic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ground.errors import UsageError

__all__ = ["MODELS", "TOKENS", "bench_shapes", "plot_shapes"]

TOKENS = 10240
RATE_PER_S = 1 / 60  # one request a minute
DAY_H = 24.0
# name -> how it is built: a real model's MoEfication, or a shape's name
MODELS: dict[str, dict[str, Any]] = {
    "minilm": {"real": True, "experts": 8, "top_k": 6, "label": "MiniLM (E8 k6, demo)"},
    "smollm2": {"real": True, "experts": 8, "top_k": 4, "label": "SmolLM2-135M (E8 k4)"},
    "olmoe": {"real": False, "label": "OLMoE-1B-7B"},
    "qwen-moe": {"real": False, "label": "Qwen1.5-MoE-A2.7B"},
    "mixtral": {"real": False, "label": "Mixtral-8x7B"},
}


def _real(name: str, spec: dict[str, Any], progress: Callable[[str], None]) -> tuple[Any, Any]:
    """(manifest, planning counts) of a real MoEfied model: the routing of `TOKENS` tokens of
    Wikipedia through it (the correction on, as `choose` would serve it)."""
    import torch

    from moe import describe_model, load_corpus, load_model, make_windows, moefy_options
    from planner.api import PlanningCounts

    options = moefy_options(spec["experts"], spec["top_k"], correction=True)
    model = load_model(name, options=options, progress=progress)
    window = 128
    ids = make_windows(load_corpus("wiki"), model.tokenizer, tokens=TOKENS, window=window, seed=0)
    counts = []
    for start in range(0, ids.shape[0], 16):
        routing: list = []
        with torch.inference_mode():
            model.forward(torch.from_numpy(ids[start : start + 16]), routing=routing)
        counts.append(
            [
                np.bincount(r.experts.reshape(-1), minlength=model.experts + 1)[: model.experts]
                for r in routing
            ]
        )
    total = np.sum(counts, axis=0).astype(float)
    source = {"routing": f"{TOKENS:,} tokens of the embedded Wikipedia text", "model": name}
    return describe_model(model), PlanningCounts(total, TOKENS, source)


def _params(manifest: Any) -> float:
    """The model's parameters: each stage's bytes over its kind's width (`Manifest.params`)."""
    return sum(manifest.params(s) for s in manifest.stages)


def bench_shapes(
    models: list[str] | None = None,
    *,
    concurrency_quota: int = 100_000,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every shape of every model: the batch's bill and latency, a day at one request a
    minute; see the module docstring.

    Args:
        models: Names from `MODELS`. Defaults to None: all of them.
        concurrency_quota: The account's concurrency quota the plans must fit (a large
            account's: Mixtral's workflow reserves thousands of executions).
        progress: Called with a message per step.

    Raises:
        UsageError: An unknown model name.
    """
    from planner import load_calibration
    from planner.api import PlanOptions, plan_deployment, shape_counts_for_plan
    from planner.traffic import load_arrivals, simulate_plan
    from planner.traffic.bench import scale_for

    say = progress or (lambda _: None)
    names = list(MODELS) if models is None else models
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise UsageError(
            f"unknown model(s) {', '.join(unknown)} for bench shapes.",
            f"use any of {', '.join(MODELS)}.",
        )
    calibration = load_calibration()
    scale = scale_for(RATE_PER_S)
    arrivals = load_arrivals("azure-conv", scale=scale, hours=DAY_H)
    rows = []
    for name in names:
        spec = MODELS[name]
        started = time.perf_counter()
        say(f"{name}: its counts")
        if spec["real"]:
            manifest, counts = _real(name, spec, say)
        else:
            counts = shape_counts_for_plan(name, "zipf:1.0", tokens=TOKENS)
            manifest = counts.manifest
        say(f"{name}: planning every shape")
        planned = plan_deployment(
            manifest,
            counts,
            calibration,
            options=PlanOptions(concurrency_quota=concurrency_quota, confidence=0.0),
        )
        shapes = []
        for candidate in planned.summary["candidates"]:
            entry = dict(candidate)
            entry["per_million_tokens_usd"] = (
                None if candidate["bill_usd"] is None else candidate["bill_usd"] / TOKENS * 1e6
            )
            entry["stream"] = None
            shapes.append(entry)
        for entry in shapes:
            if not entry["feasible"]:
                continue
            say(f"{name}: a day at one request a minute, {entry['deployment']}")
            day = simulate_plan(planned.shapes[entry["deployment"]], arrivals)
            entry["stream"] = {
                "per_million_tokens_usd": day["bill_usd"]["per_million_tokens_usd"],
                "p99_s": day["latency_s"]["p99"],
                "cold_starts": day["cold_starts"]["count"],
                "refused_batches": day["refused_batches"],
            }
        feasible = [s for s in shapes if s["feasible"]]
        batch_winner = min(feasible, key=lambda s: s["bill_usd"])["deployment"]
        served = [s for s in feasible if s["stream"] and not s["stream"]["refused_batches"]]
        stream_winner = (
            min(served, key=lambda s: s["stream"]["per_million_tokens_usd"])["deployment"]
            if served
            else None
        )
        rows.append(
            {
                "model": name,
                "label": spec["label"],
                "params": _params(manifest),
                "weights_gb": sum(s.bytes for s in manifest.stages) / 1e9,
                "counts": counts.source,
                "shapes": shapes,
                "batch_winner": batch_winner,
                "stream_winner": stream_winner,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    return {
        "tokens": TOKENS,
        "stream": {"trace": "azure-conv", "rate_per_s": RATE_PER_S, "hours": DAY_H},
        "models": rows,
    }


def plot_shapes(path: Path, report: dict[str, Any], *, force: bool = False) -> str:
    """Bill per million tokens against the model's parameters, one marker per shape, the
    batch's winner ringed; log-log. Returns the file written."""
    import matplotlib

    from ground.files import write_file_atomically

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    markers = {"monolithic": "s", "driver": "D", "workflow": "o"}
    colours = {"monolithic": "tab:blue", "driver": "tab:orange", "workflow": "tab:green"}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for shape, marker in markers.items():
        xs, ys = [], []
        for row in report["models"]:
            for s in row["shapes"]:
                if s["deployment"] == shape and s["feasible"]:
                    xs.append(row["params"])
                    ys.append(s["per_million_tokens_usd"])
        ax.plot(xs, ys, marker=marker, color=colours[shape], label=shape, linestyle=":")
    for row in report["models"]:
        win = next(s for s in row["shapes"] if s["deployment"] == row["batch_winner"])
        ax.scatter(
            [row["params"]],
            [win["per_million_tokens_usd"]],
            s=260,
            facecolors="none",
            edgecolors="black",
            zorder=3,
        )
        ax.annotate(
            row["label"],
            (row["params"], win["per_million_tokens_usd"]),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=7,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.margins(x=0.12, y=0.15)
    ax.set_xlabel("model parameters")
    ax.set_ylabel(f"USD per million tokens ({report['tokens']:,}-token batch)")
    ax.set_title("Deployment shapes by model size (ringed: the cheapest)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        write_file_atomically(path, lambda tmp: fig.savefig(tmp, dpi=110), force=force)
    finally:
        plt.close(fig)
    return str(path)
