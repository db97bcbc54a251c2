"""Choose the MoEfication to serve: the cheapest option whose quality meets a floor.

MoEfication trades quality for cost: fewer experts per token (smaller k, more experts) spend
fewer FFN FLOPs and bill less, and serve a model further from the user's dense one. For each
option of a grid, this module measures the served model's quality against the dense model on
held-out text (`moe.quality_of`), profiles its routing on the user's corpus, predicts a batch's
expert popularity with the default predictor, and plans that batch with the exact solver (the
plan `moelambda plan --traces` makes). The answer is the cheapest option whose quality meets the
floor; the quality-vs-bill frontier shows what a stricter or looser floor would cost. A grid may
fit the same option on several texts (`MoefyOptions.fit_corpus`): an option fitted on the corpus
it is judged on (the user's requests) is preferred, whenever one keeps the floor, to a cheaper one
fitted elsewhere, since its quality was measured on documents of the text it serves.

The choice is a tuning decision, so it is made on the corpus's validation part; the quality
reported for each option (`quality`) is measured again on its test part, which no choice saw
(`moe._corpus.partition`). A chosen option can therefore report a test quality a little under
the floor it met on validation: that is the honest estimate of what it serves.

Every option is an independent measurement, so the choice is the minimum over the grid by
construction: a test checks it against a brute force of separate `quality` and `plan` runs.

`moelambda choose` is `check_choose`, `choose`, then `Selection.summary` and `write_selection`
(or `Selection.none_meets` when no option keeps the floor). Example::

    floor = check_choose(min_cosine=0.95)
    selection = choose("minilm", [moefy_options(8, 4, correction=True)], floor)
    summary = selection.summary("minilm", tokens=10240, slo_s=None)
    write_selection(Path("out/choose"), selection, summary)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ground.errors import InfeasibleError, UsageError

__all__ = [
    "Floor",
    "OptionResult",
    "Selection",
    "Skipped",
    "check_choose",
    "choose",
    "pareto_front",
    "write_selection",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Floor:
    """The quality the served model must keep: a least mean cosine (encoders) or a largest
    perplexity ratio (decoders), both against the dense model on held-out text."""

    metric: Literal["cosine_mean", "ppl_ratio"]
    value: float

    @property
    def higher_is_better(self) -> bool:
        return self.metric == "cosine_mean"

    def met(self, quality: dict[str, Any]) -> bool:
        got = quality.get(self.metric)
        if got is None:
            return False
        return got >= self.value if self.higher_is_better else got <= self.value

    def describe(self) -> str:
        sign = ">=" if self.higher_is_better else "<="
        return f"{self.metric} {sign} {self.value:g}"


@dataclass
class OptionResult:
    """One MoEfication of the grid: its quality, and the plan of its batch (if feasible)."""

    options: Any  # moe.MoefyOptions
    quality: dict[str, Any]  # on the test part: what is reported
    validation: dict[str, Any]  # on the validation part: what the floor is checked on
    bill_usd: float | None = None
    latency_s: float | None = None
    functions: int | None = None  # expert functions (none in a monolithic plan)
    deployment: str | None = None  # the plan's shape (`planner.deployments`)
    why: str | None = None  # why no plan meets the SLO
    plan: Any = None  # ground.plan.Plan
    meets_floor: bool = False
    convert_s: float | None = None  # measured where it was converted (`moe._meter`)
    convert_peak_rss_mib: float | None = None
    weights: str = "fp32"  # the precision it is served at (`ground.precision`)

    @property
    def label(self) -> str:
        """The MoEfication's label, and its precision when not float32."""
        base = self.options.label()
        return base if self.weights == "fp32" else f"{base} @ {self.weights}"

    @property
    def feasible(self) -> bool:
        return self.bill_usd is not None

    @property
    def fitted_on_judged_text(self) -> bool:
        """Fitted on the corpus it is judged and profiled on (the user's requests)."""
        sha = self.quality.get("fit_corpus_sha256")
        return sha is not None and sha == self.quality.get("corpus_sha256")

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "moefy": self.options.describe(),
            "weights": self.weights,
            "fitted_on_judged_text": self.fitted_on_judged_text,
            "quality": self.quality,
            "validation_quality": self.validation,
            "expert_flops_share": self.quality["expert_flops_share"],
            "bill_usd": self.bill_usd,
            "latency_s": self.latency_s,
            "functions": self.functions,
            "deployment": self.deployment,
            "feasible": self.feasible,
            "meets_floor": self.meets_floor,
            "why": self.why,
            "convert_s": self.convert_s,
            "convert_peak_rss_mib": self.convert_peak_rss_mib,
        }


