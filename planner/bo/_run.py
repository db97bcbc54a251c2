"""The BO experiment of the paper's §V-E: tune on learning batches, test on held-out ones.

A trace is cut into whole windows (requests): `learn_batches` batches of `tokens` tokens to learn
on, a held-out pool the test batches are drawn from, and the rest to profile (build Omega). Every
method starts from the same trial (the pairs of Omega written with the values they already have,
i.e. the untuned predictor) and runs until the stopping rule or the iteration budget; its best
adjustment then predicts every test batch, which is planned and served on its real routing.
The oracle plans each test batch from its real counts; LambdaML runs every expert at 3,008 MB
(the nearest option) with one replica and the cheapest method that fits the real batch.

The saving against LambdaML is reported twice (`saving_vs_lambdaml`): on the full bill (every
function, request, S3 access and the workflow: what the plans minimise) and on the expert
functions' GB-seconds alone, the cost the paper reports its saving on (its -43.41 %); only the
second is comparable with the paper's figure.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna

from ground.errors import UsageError
from ground.manifest import Manifest
from planner.baselines import lambdaml
from planner.bo._objective import Planner, ServingObjective
from planner.bo._sampler import (
    Converged,
    EpsilonGreedy,
    EpsilonGreedySampler,
    adjustment_of,
    pair_params,
)
from planner.build import instance_for
from planner.calibration import Calibration
from planner.costmodel import Solution
from planner.exact import solve_bounded
from planner.instance import Instance
from planner.serving import Served, serve
from predictor import RoutingTrace, build_tables, make_predictor
from predictor._adjust import AdjustableBatch, Adjustment

__all__ = [
    "BO_METHODS",
    "BoSettings",
    "Split",
    "mean_costs",
    "run_bo",
    "saving_vs",
    "split_for_bo",
    "tune",
]

BO_METHODS = ("multi-eps", "single-eps", "random", "tpe", "none")
# The default SLO: this much above the fastest plan of the learning batches' real counts. Tight
# enough that replicas and memory depend on the predicted popularity; with a loose SLO every
# expert gets its cheapest memory and no replica, whatever is predicted, and BO has no work.
DEFAULT_SLO_FACTOR = 1.1


@dataclass(frozen=True)
class Split:
    """Windows for profiling, learning and testing, none shared between the three."""

    profile: RoutingTrace
    learn: list[RoutingTrace]
    test: list[RoutingTrace]
    test_disjoint: bool  # False: test batches were drawn from a pool smaller than all of them


def split_for_bo(
    trace: RoutingTrace, *, tokens: int, learn_batches: int, test_batches: int, seed: int
) -> Split:
    """Cut `trace` into profile, learning and test windows (module docstring).

    The test pool takes as many windows as `test_batches` disjoint batches need, but at most a
    quarter of the trace; when that is less, each test batch is a random draw from the pool.

    Raises:
        UsageError: The trace cannot hold the batches and still profile on at least as many
            tokens as it learns and tests on.
    """
    window = int(trace.meta.get("window", 128))
    if tokens < window or tokens % window:
        raise UsageError(
            f"--tokens {tokens} is not a whole number of {window}-token windows.",
            f"pass a multiple of {window}, e.g. {max(1, tokens // window) * window}.",
        )
    per_batch = tokens // window
    windows = np.unique(trace.window_ids)
    rng = np.random.default_rng(seed)
    rng.shuffle(windows)
    learn_n = learn_batches * per_batch
    pool_n = min(test_batches * per_batch, max(per_batch, windows.size // 4))
    if windows.size - learn_n - pool_n < learn_n + pool_n:
        need = 2 * (learn_n + per_batch) * window
        raise UsageError(
            f"the trace holds {trace.num_tokens:,} tokens: too few to learn on "
            f"{learn_batches} and test on held-out batches of {tokens:,} tokens and still "
            "profile on at least as many.",
            f"profile at least {need:,} tokens (e.g. `moelambda profile --tokens "
            f"{max(need, 102400)}`), or pass a smaller --tokens.",
        )
    learn_w, pool, rest = np.split(windows, [learn_n, learn_n + pool_n])
    learn = [trace.select_windows(b) for b in np.split(learn_w, learn_batches)]
    disjoint = pool.size >= test_batches * per_batch
    if disjoint:
        test = [trace.select_windows(b) for b in np.split(pool, test_batches)]
    else:
        test = [
            trace.select_windows(rng.choice(pool, per_batch, replace=False))
            for _ in range(test_batches)
        ]
    return Split(trace.select_windows(rest), learn, test, disjoint)


@dataclass
class Tuned:
    """One method's search: its best adjustment and how the search went."""

    name: str
    adjustment: Adjustment
    iterations: int
    seconds: float
    converged_at: int | None
    converged_s: float | None
    best: list[float] = field(default_factory=list)  # running best objective per iteration
    elapsed: list[float] = field(default_factory=list)  # seconds since the start, per iteration


