"""Backtest: plans made from a profile, served on held-out batches they were not made for.

The trace's windows are split once: a pool of held-out windows, and the rest, on which the
predictor is fitted and its model error measured (on batches held out of the rest, so the pool
is never seen). Each backtest batch is `tokens` tokens of whole windows drawn from the pool
(batches overlap one another when the pool is small; `pool_tokens` says how large it is). Per
batch, each policy makes its plan and the serving simulator (`planner.serving.serve`) serves
the batch's real routing on it:

* point: the exact solver's plan of the predicted counts;
* confidence: the plan meeting the SLO with probability Q (`planner.confidence`);
* oracle: the exact solver's plan of the real counts (never misses the SLO: a lower bound);
* lambdaml: LambdaML's configuration (`planner.baselines.lambdaml`) of the predicted counts.

A batch attains the SLO when its served latency is within it and no expert was refused; a
policy with no plan within the SLO for a batch misses it.

`backtest_plans` is what `moelambda backtest` does, from the trace, the model's manifest and
the calibration; `plot_backtest` draws its confidence sweep. Example::

    trace = RoutingTrace.load("out/profile")
    summary = backtest_plans(trace, manifest, load_calibration(), batches=10, plot_sweep=True)
    plot_backtest(Path("out/backtest.png"), summary)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.errors import InfeasibleError, UsageError
from planner.baselines import lambdaml
from planner.confidence import CountDistribution, plan_with_confidence, with_counts
from planner.costmodel import Solution
from planner.exact import solve_exact, solve_frontier
from planner.instance import Instance
from planner.serving import serve
from predictor import RoutingTrace, build_tables, evaluate_methods, make_predictor, split_windows
from predictor._uncertainty import ErrorModel

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from planner.calibration import Calibration

__all__ = [
    "POLICIES",
    "SWEEP",
    "Backtest",
    "PolicyResult",
    "backtest",
    "backtest_plans",
    "check_backtest",
    "plot_backtest",
    "split_pool",
]

POLICIES = ("point", "confidence", "oracle", "lambdaml")
_ERROR_BATCHES = 8  # held-out batches of the profile part the model error is measured on
SWEEP = (0.0, 0.5, 0.9, 0.95, 0.99, 0.999)  # the levels Q a plot of the sweep draws


@dataclass(frozen=True)
class PolicyResult:
    """One policy over every batch: served latency and cost, None where it had no plan."""

    latency_s: tuple[float | None, ...]
    cost_usd: tuple[float | None, ...]
    met: tuple[bool, ...]

    def summary(self, oracle_cost: float) -> dict[str, float | int | None]:
        costs = [c for c in self.cost_usd if c is not None]
        latencies = [t for t in self.latency_s if t is not None]
        mean_cost = float(np.mean(costs)) if costs else None
        return {
            "slo_attainment": round(float(np.mean(self.met)), 4),
            "mean_cost_usd": mean_cost,
            "cost_vs_oracle": None if mean_cost is None else round(mean_cost / oracle_cost, 4),
            "p99_latency_s": round(float(np.quantile(latencies, 0.99)), 4) if latencies else None,
            "no_plan": sum(c is None for c in self.cost_usd),
        }


@dataclass(frozen=True)
class Backtest:
    slo_s: float
    tokens: int
    batches: int
    pool_tokens: int
    profile_tokens: int
    confidence: float
    policies: dict[str, PolicyResult]
    sweep: dict[float, PolicyResult]  # the confidence policy at other levels Q

    def summary(self) -> dict[str, object]:
        oracle = self.policies["oracle"].cost_usd
        oracle_cost = float(np.mean([c for c in oracle if c is not None]))
        sweep = {f"{q:g}": r.summary(oracle_cost) for q, r in sorted(self.sweep.items())}
        return {
            "slo_s": self.slo_s,
            "tokens": self.tokens,
            "batches": self.batches,
            "pool_tokens": self.pool_tokens,
            "profile_tokens": self.profile_tokens,
            "confidence": self.confidence,
            "policies": {name: r.summary(oracle_cost) for name, r in self.policies.items()},
            "confidence_sweep": sweep,
        }


def split_pool(
    trace: RoutingTrace, tokens: int, pool_share: float, seed: int
) -> tuple[RoutingTrace, np.ndarray]:
    """(the profile part, the pool's window ids): a random `pool_share` of the windows, at
    least one batch's worth, held out; the rest must hold two batches' worth or more."""
    windows = np.unique(trace.window_ids)
    window = int(trace.meta.get("window", 128))
    if tokens % window or tokens < window:
        raise UsageError(
            f"--tokens {tokens} is not a whole number of {window}-token windows.",
            f"pass a multiple of {window}, e.g. {max(window, tokens // window * window)}.",
        )
    per_batch = tokens // window
    pooled = max(per_batch, int(round(windows.size * pool_share)))
    if windows.size - pooled < 2 * per_batch:
        raise UsageError(
            f"the trace holds {trace.num_tokens:,} tokens: too few to hold out a pool of "
            f"{pooled * window:,} and still profile on two batches of {tokens:,}.",
            f"profile more tokens (`moelambda profile --tokens {4 * tokens}` or more) or pass "
            "a smaller --tokens.",
        )
    rng = np.random.default_rng(seed)
    pool = rng.choice(windows, size=pooled, replace=False)
    return trace.select_windows(np.setdiff1d(windows, pool)), pool


def _batches(
    trace: RoutingTrace, pool: np.ndarray, per_batch: int, count: int, seed: int
) -> Iterator[RoutingTrace]:
    rng = np.random.default_rng(seed + 1)
    for _ in range(count):
        yield trace.select_windows(rng.choice(pool, size=per_batch, replace=False))


def _error_model(profile: RoutingTrace, method: str, tokens: int, seed: int) -> ErrorModel:
    """The predictor's model error, measured on batches held out of the profile part."""
    splits = split_windows(profile, eval_tokens=tokens, repeats=_ERROR_BATCHES, seed=seed + 2)
    return evaluate_methods(splits, [method]).scores[method].error_model()


def _served(
    plan: tuple[Instance, Solution] | None, real: np.ndarray, slo_s: float
) -> tuple[float | None, float | None, bool]:
    if plan is None:
        return None, None, False
    run = serve(plan[0], plan[1].choice, real)
    return run.latency, run.cost, bool(run.latency <= slo_s * (1 + 1e-9) and not run.failed.any())


def backtest(
    trace: RoutingTrace,
    instance: Callable[[np.ndarray, int], Instance],
    *,
    tokens: int,
    batches: int,
    slo_s: float | None,
    confidence: float,
    method: str,
    sweep: tuple[float, ...] = (),
    seed: int = 0,
    pool_share: float = 0.3,
    on_batch: Callable[[int], None] | None = None,
) -> Backtest:
    """Plan and serve `batches` held-out batches with every policy (module docstring).

    Args:
        instance: The planning instance of given counts for a batch of given tokens.
        slo_s: None takes the midpoint of the fastest and the cheapest deployment of the
            first batch's predicted counts (the bench's "medium" SLO).
        confidence: Q of the confidence policy; 0 makes it the point plan.
        sweep: Other levels Q to run the confidence policy at (for a plot); 0 is the point
            plan.
    """
    profile, pool = split_pool(trace, tokens, pool_share, seed)
    predictor = make_predictor(method).fit(build_tables(profile), profile)
    error = _error_model(profile, method, tokens, seed)
    window = int(trace.meta.get("window", 128))
    results: dict[str, list[tuple[float | None, float | None, bool]]] = {p: [] for p in POLICIES}
    swept: dict[float, list[tuple[float | None, float | None, bool]]] = {q: [] for q in sweep}
    for index, batch in enumerate(_batches(trace, pool, tokens // window, batches, seed)):
        prediction = predictor.predict(batch)
        real = batch.popularity().astype(float)
        mean = prediction.counts
        predicted = instance(mean, tokens)
        if slo_s is None:
            frontier = solve_frontier(predicted)
            slo_s = (frontier.best(None).latency + frontier.min_latency()) / 2
        std = error.std(mean, prediction.variance)
        dist = CountDistribution(mean, std, tokens, error.z)
        plans: dict[str, tuple[Instance, Solution] | None] = {}
        point = solve_exact(predicted, slo_s)
        plans["point"] = None if point is None else (predicted, point)
        for q in {confidence, *sweep}:
            plan = (
                plans["point"] if q == 0 else _confident(predicted, dist, q, slo_s, seed + index)
            )
            if q == confidence:
                plans["confidence"] = plan
            if q in sweep:
                swept[q].append(_served(plan, real, slo_s))
        truth = with_counts(predicted, real)
        oracle = solve_exact(truth, slo_s)
        if oracle is None and index == 0:
            # Even the batch's real counts have no plan: the SLO is below what any deployment
            # of this model reaches, and every policy would fail every batch.
            fastest = solve_frontier(truth).min_latency()
            raise InfeasibleError(
                f"no deployment meets the SLO of {slo_s:.3f} s, even planned from a held-out "
                f"batch's real counts: the fastest takes {fastest:.3f} s.",
                f"pass --slo {math.ceil(fastest * 1000) / 1000:.3f} or more, or leave --slo out "
                "(the midpoint of the fastest and the cheapest deployment).",
            )
        plans["oracle"] = None if oracle is None else (truth, oracle)
        baseline = lambdaml(predicted, slo_s)
        plans["lambdaml"] = None if baseline is None else (predicted, baseline)
        for name in POLICIES:
            results[name].append(_served(plans[name], real, slo_s))
        if on_batch is not None:
            on_batch(index + 1)
    assert slo_s is not None
    return Backtest(
        slo_s,
        tokens,
        batches,
        int(pool.size * window),
        profile.num_tokens,
        confidence,
        {name: _result(rows) for name, rows in results.items()},
        {q: _result(rows) for q, rows in swept.items()},
    )


def _result(rows: list[tuple[float | None, float | None, bool]]) -> PolicyResult:
    return PolicyResult(
        tuple(r[0] for r in rows), tuple(r[1] for r in rows), tuple(r[2] for r in rows)
    )


def _confident(
    predicted: Instance, dist: CountDistribution, q: float, slo_s: float, seed: int
) -> tuple[Instance, Solution] | None:
    try:
        confident = plan_with_confidence(
            dist,
            q,
            slo_s,
            lambda counts: with_counts(predicted, counts),
            lambda inst: solve_exact(inst, slo_s),
            seed=seed,
        )
    except InfeasibleError:
        return None
    return confident.inst, confident.solution


def check_backtest(
    *, batches: int, confidence: float, slo_s: float | None, method: str | None
) -> str:
    """Refuse a backtest that cannot run, before the trace or the model is loaded.

    Returns:
        The prediction method: `method`, or the planner's default.
    """
    from predictor import DEFAULT_METHOD

    if batches < 1:
        raise UsageError(f"--batches {batches} is not positive.", "pass --batches 1 or more.")
    if not 0.0 <= confidence < 1.0:
        raise UsageError(f"--confidence {confidence:g} is not in [0, 1).", "pass e.g. 0.99.")
    if slo_s is not None and slo_s <= 0:
        raise UsageError(f"--slo {slo_s:g} is not positive.", "pass the SLO in seconds.")
    method = method or DEFAULT_METHOD
    make_predictor(method)  # an unknown name fails here, before the work
    return method


def backtest_plans(
    trace: RoutingTrace,
    manifest: Manifest,
    calibration: Calibration,
    *,
    tokens: int = 10240,
    batches: int = 50,
    slo_s: float | None = None,
    confidence: float = 0.99,
    method: str | None = None,
    plot_sweep: bool = False,
    seed: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Serve held-out batches on plans made from a profile: point, confidence, oracle, LambdaML.

    What `moelambda backtest` does: `backtest` with the planning instances of the model the
    trace was recorded on.

    Example::

        summary = backtest_plans(trace, manifest, load_calibration(), batches=10)
        print(summary["policies"]["confidence"]["slo_attainment"])

    Args:
        trace: The routing trace (`moelambda profile`).
        manifest: The manifest of the model the trace was recorded on.
        calibration: The platform's parameters.
        tokens: Tokens per batch (whole windows).
        batches: Held-out batches to serve.
        slo_s: Latency SLO of one batch (None: as `backtest` chooses it).
        confidence: Q of the confidence policy (0: the point plan).
        seed: Seeds the pool and the batches.
        on_batch: Called with the number of batches served so far.
        method: The prediction method. Defaults to None (the planner's).
        plot_sweep: Also run the confidence policy at every level of `SWEEP` (for
            `plot_backtest`). Defaults to False.

    Returns:
        `Backtest.summary()` with the predictor and the trace's corpus: what `--json` prints.
    """
    from planner.build import instance_for

    method = check_backtest(batches=batches, confidence=confidence, slo_s=slo_s, method=method)

    def instance(counts: Any, batch_tokens: int) -> Any:
        return instance_for(manifest, counts, calibration, tokens=batch_tokens)

    result = backtest(
        trace,
        instance,
        tokens=tokens,
        batches=batches,
        slo_s=slo_s,
        confidence=confidence,
        method=method,
        sweep=tuple(sorted({*SWEEP, confidence})) if plot_sweep else (),
        seed=seed,
        on_batch=on_batch,
    )
    summary = result.summary()
    summary["predictor"] = method
    summary["corpus"] = trace.meta.get("corpus")
    return summary


def plot_backtest(path: Path, summary: dict[str, Any], *, force: bool = False) -> Path:
    """SLO attainment and cost over the oracle's against the confidence level Q, from the
    summary of `backtest_plans(..., plot_sweep=True)`, as a PNG at `path`.

    Example::

        summary = backtest_plans(trace, manifest, cal, plot_sweep=True)
        plot_backtest(Path("out/backtest.png"), summary)

    Raises:
        InfeasibleError: No level of the sweep has a plan at the SLO.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ground.files import write_file_atomically

    sweep = summary["confidence_sweep"]
    levels = [float(q) for q in sweep]
    attained = [sweep[q]["slo_attainment"] for q in sweep]
    cost = [sweep[q]["cost_vs_oracle"] for q in sweep]
    if all(c is None for c in cost):
        raise InfeasibleError(
            f"no confidence level of the sweep has a plan at the SLO of {summary['slo_s']:.3f} "
            "s: the plot would show nothing.",
            "pass a larger --slo (or leave it out), or leave --plot out.",
        )
    fig, left = plt.subplots(figsize=(7, 4))
    xs = range(len(levels))
    left.plot(xs, attained, "o-", color="tab:blue", label="SLO attainment")
    left.set_ylabel("SLO attainment", color="tab:blue")
    left.set_xticks(list(xs), [f"{q:g}" for q in levels])
    left.set_xlabel("confidence Q (0: point plan)")
    right = left.twinx()
    right.plot(xs, cost, "s--", color="tab:red", label="cost / oracle")
    right.set_ylabel("mean cost / oracle's", color="tab:red")
    left.set_title(
        f"{summary['batches']} held-out batches of {summary['tokens']:,} tokens, "
        f"SLO {summary['slo_s']:.3f} s"
    )
    fig.tight_layout()
    write_file_atomically(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120), force=force)
    plt.close(fig)
    return path
