"""Alg. 2's acquisition on optuna: decaying multi-dimensional ε-greedy search over Q pairs.

The variables of a trial are Q pairs `pair_q`: a packed Omega key (layer, token, position, expert)
and the count written there, as one integer key * (value_max + 1) + value. Per iteration tau (the
number of finished trials):

1. ε decays as ε_tau = ε_0 / (1 + ρ tau) in every dimension; in the first μQ dimensions it is
   multiplied by (1 + ρ' tau), where ρ' is the slow-down of the most severe thing the last trial
   did to an expert of a learning batch: ρ1 a memory shortfall, ρ2 a payload overflow, ρ3 a
   misprediction within the limits (0 when nothing was mispredicted). ρ3 < ρ2 < ρ1 < ρ, so ε still
   decays, more slowly the worse the last plan fared: the pairs most tied to mispredictions keep
   exploring longer.
2. Every dimension keeps the best trial's pair with probability 1 - ε_q and draws a new one with
   probability ε_q (at least one dimension is always redrawn, or the trial would repeat the best
   one). New pairs of the first μQ dimensions come from the limited range L: keys whose token and
   position occur in a mispredicted learning batch, any layer and expert. The other dimensions
   draw from L or, with equal chance, from the normal range P of all keys, which creates keys
   profiling never saw. Values are uniform in 0..value_max.
3. With the GP surrogate on, `candidates` such vectors are drawn and the one the GP expects to be
   cheapest is evaluated; otherwise the first.

The single-ε baseline is the same search with one ε for all dimensions and no slow-downs, every
dimension drawing as the unslowed ones do (from L or P). The
stopping rule (`Converged`) ends the study when the best cost improved by less than a relative ζ
over the last λ iterations.

Why these defaults: ε_0 = 0.2 redraws about 200 of 1,000 pairs in the first iteration, enough
to move a popular expert's predicted count by tens of tokens; ρ = 0.05 halves ε within 20
iterations, which is the scale of the stopping rule's λ.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, IntDistribution
from optuna.trial import FrozenTrial, TrialState

from ground.errors import UsageError
from planner.bo._surrogate import pick_lowest_mean
from planner.serving import Case
from predictor._adjust import Adjustment, KeySpace

__all__ = [
    "Converged",
    "EpsilonGreedy",
    "EpsilonGreedySampler",
    "adjustment_of",
    "pair_params",
    "converged",
    "epsilon",
    "search_space",
]

CASE_ATTR = "worst_case"  # user attribute: the most severe Case of the trial's learning batches
MISPREDICTED_ATTR = "mispredicted_batches"  # user attribute: indices of those batches
EMBEDDING_ATTR = "predicted_counts"  # user attribute: the trial's predicted counts, flattened


@dataclass(frozen=True)
class EpsilonGreedy:
    """The constants of Alg. 2's acquisition (names as in serverless-model.md §8)."""

    q: int = 1000  # key-value pairs per trial (the paper's Q)
    epsilon0: float = 0.2
    rho: float = 0.05  # decay
    rho_memory: float = 0.04  # ρ1, case (i)
    rho_payload: float = 0.03  # ρ2, case (ii)
    rho_mispredicted: float = 0.02  # ρ3, case (iii)
    mu: float = 0.5  # share of dimensions searched within L with the slowed decay
    value_max: int = 16  # largest count written
    per_dimension: bool = True  # False: one ε for all dimensions (the single-ε baseline)
    candidates: int = 8  # vectors drawn per trial for the surrogate to choose from
    surrogate: str = "gp"  # "gp" or "none"
    warmup: int = 5  # finished trials before the surrogate is consulted

    def __post_init__(self) -> None:
        problems = []
        if self.q < 1:
            problems.append(f"Q = {self.q} must be at least 1")
        if not 0 < self.epsilon0 <= 1:
            problems.append(f"ε0 = {self.epsilon0} must be in (0, 1]")
        if not 0 <= self.mu <= 1:
            problems.append(f"μ = {self.mu} must be in [0, 1]")
        if not 0 <= self.rho_mispredicted < self.rho_payload < self.rho_memory < self.rho:
            problems.append(
                f"the slow-downs must satisfy ρ3 < ρ2 < ρ1 < ρ, got ρ3 = {self.rho_mispredicted}"
                f", ρ2 = {self.rho_payload}, ρ1 = {self.rho_memory}, ρ = {self.rho}"
            )
        if self.value_max < 1:
            problems.append(f"value_max = {self.value_max} must be at least 1")
        if self.candidates < 1:
            problems.append(f"candidates = {self.candidates} must be at least 1")
        if self.surrogate not in ("gp", "none"):
            problems.append(f"surrogate '{self.surrogate}' is not gp or none")
        if problems:
            raise UsageError("; ".join(problems) + ".", "fix the BO constants.")

    def slow_down(self, case: Case | None) -> float:
        """ρ' for the most severe case of the last iteration (None: nothing mispredicted)."""
        return {
            Case.MEMORY: self.rho_memory,
            Case.PAYLOAD: self.rho_payload,
            Case.MISPREDICTED: self.rho_mispredicted,
        }.get(case, 0.0)  # type: ignore[arg-type]