def _sampler(
    name: str,
    objective: ServingObjective,
    learn: Sequence[RoutingTrace],
    seed: int,
) -> optuna.samplers.BaseSampler:
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    config = dataclasses.replace(objective.config, per_dimension=name == "multi-eps")
    occurrences = [(b.token_ids, b.position_ids) for b in learn]
    space = objective.batches[0].space
    return EpsilonGreedySampler(space, occurrences, config, embed=objective.embed, seed=seed)


def start_pairs(
    objective: ServingObjective, learn: Sequence[RoutingTrace], seed: int
) -> Adjustment:
    """The first trial of every method: the untuned predictor, as Q pairs that change nothing.

    Keys of the learning tokens written with the counts they already hold (only keys whose
    count is within 0..value_max can be), topped up with keys of random tokens if too few.
    """
    q, top = objective.config.q, objective.config.value_max
    space = objective.batches[0].space
    rng = np.random.default_rng(seed)
    tokens = np.concatenate([b.token_ids for b in learn]).astype(np.int64)
    positions = np.concatenate([b.position_ids for b in learn]).astype(np.int64)
    keys, values = np.zeros(0, dtype=np.int64), np.zeros(0)
    for attempt in range(8):
        n = 4 * q
        pick = rng.integers(0, tokens.size, n)
        token = tokens[pick] if attempt < 4 else rng.integers(0, space.vocab, n)
        position = positions[pick] if space.positions > 1 else np.zeros(n, dtype=np.int64)
        drawn = space.pack(
            rng.integers(0, space.layers, n), token, position, rng.integers(0, space.experts, n)
        )
        held = objective.batches[0].current_values(drawn)
        keys, values = np.r_[keys, drawn[held <= top]][:q], np.r_[values, held[held <= top]][:q]
        if keys.size == q:
            break
    else:
        raise UsageError(
            f"could not find {q} keys whose counts are at most --value-max {top}.",
            "raise --value-max or lower --q.",
        )
    return Adjustment(keys, values)


