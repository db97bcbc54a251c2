"""Alg. 2's black box: write the pairs into Omega, predict, plan, serve the real learning batches.

The value is the plan's objective on the real batch (the full bill by default, the expert
functions' cost with the paper's objective), averaged over the learning batches, each served by
the plan made from its own predicted counts (`planner.serving.serve`). A plan whose real latency
overruns the SLO is charged `slo_penalty` times the overrun on top, and a batch the gates refuse
(more tokens than an expert's replica cap can hold) as a 100 % overrun, so the search cannot buy
a lower bill by predicting fewer tokens and missing the SLO it was planned for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import optuna

from ground.manifest import Manifest
from planner.bo._sampler import (
    CASE_ATTR,
    EMBEDDING_ATTR,
    MISPREDICTED_ATTR,
    EpsilonGreedy,
    adjustment_of,
    search_space,
)
from planner.build import instance_for
from planner.calibration import Calibration
from planner.costmodel import Solution
from planner.exact import solve_exact
from planner.instance import Instance
from planner.serving import Case, Served, serve
from predictor._adjust import AdjustableBatch, Adjustment

__all__ = ["Outcome", "Planner", "ServingObjective"]


@dataclass(frozen=True)
class Planner:
    """The policy maker: the cheapest plan within the SLO for given counts (the exact solver).

    The exact solver returns the optimum ODS approximates (tests/planner: ODS >= exact), in a
    fraction of ODS's time, which is what keeps an iteration under a second.
    """

    manifest: Manifest
    calibration: Calibration
    tokens: int
    slo_s: float | None

    def __call__(self, counts: np.ndarray) -> tuple[Instance, Solution | None]:
        inst = instance_for(self.manifest, counts, self.calibration, tokens=self.tokens)
        return inst, solve_exact(inst, self.slo_s)


@dataclass(frozen=True)
class Outcome:
    """One adjustment evaluated on the learning batches."""

    value: float  # the objective: mean cost, with the SLO penalty
    cost: float  # mean billed cost under the plan's objective
    served: tuple[Served, ...]
    predicted: tuple[np.ndarray, ...]

    @property
    def worst_case(self) -> Case:
        return min(s.worst_case() for s in self.served)

    @property
    def mispredicted(self) -> list[int]:
        return [j for j, s in enumerate(self.served) if s.worst_case() is not Case.OK]


class ServingObjective:
    """The optuna objective of Alg. 2 (module docstring); also evaluates an `Adjustment` directly.

    Args:
        batches: The learning batches, prepared for prediction.
        real: Their real (L, E) counts.
        planner: Makes the plan of a batch's predicted counts.
        config: Q and the value range of the pairs.
        alpha: Tokens per replica a prediction may be off before it counts as mispredicted.
        slo_penalty: Extra cost per unit of relative SLO overrun. Default 10.
    """

    def __init__(
        self,
        batches: Sequence[AdjustableBatch],
        real: Sequence[np.ndarray],
        planner: Callable[[np.ndarray], tuple[Instance, Solution | None]],
        config: EpsilonGreedy,
        *,
        alpha: float = 64.0,
        slo_penalty: float = 10.0,
        slo_s: float | None = None,
    ) -> None:
        self.batches, self.real, self.planner = list(batches), list(real), planner
        self.config, self.alpha, self.slo_penalty, self.slo_s = config, alpha, slo_penalty, slo_s
        self.space = search_space(self.batches[0].space, config)

    def embed(self, adjustment: Adjustment) -> np.ndarray:
        """What the surrogate models: the predicted counts of every learning batch, flattened."""
        return np.concatenate([b.counts(adjustment).ravel() for b in self.batches])

    def outcome(self, adjustment: Adjustment) -> Outcome | None:
        """Serve every learning batch on its prediction's plan; None if a plan is infeasible."""
        served, predicted, values = [], [], []
        for batch, real in zip(self.batches, self.real, strict=True):
            counts = batch.counts(adjustment)
            inst, solution = self.planner(counts)
            if solution is None:
                return None
            run = serve(inst, solution.choice, real, alpha=self.alpha)
            overrun = 0.0 if self.slo_s is None else max(0.0, run.latency / self.slo_s - 1.0)
            if run.failed.any():  # the gate refused the batch: as bad as doubling the latency
                overrun = max(overrun, 1.0)
            served.append(run)
            predicted.append(counts)
            values.append(run.cost * (1.0 + self.slo_penalty * overrun))
        cost = float(np.mean([s.cost for s in served]))
        return Outcome(float(np.mean(values)), cost, tuple(served), tuple(predicted))

    def __call__(self, trial: optuna.Trial) -> float:
        params = {n: trial.suggest_int(n, d.low, d.high) for n, d in self.space.items()}
        outcome = self.outcome(adjustment_of(params, self.config.q, self.config.value_max))
        if outcome is None:
            raise optuna.TrialPruned("a learning batch's prediction has no feasible plan")
        trial.set_user_attr(CASE_ATTR, int(outcome.worst_case))
        trial.set_user_attr(MISPREDICTED_ATTR, outcome.mispredicted)
        trial.set_user_attr("cost_usd", outcome.cost)
        trial.set_user_attr(EMBEDDING_ATTR, np.concatenate(outcome.predicted).ravel().tolist())
        return outcome.value