@dataclass(frozen=True)
class Skipped:
    """An option of the grid left out because converting it would exceed the budget."""

    label: str
    convert_minutes: float
    measured: bool  # False: estimated before converting (`moe._meter.estimate_convert_s`)

    def describe(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "convert_minutes": round(self.convert_minutes, 1),
            "measured": self.measured,
        }


@dataclass
class Selection:
    """Every option's result, the frontier (indices, by bill) and the chosen one (or None)."""

    results: list[OptionResult]
    floor: Floor
    frontier: list[int] = field(default_factory=list)
    chosen: int | None = None
    skipped: list[Skipped] = field(default_factory=list)
    max_convert_minutes: float | None = None

    @classmethod
    def of(cls, results: list[OptionResult], floor: Floor) -> Selection:
        """The frontier of `results` (bill against validation quality) and the chosen one: the
        cheapest keeping `floor` among those fitted on the judged text if any keeps it, else
        among all (ties to the better quality)."""
        sign = 1.0 if floor.higher_is_better else -1.0
        bills = np.array([r.bill_usd if r.feasible else np.nan for r in results], dtype=float)
        scores = np.array([sign * float(r.validation[floor.metric]) for r in results])
        selection = cls(results, floor, frontier=pareto_front(bills, scores))
        eligible = [i for i, r in enumerate(results) if r.feasible and r.meets_floor]
        own = [i for i in eligible if results[i].fitted_on_judged_text]
        if eligible:
            selection.chosen = min(own or eligible, key=lambda i: (bills[i], -scores[i]))
        return selection

    def best_quality(self) -> OptionResult:
        """The option of best quality on the validation part, whatever its bill."""
        sign = 1.0 if self.floor.higher_is_better else -1.0
        return max(self.results, key=lambda r: sign * float(r.validation[self.floor.metric]))

    def summary(self, model: str, tokens: int, slo_s: float | None) -> dict[str, Any]:
        """What `moelambda choose --json` prints (without the output directory)."""
        chosen = self.chosen
        return {
            "model": model,
            "tokens": tokens,
            "slo_s": slo_s,
            "floor": {"metric": self.floor.metric, "value": self.floor.value},
            "chosen_on": "validation",
            "reported_on": "test",
            "options": [r.describe() for r in self.results],
            "frontier": self.frontier,
            "chosen": None if chosen is None else self.results[chosen].describe(),
            "chosen_index": chosen,
            "max_convert_minutes": self.max_convert_minutes,
            "skipped_for_convert_budget": [s.describe() for s in self.skipped],
        }

    def none_meets(self) -> InfeasibleError:
        """The error when no option was chosen: the best quality reached, and what to change."""
        best = self.best_quality()
        reached = best.validation[self.floor.metric]
        return InfeasibleError(
            f"no option of the grid meets {self.floor.describe()} on the validation text: the "
            "best reached is "
            f"{reached:.4f} ({best.label})"
            + ("." if best.feasible else f", which has no plan: {best.why}"),
            "loosen the floor, or widen the grid (more experts per token: --top-k, a shared "
            "expert: --shared, --correction on).",
        )


def pareto_front(bills: np.ndarray, quality: np.ndarray) -> list[int]:
    """Indices of the options no other option beats on both bill (lower) and quality (higher),
    in order of bill; NaN bills (no plan) are never on it."""
    ranked = np.lexsort((-np.asarray(quality, dtype=float), np.asarray(bills, dtype=float)))
    order = [int(i) for i in ranked if np.isfinite(bills[i])]
    front: list[int] = []
    best = -np.inf
    for i in order:
        if quality[i] > best:
            front.append(i)
            best = float(quality[i])
    return front


def _plan_option(
    model: Any,
    trace: Any,
    tokens: int,
    slo_s: float | None,
    calibration: Any,
    seed: int,
) -> Any:
    """The plan of the option's batch, as `moelambda plan --traces` makes it: every
    deployment shape weighed, the cheapest that meets the SLO kept."""
    from moe import describe_model
    from planner.api import PlanningCounts, PlanOptions, plan_deployment
    from predictor import DEFAULT_METHOD, predict_batch

    counts, batch = predict_batch(trace, tokens, seed=seed)
    source = {"choose": True, "method": DEFAULT_METHOD, "tokens": batch, "seed": seed}
    planned = plan_deployment(
        describe_model(model),
        PlanningCounts(counts, tokens, source),
        calibration,
        slo_s=slo_s,
        options=PlanOptions(concurrency_quota=None),
    )
    return planned.plan


