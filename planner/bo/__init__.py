"""Bayesian optimisation of the expert-selection predictor against the billed cost (Alg. 2).

`EpsilonGreedySampler` is the decaying multi-dimensional ε-greedy search as an optuna sampler,
`ServingObjective` the black box (predict, plan, serve real batches), `run_bo` the experiment
that compares it with the baselines on held-out batches, `compare_strategies` that over seeds
(what `moelambda bo` does) and `plot_convergence` its plot.
"""

from __future__ import annotations

from planner.bo._compare import check_bo, compare_strategies, plot_convergence
from planner.bo._objective import Outcome, Planner, ServingObjective
from planner.bo._run import (
    BO_METHODS,
    BoSettings,
    Split,
    mean_costs,
    run_bo,
    saving_vs,
    split_for_bo,
    tune,
)
from planner.bo._sampler import (
    Converged,
    EpsilonGreedy,
    EpsilonGreedySampler,
    adjustment_of,
    converged,
    epsilon,
    search_space,
)
from planner.bo._seeds import claims, statistics

__all__ = [
    "BO_METHODS",
    "BoSettings",
    "Converged",
    "EpsilonGreedy",
    "EpsilonGreedySampler",
    "Outcome",
    "Planner",
    "ServingObjective",
    "Split",
    "adjustment_of",
    "check_bo",
    "claims",
    "compare_strategies",
    "converged",
    "epsilon",
    "mean_costs",
    "plot_convergence",
    "run_bo",
    "saving_vs",
    "search_space",
    "split_for_bo",
    "statistics",
    "tune",
]