def epsilon(config: EpsilonGreedy, tau: int, case: Case | None) -> np.ndarray:
    """(Q,) ε of every dimension in iteration `tau` after a trial whose worst case was `case`."""
    base = np.full(config.q, config.epsilon0 / (1.0 + config.rho * tau))
    if config.per_dimension:
        slowed = int(round(config.mu * config.q))
        base[:slowed] *= 1.0 + config.slow_down(case) * tau
    return np.minimum(base, 1.0)


def search_space(space: KeySpace, config: EpsilonGreedy) -> dict[str, IntDistribution]:
    """The optuna distributions of the Q pairs (every sampler of the comparison uses these).

    One integer per pair, key * (value_max + 1) + value: optuna's per-parameter bookkeeping
    grows with the square of the parameter count, and Q pairs as 2Q parameters cost four times
    as much (0.29 s of a 0.4 s iteration at Q = 1000).
    """
    top = space.size * (config.value_max + 1) - 1
    return {f"pair_{q:04d}": IntDistribution(0, top) for q in range(config.q)}


def pair_params(adjustment: Adjustment, value_max: int) -> dict[str, int]:
    """A trial's parameters holding `adjustment`'s pairs (dimension order)."""
    packed = adjustment.keys * (value_max + 1) + adjustment.values.astype(np.int64)
    return {f"pair_{q:04d}": int(p) for q, p in enumerate(packed)}


