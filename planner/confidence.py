"""Plans that keep their SLO with probability Q under the predictive distribution of the counts.

A point plan sizes every expert for its predicted count, which the batch exceeds about half the
time. A confident plan sizes every expert for the same quantile level q of its predictive
distribution (`predictor._uncertainty`), and picks the lowest q from a fixed ladder whose plan
meets the SLO, with no expert refused for lack of replicas, in at least a share Q of scenarios
drawn from that distribution and served by the deployed gates' rules (`planner.serving.serve`).

What is exact and what is not: for a given q the plan is the exact solver's optimum of the bill
at the quantile counts; the chance of meeting the SLO is a Monte Carlo estimate over
`scenarios` draws (counts independent across experts, as the error model assumes); q comes from
a ladder, not a continuous search. The bill reported as expected is the scenarios' mean served
bill; the solver minimises the bill at the quantile counts, an upper bound on it for the chosen
sizing. `moelambda backtest` measures all of it against real held-out batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ground.errors import InfeasibleError
from planner.costmodel import Solution
from planner.instance import Instance
from planner.packing import function_counts, pack
from planner.serving import serve
from predictor._uncertainty import quantile

__all__ = [
    "ConfidentPlan",
    "CountDistribution",
    "attainment",
    "levels",
    "plan_with_confidence",
    "with_counts",
]

_LADDER = (0.5, 0.75, 0.9, 0.95, 0.975, 0.99, 0.995, 0.999, 0.9995, 0.9999)


@dataclass(frozen=True)
class CountDistribution:
    """Each expert's count in a batch of `tokens` tokens: normal, clipped to [0, tokens]."""

    mean: np.ndarray  # (L, E)
    std: np.ndarray  # (L, E)
    tokens: int
    z: np.ndarray | None = None  # standardised held-out residuals: the shape (else normal)

    def scaled(self, tokens: int) -> CountDistribution:
        """The same shares for a batch of `tokens`: the sampling part of the spread grows as
        sqrt(tokens), the model-error part as tokens; scaling both linearly keeps the
        relative error and is what the planner's counts scaling already does."""
        factor = tokens / self.tokens
        return CountDistribution(self.mean * factor, self.std * factor, tokens, self.z)

    def quantile(self, q: float) -> np.ndarray:
        return quantile(self.mean, self.std, q, self.tokens, self.z)

    def draw(self, scenarios: int, seed: int) -> np.ndarray:
        """(scenarios, L, E) counts, rounded to whole tokens: each expert's standardised error
        drawn from the held-out residuals (else the normal), independently."""
        rng = np.random.default_rng(seed)
        shape = (scenarios, *self.mean.shape)
        if self.z is None or self.z.size == 0:
            noise = rng.standard_normal(shape)
        else:
            noise = rng.choice(self.z, size=shape)
        return np.clip(np.rint(self.mean + noise * self.std), 0, self.tokens)


@dataclass(frozen=True)
class ConfidentPlan:
    """The plan sized at quantile `level`, and what the scenarios say of it."""

    inst: Instance  # counts: the quantile counts it was solved on
    solution: Solution
    confidence: float  # the Q asked for
    level: float  # the quantile level of every expert's sizing
    attainment: float  # share of scenarios that met the SLO and fitted
    expected_cost: float  # mean served objective over the scenarios
    scenarios: int
    # (level, attainment) of every level tried; a rejected level's share is of the draws
    # served before it missed more than Q allows
    tried: tuple[tuple[float, float], ...]

    def describe(self) -> dict[str, object]:
        return {
            "confidence": self.confidence,
            "quantile_level": self.level,
            "attainment_estimate": round(self.attainment, 4),
            "expected_cost_usd": self.expected_cost,
            "scenarios": self.scenarios,
            "levels_tried": [[lv, round(a, 4)] for lv, a in self.tried],
        }


def levels(confidence: float, cells: int) -> list[float]:
    """The quantile levels tried, lowest first: the ladder up to the Bonferroni level of
    `cells` experts at `confidence` (each expert's tail at (1 - Q) / cells), which meets Q
    whatever the dependence between experts."""
    top = 1.0 - (1.0 - confidence) / cells
    return sorted({lv for lv in _LADDER if lv < top} | {confidence, top})


def attainment(
    inst: Instance,
    solution: Solution,
    draws: np.ndarray,
    slo_s: float | None,
    confidence: float = 0.0,
) -> tuple[float, float | None]:
    """(share of draws served within the SLO with nothing refused, their mean served cost).

    Stops once more draws have missed than `confidence` allows (a plan that cannot reach it
    is rejected after a few draws; its share is then of the draws served, its cost None).
    """
    allowed = int(np.floor((1.0 - confidence) * len(draws) + 1e-9))
    met, costs = 0, []
    for counts in draws:  # per expert; a packed plan serves its functions' sums
        served = counts if inst.groups is None else function_counts(inst.groups, counts)
        run = serve(inst, solution.choice, served)
        costs.append(run.cost)
        within = slo_s is None or run.latency <= slo_s * (1 + 1e-9)
        met += bool(within and not run.failed.any())
        if len(costs) - met > allowed:
            return met / len(costs), None
    return met / len(costs), float(np.mean(costs))


def plan_with_confidence(
    dist: CountDistribution,
    confidence: float,
    slo_s: float | None,
    instance: Callable[[np.ndarray], Instance],
    solve: Callable[[Instance], Solution | None],
    *,
    scenarios: int = 200,
    seed: int = 0,
) -> ConfidentPlan:
    """The cheapest plan on the ladder whose scenario attainment is at least `confidence`.

    Args:
        dist: The predictive distribution of the batch's counts.
        confidence: Q in (0, 1).
        slo_s: The SLO; None plans the cheapest deployment, and Q is then the chance that
            every expert's real tokens fit its replicas.
        instance: Makes the planning instance of given counts.
        solve: The solver (the exact one by default in `moelambda plan`).

    Raises:
        InfeasibleError: Even the highest level's plan falls short of Q, or has no plan
            within the SLO; the message names the attainment reached.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} is not in (0, 1)")
    draws = dist.draw(scenarios, seed)
    tried: list[tuple[float, float]] = []
    for level in levels(confidence, dist.mean.size):
        inst = instance(dist.quantile(level))
        solution = solve(inst)
        if solution is None:
            tried.append((level, 0.0))
            break  # higher levels only need more: none of them has a plan either
        share, cost = attainment(inst, solution, draws, slo_s, confidence)
        tried.append((level, share))
        if cost is not None and share >= confidence:
            return ConfidentPlan(
                inst, solution, confidence, level, share, cost, scenarios, tuple(tried)
            )
    best = max(tried, key=lambda t: t[1])
    slo = "no SLO" if slo_s is None else f"the SLO of {slo_s:.3f} s"
    raise InfeasibleError(
        f"no plan meets {slo} with probability {confidence:g} under the predicted counts' "
        f"distribution: the best reached {best[1]:.1%} (sized at quantile {best[0]:g}).",
        "relax --slo, lower --confidence, or pass --confidence 0 for the point plan.",
    )


def with_counts(inst: Instance, counts: np.ndarray) -> Instance:
    """`inst` with other per-expert counts (what the backtest serves a plan on); a packed
    instance is packed again from its source with them."""
    if inst.source is not None:
        assert inst.groups is not None
        return pack(with_counts(inst.source, counts), inst.groups)
    return dataclasses.replace(inst, counts=np.asarray(counts, float))