def check_choose(
    *,
    min_cosine: float | None = None,
    max_ppl_ratio: float | None = None,
    tokens: int = 10240,
    quality_tokens: int = 16384,
    slo_s: float | None = None,
) -> Floor:
    """The floor of exactly one of `min_cosine` (encoders) and `max_ppl_ratio` (decoders),
    with the batch sizes and the SLO checked, before any model is loaded.

    Example::

        floor = check_choose(max_ppl_ratio=1.1, tokens=4096)
        selection = choose("smollm2", grid, floor, tokens=4096)

    Raises:
        UsageError: Neither or both floors, a floor out of range, a size or SLO not positive.
    """
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
    if slo_s is not None and not slo_s > 0:
        raise UsageError(f"--slo {slo_s} is not positive.", "pass a positive --slo.")
    if min_cosine is not None:
        return Floor("cosine_mean", min_cosine)
    return Floor("ppl_ratio", max_ppl_ratio)  # type: ignore[arg-type]


def choose(
    model: str,
    grid: list[Any],
    floor: Floor,
    *,
    corpus: str = "wiki",
    tokens: int = 10240,
    profile_tokens: int | None = None,
    quality_tokens: int = 16384,
    slo_s: float | None = None,
    calibration: Any = None,
    seed: int = 0,
    progress: Progress | None = None,
    max_convert_minutes: float | None = None,
    precisions: list[Any] | None = None,
) -> Selection:
    """Measure and plan every MoEfication of `grid` at every precision of `precisions`;
    choose the cheapest meeting `floor`.

    With `max_convert_minutes`, an option whose conversion takes longer (measured if it is
    cached, else estimated: `moe._meter.conversion_cost`) is skipped before it is converted,
    and named in `Selection.skipped`.

    Args:
        model: The dense model ("minilm", "smollm2" or a Hugging Face directory).
        grid: The `moe.MoefyOptions` to compare.
        floor: The quality the chosen option must keep.
        corpus: "wiki" or a text/JSONL file: the text quality and routing are measured on.
        tokens: Tokens per batch to plan for. Defaults to 10,240.
        profile_tokens: Tokens profiled for each option's popularity. Defaults to 4 x `tokens`.
        quality_tokens: Held-out tokens quality is measured on. Defaults to 16,384.
        slo_s: Latency SLO of one batch (None: the cheapest plan).
        calibration: A `planner.Calibration` (None: the packaged one).
        seed: Seeds the windows and the held-out batch.
        progress: Called with a short description before each slow step.
        max_convert_minutes: The conversion-time budget of an option (None: no budget).
        precisions: The weight precisions (`ground.precision.Weights`) each option is served
            at: one more grid dimension, each judged on its own quality (None: float32).

    Raises:
        UsageError: An empty grid, a model that is not MoEfied, a floor of the wrong kind, or
            a budget no option of the grid converts within.
    """
    from ground.precision import FP32
    from moe import (
        QUALITY_WINDOW,
        at_precision,
        check_precision,
        load_corpus,
        load_model,
        make_windows,
        quality_of,
    )
    from moe._meter import conversion_cost
    from moe._model import check_judged_text
    from moe._quality import check_held_out
    from planner.calibration import load_calibration
    from predictor import profile_windows

    if not grid:
        raise UsageError("the grid of options is empty.", "give at least one option.")
    precisions = [check_precision(p) for p in (precisions or [FP32])]
    check_held_out(corpus, quality_tokens, QUALITY_WINDOW, "--quality-tokens")
    for fitted in {options.fit_corpus: options for options in grid}.values():
        check_judged_text(model, fitted, corpus)  # no option is judged on text it fits on
    say = progress or (lambda _msg: None)
    calibration = calibration or load_calibration(None)
    text = load_corpus(corpus)
    profile_tokens = profile_tokens or 4 * tokens
    skipped = []
    if max_convert_minutes is not None:
        costs = [conversion_cost(model, options) for options in grid]
        skipped = [
            Skipped(options.label(), cost.minutes, cost.measured)
            for options, cost in zip(grid, costs, strict=True)
            if cost.minutes > max_convert_minutes
        ]
        grid = [
            options
            for options, cost in zip(grid, costs, strict=True)
            if cost.minutes <= max_convert_minutes
        ]
        if not grid:
            raise UsageError(
                f"no option of the grid converts within --max-convert-minutes "
                f"{max_convert_minutes:g}: the quickest, "
                f"{min(skipped, key=lambda s: s.convert_minutes).label}, takes about "
                f"{min(s.convert_minutes for s in skipped):.0f} minutes.",
                "raise --max-convert-minutes, or add quicker options (fewer --fit-tokens, "
                "--local-steps or --distil-steps).",
            )
    results = []
    cells = [(options, weights) for options in grid for weights in precisions]
    loaded: tuple[Any, Any] | None = None  # (options, the float32 model): one load per option
    for number, (options, weights) in enumerate(cells, start=1):
        at = "" if weights.is_fp32 else f" @ {weights.label()}"
        label = f"[{number}/{len(cells)}] {options.label()}{at}"
        if loaded is None or loaded[0] is not options:
            say(f"{label}: MoEfying (cached after the first time)")
            loaded = (
                options,
                load_model(model, options=options, progress=lambda m, lb=label: say(f"{lb}: {m}")),
            )
        moe_model = at_precision(loaded[1], weights)
        say(f"{label}: quality against the dense model (validation and test text)")
        validation, _ = quality_of(
            moe_model, corpus=corpus, tokens=quality_tokens, seed=seed, split="validation"
        )
        quality, _ = quality_of(moe_model, corpus=corpus, tokens=quality_tokens, seed=seed)
        if getattr(quality, floor.metric) is None:
            kind = "an encoder" if quality.kind == "encoder" else "a decoder"
            raise UsageError(
                f"{model} is {kind}: {floor.metric} is not measured for it.",
                "use --min-cosine for encoders and --max-ppl-ratio for decoders.",
            )
        say(f"{label}: profiling {profile_tokens:,} tokens")
        windows = make_windows(
            text, moe_model.tokenizer, tokens=profile_tokens, window=128, seed=seed
        )
        trace = profile_windows(
            moe_model, windows, tokens=profile_tokens, meta={"window": 128}
        ).trace
        # The model's options pin the hash of the text it was fitted on.
        fitted = moe_model.options or options
        stored = loaded[1].quality or {}  # recorded at conversion, in the cached model's block
        result = OptionResult(
            fitted,
            quality.model_dump(),
            validation.model_dump(),
            convert_s=stored.get("convert_s"),
            convert_peak_rss_mib=stored.get("convert_peak_rss_mib"),
            weights=weights.label(),
        )
        result.meets_floor = floor.met(result.validation)
        say(f"{label}: planning")
        try:
            plan = _plan_option(moe_model, trace, tokens, slo_s, calibration, seed)
        except InfeasibleError as error:
            result.why = error.problem
        else:
            result.plan = plan
            result.bill_usd = float(plan.totals.bill_usd["total_usd"])
            result.latency_s = float(plan.totals.latency_s)
            result.functions = sum(len(layer.experts) for layer in plan.layers)
            result.deployment = plan.deployment
        results.append(result)
    selection = Selection.of(results, floor)
    selection.skipped = skipped
    selection.max_convert_minutes = max_convert_minutes
    return selection