def tune(
    name: str,
    objective: ServingObjective,
    learn: Sequence[RoutingTrace],
    *,
    iterations: int,
    patience: int,
    tolerance: float,
    seed: int,
    on_trial: Callable[[str, int, float], None] | None = None,
) -> Tuned:
    """Run one method's search with optuna (the untuned start, then `iterations` - 1 more)."""
    if name == "none":
        return Tuned(name, Adjustment.empty(), 0, 0.0, 0, 0.0)
    start = start_pairs(objective, learn, seed)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(sampler=_sampler(name, objective, learn, seed))
    q = objective.config.q
    study.enqueue_trial(pair_params(start, objective.config.value_max))
    stop = Converged(patience, tolerance)
    began = time.perf_counter()
    elapsed: list[float] = []

    def record(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        stop(study, trial)
        elapsed.append(time.perf_counter() - began)
        if on_trial is not None and stop.best:
            on_trial(name, len(elapsed), stop.best[-1])

    study.optimize(objective, n_trials=iterations, callbacks=[record])
    seconds = time.perf_counter() - began
    done = len(elapsed)
    best = adjustment_of(study.best_trial.params, q, objective.config.value_max)
    at = stop.at
    return Tuned(
        name,
        best,
        done,
        seconds,
        at,
        None if at is None else elapsed[at - 1],
        stop.best,
        elapsed,
    )


@dataclass(frozen=True)
class BoSettings:
    """What `run_bo` needs besides the trace (CLI defaults)."""

    tokens: int = 10240
    learn_batches: int = 1
    test_batches: int = 20
    iterations: int = 100
    patience: int = 20  # λ
    tolerance: float = 1e-3  # ζ, relative
    alpha: float = 64.0
    slo_s: float | None = None  # None: DEFAULT_SLO_FACTOR x the fastest learning-batch plan
    predictor: str = "bayes-pos-soft"
    seed: int = 0
    methods: tuple[str, ...] = BO_METHODS
    config: EpsilonGreedy = field(default_factory=EpsilonGreedy)


def _plan(planner: Planner, counts: np.ndarray, what: str) -> tuple[Instance, Solution]:
    """The plan of `counts`, or a UsageError naming `what` could not meet the SLO."""
    inst, solution = planner(counts)
    if solution is None:
        raise UsageError(
            f"no plan meets the SLO of {planner.slo_s:.3f} s for {what}.", "pass a larger --slo."
        )
    return inst, solution


def mean_costs(runs: Sequence[Served]) -> dict[str, float]:
    """Mean cost per batch of served batches: the full bill (the plan's objective, as the
    planner prices it) and the expert functions' GB-seconds alone (the paper's objective)."""
    return {
        "full_bill": float(np.mean([r.cost for r in runs])),
        "experts": float(np.mean([r.evaluation.experts_usd for r in runs])),
    }


def saving_vs(costs: dict[str, float], baseline: dict[str, float]) -> dict[str, float]:
    """1 - cost / baseline's, on the full bill and on the expert functions alone."""
    return {bill: round(1 - costs[bill] / baseline[bill], 6) for bill in ("full_bill", "experts")}


def _held_out(
    adjustment: Adjustment,
    tests: Sequence[AdjustableBatch],
    reals: Sequence[np.ndarray],
    planner: Planner,
    alpha: float,
) -> dict[str, Any]:
    runs, latencies, mad, late, overrun = [], [], [], 0, []
    for batch, real in zip(tests, reals, strict=True):
        counts = batch.counts(adjustment)
        inst, solution = _plan(planner, counts, "a test batch's prediction")
        run = serve(inst, solution.choice, real, alpha=alpha)
        runs.append(run)
        latencies.append(run.latency)
        mad.append(float(np.abs(real - counts).mean()))
        if planner.slo_s is not None:
            late += run.latency > planner.slo_s * (1 + 1e-9)
            overrun.append(max(0.0, run.latency / planner.slo_s - 1))
    costs = mean_costs(runs)
    return {
        "final_cost_usd": costs["full_bill"],
        "experts_cost_usd": costs["experts"],
        "prediction_mad": round(float(np.mean(mad)), 3),
        "latency_s": float(np.mean(latencies)),
        "slo_violations": int(late),
        "mean_slo_overrun": round(float(np.mean(overrun)), 6) if overrun else 0.0,
    }


def run_bo(
    trace: RoutingTrace,
    manifest: Manifest,
    calibration: Calibration,
    settings: BoSettings,
    *,
    on_trial: Callable[[str, int, float], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Tuned]]:
    """Tune the predictor with every method, test each on held-out batches (module docstring).

    Returns:
        The report `moelambda bo --json` prints, and every method's search (for the plot).
    """
    s = settings
    unknown = [m for m in s.methods if m not in BO_METHODS]
    if unknown:
        raise UsageError(
            f"unknown BO method(s): {', '.join(unknown)}.", f"use {', '.join(BO_METHODS)}."
        )
    split = split_for_bo(
        trace,
        tokens=s.tokens,
        learn_batches=s.learn_batches,
        test_batches=s.test_batches,
        seed=s.seed,
    )
    started = time.perf_counter()
    predictor = make_predictor(s.predictor).fit(build_tables(split.profile), split.profile)
    profile_s = time.perf_counter() - started
    learn = [AdjustableBatch(predictor, b) for b in split.learn]
    tests = [AdjustableBatch(predictor, b) for b in split.test]
    learn_real = [b.popularity().astype(float) for b in split.learn]
    test_real = [b.popularity().astype(float) for b in split.test]
    slo_s = s.slo_s
    if slo_s is None:
        fastest = [
            solve_bounded(
                instance_for(manifest, real, calibration, tokens=s.tokens), None
            ).min_latency()
            for real in learn_real
        ]
        slo_s = DEFAULT_SLO_FACTOR * max(fastest)
    planner = Planner(manifest, calibration, s.tokens, slo_s)
    objective = ServingObjective(learn, learn_real, planner, s.config, alpha=s.alpha, slo_s=slo_s)
    learn_oracle = []
    for real in learn_real:
        best = _plan(planner, real, "the real counts of a learning batch")[1]
        learn_oracle.append(best.cost)
    searches = {
        name: tune(
            name,
            objective,
            split.learn,
            iterations=s.iterations,
            patience=s.patience,
            tolerance=s.tolerance,
            seed=s.seed,
            on_trial=on_trial,
        )
        for name in s.methods
    }
    oracle_cost, oracle_latency, lm_runs, lm_latency = [], [], [], []
    for real in test_real:
        inst, best = _plan(planner, real, "the real counts of a test batch")
        oracle_cost.append(best.cost)
        oracle_latency.append(best.latency)
        lm = lambdaml(inst, None)
        assert lm is not None, "LambdaML fits every batch the oracle fits"
        run = serve(inst, lm.choice, real, alpha=s.alpha)
        lm_runs.append(run)
        lm_latency.append(run.latency)
    lambdaml_costs = mean_costs(lm_runs)
    oracle = float(np.mean(oracle_cost))
    methods: dict[str, Any] = {}
    throughput = {}
    for name, search in searches.items():
        held = _held_out(search.adjustment, tests, test_real, planner, s.alpha)
        initial = search.best[0] if search.best else None
        methods[name] = {
            **held,
            "iterations": search.iterations,
            "seconds_per_iteration": (
                round(search.seconds / search.iterations, 4) if search.iterations else 0.0
            ),
            "converged_at": search.converged_at,
            "converged_s": None if search.converged_s is None else round(search.converged_s, 3),
            "learn_cost_usd": None if not search.best else search.best[-1],
            "learn_improvement": (
                None if initial is None else round(1 - search.best[-1] / initial, 6)
            ),
            "cost_vs_oracle": round(held["final_cost_usd"] / oracle, 6),
            "saving_vs_lambdaml": saving_vs(
                {"full_bill": held["final_cost_usd"], "experts": held["experts_cost_usd"]},
                lambdaml_costs,
            ),
        }
        throughput[name] = s.tokens / held["latency_s"]
    throughput["oracle"] = s.tokens / float(np.mean(oracle_latency))
    throughput["lambdaml"] = s.tokens / float(np.mean(lm_latency))
    for name in searches:
        methods[name]["throughput_loss_vs_lambdaml"] = round(
            1 - throughput[name] / throughput["lambdaml"], 6
        )
    report = {
        "methods": methods,
        "oracle_cost_usd": oracle,
        "lambdaml_cost_usd": lambdaml_costs["full_bill"],
        "lambdaml_experts_cost_usd": lambdaml_costs["experts"],
        "learn_oracle_cost_usd": float(np.mean(learn_oracle)),
        "throughput_tokens_per_s": {k: round(v, 1) for k, v in throughput.items()},
        "slo_s": round(slo_s, 6),
        "setup": {
            "model": manifest.model,
            "experts": manifest.experts,
            "top_k": manifest.top_k,
            "predictor": s.predictor,
            "tokens": s.tokens,
            "learn_batches": s.learn_batches,
            "test_batches": s.test_batches,
            "test_batches_disjoint": split.test_disjoint,
            "profile_tokens": split.profile.num_tokens,
            "profile_s": round(profile_s, 3),
            "q": s.config.q,
            "iterations": s.iterations,
            "patience": s.patience,
            "tolerance": s.tolerance,
            "seed": s.seed,
        },
    }
    return report, searches