def adjustment_of(params: dict[str, Any], q: int, value_max: int) -> Adjustment:
    """The pairs of a trial's parameters, in dimension order."""
    packed = np.array([params[f"pair_{i:04d}"] for i in range(q)], dtype=np.int64)
    return Adjustment(packed // (value_max + 1), (packed % (value_max + 1)).astype(float))


def converged(best: Sequence[float], patience: int, tolerance: float) -> bool:
    """True when the best cost improved by less than `tolerance` (relative) in `patience` steps.

    `best` is the running best after each finished iteration.
    """
    if patience < 1 or len(best) <= patience:
        return False
    before, now = best[-patience - 1], best[-1]
    return bool(before - now <= tolerance * abs(before))


class Converged:
    """optuna callback: stop the study by the stopping rule (λ = `patience`, ζ = `tolerance`)."""

    def __init__(self, patience: int = 20, tolerance: float = 1e-3) -> None:
        self.patience, self.tolerance = patience, tolerance
        self.best: list[float] = []
        self.at: int | None = None  # iterations done when the rule fired

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        if trial.state is not TrialState.COMPLETE or trial.value is None:
            return
        previous = self.best[-1] if self.best else np.inf
        self.best.append(min(previous, trial.value))
        if self.at is None and converged(self.best, self.patience, self.tolerance):
            self.at = len(self.best)
            study.stop()


class EpsilonGreedySampler(optuna.samplers.BaseSampler):
    """Alg. 2's decaying multi-dimensional ε-greedy search (module docstring), as a sampler.

    Args:
        space: The Omega keys the pairs index.
        occurrences: Per learning batch, its (token IDs, position IDs): the limited range L is
            built from the batches a trial reports as mispredicted.
        config: The constants; `per_dimension=False` gives the single-ε baseline.
        embed: Maps a candidate `Adjustment` to what the surrogate models (the predicted counts);
            needed only with `surrogate="gp"`.
        seed: Seeds every draw; the same seed and history give the same trials.
    """

    def __init__(
        self,
        space: KeySpace,
        occurrences: Sequence[tuple[np.ndarray, np.ndarray]],
        config: EpsilonGreedy | None = None,
        *,
        embed: Callable[[Adjustment], np.ndarray] | None = None,
        seed: int | None = None,
    ) -> None:
        self.space = space
        self.occurrences = list(occurrences)
        self.config = config or EpsilonGreedy()
        if self.config.surrogate == "gp" and embed is None:
            raise ValueError("the GP surrogate needs an embed function")
        self.embed = embed
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._distributions = search_space(space, self.config)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    def reseed_rng(self) -> None:
        self._rng = np.random.default_rng()
        self._fallback.reseed_rng()

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return self._distributions

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        done = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and np.isfinite(t.value)
        ]
        q = self.config.q
        if done:
            best = min(done, key=lambda t: t.value)  # type: ignore[arg-type, return-value]
            incumbent = adjustment_of(best.params, q, self.config.value_max)
            last = max(done, key=lambda t: t.number)
            case = last.user_attrs.get(CASE_ATTR)
            eps = epsilon(self.config, len(done), None if case is None else Case(case))
        else:
            incumbent = Adjustment(np.zeros(q, dtype=np.int64), np.zeros(q))
            eps = np.ones(q)
        limited = self._limited(done)
        candidates = [self._candidate(incumbent, eps, limited) for _ in range(self._count(done))]
        chosen = candidates[0]
        if len(candidates) > 1:
            assert self.embed is not None
            seen = np.array([t.user_attrs[EMBEDDING_ATTR] for t in done])
            costs = np.array([t.value for t in done], dtype=float)
            wanted = np.array([self.embed(c) for c in candidates])
            chosen = candidates[pick_lowest_mean(seen, costs, wanted, seed=len(done))]
        return pair_params(chosen, self.config.value_max)

    def _count(self, done: list[FrozenTrial]) -> int:
        use_gp = self.config.surrogate == "gp" and len(done) >= self.config.warmup
        return self.config.candidates if use_gp else 1

    def _limited(self, done: list[FrozenTrial]) -> tuple[np.ndarray, np.ndarray]:
        """L's token and position occurrences: those of every batch ever mispredicted."""
        batches = sorted({j for t in done for j in t.user_attrs.get(MISPREDICTED_ATTR, [])})
        if not batches:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        tokens = np.concatenate([self.occurrences[j][0] for j in batches]).astype(np.int64)
        positions = np.concatenate([self.occurrences[j][1] for j in batches]).astype(np.int64)
        if self.space.positions == 1:
            positions = np.zeros_like(positions)
        return tokens, positions

    def _draw_keys(self, n: int, limited: tuple[np.ndarray, np.ndarray], in_l: np.ndarray):
        """`n` keys: from L where `in_l` (if L is not empty), from P elsewhere."""
        s, rng = self.space, self._rng
        layer = rng.integers(0, s.layers, n)
        expert = rng.integers(0, s.experts, n)
        token = rng.integers(0, s.vocab, n)
        position = rng.integers(0, s.positions, n)
        tokens, positions = limited
        if tokens.size:
            pick = rng.integers(0, tokens.size, n)
            token = np.where(in_l, tokens[pick], token)
            position = np.where(in_l, positions[pick], position)
        return s.pack(layer, token, position, expert)

    def _candidate(
        self, incumbent: Adjustment, eps: np.ndarray, limited: tuple[np.ndarray, np.ndarray]
    ) -> Adjustment:
        cfg, rng, q = self.config, self._rng, self.config.q
        explore = rng.random(q) < eps
        if not explore.any():
            explore[rng.integers(0, q)] = True
        slowed = np.arange(q) < int(round(cfg.mu * q)) if cfg.per_dimension else np.zeros(q, bool)
        in_l = slowed | (rng.random(q) < 0.5)
        keys = np.where(explore, self._draw_keys(q, limited, in_l), incumbent.keys)
        values = np.where(explore, rng.integers(0, cfg.value_max + 1, q), incumbent.values)
        return Adjustment(keys.astype(np.int64), values.astype(float))