def write_selection(
    out: Path, selection: Selection, summary: dict[str, Any], *, force: bool = False
) -> None:
    """Write the directory `out` atomically: plan.json of the chosen option, choose.json (the
    summary) and choose.png (quality against the bill, the frontier, the floor, the choice).

    Example::

        summary = selection.summary("minilm", 10240, None)
        write_selection(Path("out/choose"), selection, summary, force=True)
    """
    from ground.files import write_atomically

    chosen = selection.results[selection.chosen]

    def write(tmp: Path) -> None:
        chosen.plan.save(tmp / "plan.json")
        (tmp / "choose.json").write_text(json.dumps(summary, indent=2) + "\n")
        _plot(tmp / "choose.png", selection)

    write_atomically(out, write, force=force)


def _plot(path: Path, selection: Selection) -> None:
    """Validation quality (what the choice is made on) against bill per batch: every feasible
    option, the frontier, the floor, the chosen point."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = selection.floor.metric
    feasible = [r for r in selection.results if r.feasible]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.scatter(
        [r.bill_usd * 1e6 for r in feasible],
        [r.validation[metric] for r in feasible],
        color="tab:blue",
        label="options",
    )
    for r in feasible:
        ax.annotate(r.label, (r.bill_usd * 1e6, r.validation[metric]), fontsize=7)
    front = [selection.results[i] for i in selection.frontier]
    ax.plot(
        [r.bill_usd * 1e6 for r in front],
        [r.validation[metric] for r in front],
        color="tab:blue",
        alpha=0.5,
        label="frontier",
    )
    ax.axhline(selection.floor.value, color="tab:red", linestyle="--", label="floor")
    chosen = selection.results[selection.chosen]
    ax.scatter(
        [chosen.bill_usd * 1e6],
        [chosen.validation[metric]],
        marker="*",
        s=250,
        color="tab:orange",
        label=f"chosen: {chosen.label}",
        zorder=3,
    )
    ax.set_xlabel("bill per batch (µ$)")
    ax.set_ylabel(metric.replace("_", " ") + " against dense (validation text)")
    ax.margins(x=0.15, y=0.1)  # room for the labels of the outermost points
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
