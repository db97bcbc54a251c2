"""Alg. 2 on optuna: the ε schedule, the sampler's ranges, the stopping rule, reproducibility, and
`moelambda bo` end to end on real MiniLM routing."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import optuna
import pytest
from typer.testing import CliRunner

from ground.errors import UsageError
from moelambda.cli import app
from planner.bo import (
    Converged,
    EpsilonGreedy,
    EpsilonGreedySampler,
    adjustment_of,
    converged,
    epsilon,
)
from planner.bo._sampler import CASE_ATTR, EMBEDDING_ATTR, MISPREDICTED_ATTR
from planner.serving import Case
from predictor._adjust import KeySpace

runner = CliRunner()
SPACE = KeySpace(layers=3, vocab=500, positions=16, experts=4)


def test_epsilon_decays_and_slows_down_in_order() -> None:
    cfg = EpsilonGreedy(q=100, epsilon0=0.4, rho=0.5, mu=0.3)
    assert np.allclose(epsilon(cfg, 0, None), 0.4)
    tau = 10
    base = 0.4 / (1 + 0.5 * tau)
    plain = epsilon(cfg, tau, None)
    assert np.allclose(plain, base)
    by_case = {case: epsilon(cfg, tau, case) for case in Case}
    slowed = slice(0, 30)  # the first round(μQ) dimensions
    assert np.allclose(by_case[Case.MEMORY][slowed], base * (1 + cfg.rho_memory * tau))
    assert np.allclose(by_case[Case.MEMORY][30:], base)
    assert (
        by_case[Case.MEMORY][0]
        > by_case[Case.PAYLOAD][0]
        > by_case[Case.MISPREDICTED][0]
        > by_case[Case.OK][0]
        == base
    )
    # Even the slowest decay still decays, since every slow-down is below ρ.
    series = [epsilon(cfg, t, Case.MEMORY)[0] for t in range(50)]
    assert all(b < a for a, b in zip(series, series[1:], strict=False))


def test_single_epsilon_is_one_value_for_every_dimension() -> None:
    cfg = EpsilonGreedy(q=50, per_dimension=False)
    values = epsilon(cfg, 7, Case.MEMORY)
    assert np.allclose(values, cfg.epsilon0 / (1 + cfg.rho * 7))


@pytest.mark.parametrize(
    "changes",
    [
        {"rho_memory": 0.06},  # ρ1 > ρ
        {"rho_payload": 0.045},  # ρ2 > ρ1
        {"q": 0},
        {"epsilon0": 0.0},
        {"mu": 1.5},
        {"surrogate": "forest"},
    ],
)
def test_bad_constants_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        EpsilonGreedy(**changes)  # type: ignore[arg-type]


def _study(
    cfg: EpsilonGreedy,
    seed: int,
    trials: int,
    case: Case = Case.MISPREDICTED,
    embed: object = None,
) -> optuna.Study:
    """A study whose objective rewards writing 16 into expert 0 of layer 0."""
    occurrences = [(np.arange(100, 140), np.arange(40) % 16)]  # L: tokens 100..139
    sampler = EpsilonGreedySampler(SPACE, occurrences, cfg, embed=embed, seed=seed)  # type: ignore[arg-type]
    study = optuna.create_study(sampler=sampler)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.enqueue_trial({f"pair_{q:04d}": 0 for q in range(cfg.q)})

    def objective(trial: optuna.Trial) -> float:
        params = {
            n: trial.suggest_int(n, d.low, d.high)  # type: ignore[attr-defined]
            for n, d in sampler.infer_relative_search_space(study, trial).items()  # type: ignore[arg-type]
        }
        adj = adjustment_of(params, cfg.q, cfg.value_max)
        layer, _, _, expert = SPACE.unpack(adj.keys)
        trial.set_user_attr(CASE_ATTR, int(case))
        trial.set_user_attr(MISPREDICTED_ATTR, [0])
        trial.set_user_attr(EMBEDDING_ATTR, [float(adj.values.mean()), float(expert.mean())])
        return -float(adj.values[(layer == 0) & (expert == 0)].sum())

    study.optimize(objective, n_trials=trials)
    return study


def _pairs(trial: optuna.trial.FrozenTrial, cfg: EpsilonGreedy):  # type: ignore[no-untyped-def]
    return adjustment_of(trial.params, cfg.q, cfg.value_max)


def test_sampler_keeps_to_its_ranges_and_redraws_about_epsilon_of_the_pairs() -> None:
    cfg = EpsilonGreedy(q=400, epsilon0=0.5, rho=0.2, mu=0.5, surrogate="none")
    study = _study(cfg, seed=3, trials=15)
    trials = study.trials
    best = _pairs(trials[0], cfg)
    best_value = trials[0].value
    slowed = int(cfg.mu * cfg.q)
    for tau, trial in enumerate(trials[1:], start=1):
        pairs = _pairs(trial, cfg)
        assert ((0 <= pairs.keys) & (pairs.keys < SPACE.size)).all()
        assert ((0 <= pairs.values) & (pairs.values <= cfg.value_max)).all()
        changed = (pairs.keys != best.keys) | (pairs.values != best.values)
        _, token, _, _ = SPACE.unpack(pairs.keys)
        # The first μQ pairs are redrawn within L only.
        assert np.isin(token[:slowed][changed[:slowed]], np.arange(100, 140)).all()
        eps = epsilon(cfg, tau, Case.MISPREDICTED)
        expected = eps.sum()
        assert abs(changed.sum() - expected) <= 5 * np.sqrt(expected) + 2
        assert trial.value is not None and best_value is not None
        if trial.value < best_value:
            best, best_value = pairs, trial.value
    # The rest also draw from P: tokens outside the learning batches appear.
    _, token, _, _ = SPACE.unpack(_pairs(trials[-1], cfg).keys)
    assert not np.isin(token[slowed:], np.arange(100, 140)).all()
    # The search found what the objective rewards.
    assert study.best_value < trials[0].value  # type: ignore[operator]


def test_same_seed_same_trials_different_seed_different_trials() -> None:
    cfg = EpsilonGreedy(q=60, surrogate="none")
    a = _study(cfg, seed=5, trials=6)
    b = _study(cfg, seed=5, trials=6)
    c = _study(cfg, seed=6, trials=6)
    assert [t.params for t in a.trials] == [t.params for t in b.trials]
    assert [t.params for t in a.trials] != [t.params for t in c.trials]


def test_gp_surrogate_chooses_among_candidates() -> None:
    calls: list[int] = []

    def embed(adj):  # type: ignore[no-untyped-def]
        calls.append(1)
        _, _, _, expert = SPACE.unpack(adj.keys)
        return np.array([adj.values.mean(), expert.mean()])

    cfg = EpsilonGreedy(q=40, surrogate="gp", candidates=4, warmup=3)
    a = _study(cfg, seed=1, trials=7, embed=embed)
    # Trials 0 (enqueued) .. 6: the GP screens 4 candidates once 3 trials are done (trials 3-6).
    assert len(calls) == 4 * 4
    b = _study(cfg, seed=1, trials=7, embed=embed)
    assert [t.params for t in a.trials] == [t.params for t in b.trials]


def test_stopping_rule() -> None:
    assert not converged([10.0, 9.0], patience=2, tolerance=0.01)  # too few iterations
    assert converged([10.0, 9.0, 9.0, 8.999], patience=2, tolerance=0.01)
    assert not converged([10.0, 9.0, 8.0, 7.0], patience=2, tolerance=0.01)
    assert not converged([10.0, 10.0, 10.0], patience=0, tolerance=1.0)
    stop = Converged(patience=3, tolerance=1e-9)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: 1.0 + 0 * t.suggest_float("x", 0, 1), n_trials=50, callbacks=[stop])
    assert len(study.trials) == 4 and stop.at == 4


@pytest.fixture(scope="module")
def minilm_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bo") / "trace"
    result = runner.invoke(app, ["profile", "--tokens", "12800", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return out


def test_bo_command_end_to_end(minilm_trace: Path, tmp_path: Path) -> None:
    plot = tmp_path / "bo.png"
    args = ["bo", "--traces", str(minilm_trace), "--tokens", "1280", "--test-batches", "4"]
    args += ["--iterations", "5", "--q", "64", "--strategies", "multi-eps,tpe,none", "--json"]
    result = runner.invoke(app, [*args, "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert set(report["methods"]) == {"multi-eps", "tpe", "none"}
    for name, m in report["methods"].items():
        for key in ("final_cost_usd", "prediction_mad", "iterations", "seconds_per_iteration"):
            assert key in m
        assert m["final_cost_usd"] > 0
        assert m["iterations"] == (0 if name == "none" else 5) or m["converged_at"]
    none, multi = report["methods"]["none"], report["methods"]["multi-eps"]
    # Every search starts from the untuned predictor, so it ends no worse on what it learns on.
    assert multi["learn_improvement"] >= 0 and report["methods"]["tpe"]["learn_improvement"] >= 0
    assert report["lambdaml_cost_usd"] > report["oracle_cost_usd"]
    # The saving on the full bill and on the expert functions alone (the paper's -43.41 %).
    lambdaml_experts = report["lambdaml_experts_cost_usd"]
    assert 0 < lambdaml_experts < report["lambdaml_cost_usd"]
    for m in report["methods"].values():
        saving = m["saving_vs_lambdaml"]
        assert saving["full_bill"] == pytest.approx(
            1 - m["final_cost_usd"] / report["lambdaml_cost_usd"], abs=1e-6
        )
        assert saving["experts"] == pytest.approx(
            1 - m["experts_cost_usd"] / lambdaml_experts, abs=1e-6
        )
        assert 0 < m["experts_cost_usd"] < m["final_cost_usd"]
    assert set(report["throughput_tokens_per_s"]) >= {"oracle", "lambdaml", "none"}
    assert none["prediction_mad"] > 0
    assert plot.stat().st_size > 10_000
    again = runner.invoke(app, [*args, "--plot", str(plot)])
    assert again.exit_code == 2 and "already exists" in again.output


def test_bo_over_seeds_reports_mean_spread_and_claims(minilm_trace: Path) -> None:
    args = ["bo", "--traces", str(minilm_trace), "--tokens", "1280", "--test-batches", "3"]
    args += ["--iterations", "3", "--q", "32", "--methods", "multi-eps,single-eps,none"]
    result = runner.invoke(app, [*args, "--seeds", "3", "--seed", "5", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["seeds"] == [5, 6, 7] and len(report["per_seed"]) == 3
    assert [r["setup"]["seed"] for r in report["per_seed"]] == [5, 6, 7]
    stats = report["statistics"]
    assert set(stats) == {"multi-eps", "single-eps", "none"}
    for name, per_metric in stats.items():
        ratio = per_metric["cost_vs_oracle"]
        values = [r["methods"][name]["cost_vs_oracle"] for r in report["per_seed"]]
        assert ratio["mean"] == pytest.approx(sum(values) / 3, abs=1e-6)
        assert ratio["min"] == pytest.approx(min(values)) and ratio["std"] >= 0
        assert 0 <= per_metric["slo_attainment"]["mean"] <= 1
    verdicts = {c["claim"]: c["verdict"] for c in report["claims"]}
    assert any("more than single-eps" in claim for claim in verdicts)
    assert set(verdicts.values()) <= {"holds", "fails", "not shown"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--seeds", "0"], "--seeds 0 is not positive"),
        (["--tokens", "12800"], "too few"),
        (["--strategies", "multi-eps,annealing"], "unknown BO method"),
        (["--rho1", "0.2"], "ρ3 < ρ2 < ρ1 < ρ"),
        (["--predictor", "lina-path"], "cannot be tuned"),
        (["--tokens", "1000"], "whole number"),
    ],
)
def test_bo_command_refuses_bad_input(minilm_trace: Path, extra: list[str], message: str) -> None:
    args = ["bo", "--traces", str(minilm_trace), "--tokens", "1280", "--iterations", "2"]
    result = runner.invoke(app, [*args, "--q", "8", *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output


def _seed_report(multi: float, single: float, ratio: float) -> dict:
    row = {"slo_violations": 1, "converged_at": 10}
    return {
        "setup": {"test_batches": 4},
        "methods": {
            "multi-eps": row | {"learn_improvement": multi, "cost_vs_oracle": ratio},
            "single-eps": row | {"learn_improvement": single, "cost_vs_oracle": 1.0},
            "none": row | {"learn_improvement": None, "cost_vs_oracle": ratio + 0.01},
        },
    }


def test_claims_hold_fail_or_are_not_shown_by_the_paired_differences() -> None:
    from planner.bo import claims, statistics

    def verdict(reports: list[dict], start: str) -> str:
        (found,) = [c["verdict"] for c in claims(reports) if c["claim"].startswith(start)]
        return found

    better = [_seed_report(0.10 + d, 0.05 + d, 1.01) for d in (0.0, 0.01, 0.02, 0.005)]
    assert verdict(better, "multi-dimensional ε-greedy cuts the learning cost more") == "holds"
    worse = [_seed_report(0.05 + d, 0.10 + d, 1.01) for d in (0.0, 0.01, 0.02, 0.005)]
    assert verdict(worse, "multi-dimensional ε-greedy cuts") == "fails"
    mixed = [_seed_report(0.10, 0.05, 1.01), _seed_report(0.05, 0.10, 1.01)]
    assert verdict(mixed, "multi-dimensional ε-greedy cuts") == "not shown"
    assert verdict(better, "multi-eps: held-out cost within 3 %") == "holds"
    assert verdict(better, "the tuned predictor's plans cost less") == "holds"
    stats = statistics(better)
    assert stats["multi-eps"]["slo_attainment"]["mean"] == 0.75
    assert "learn_improvement" not in stats["none"]  # no search, no learning cut


def test_the_experts_only_saving_is_the_saving_on_expert_functions_alone() -> None:
    # A small case: each batch's cheapest plan and LambdaML's, served on counts that differ
    # from the plan's. The experts-only saving must be the one computed from the expert
    # functions' cost alone (here from the bill by item, `price` of the usage, another route
    # than the evaluation), and differ from the full bill's: reporting one bill twice fails.
    from planner.baselines import lambdaml
    from planner.bo import mean_costs, saving_vs
    from planner.exact import solve_exact
    from planner.serving import serve
    from tests.planner.small import small_instance

    plans, baseline = [], []
    for seed in range(3):
        inst = small_instance(seed)
        real = inst.counts * np.random.default_rng(seed).uniform(0.8, 1.2, inst.counts.shape)
        best, lm = solve_exact(inst, None), lambdaml(inst, None)
        assert best is not None and lm is not None
        plans.append(serve(inst, best.choice, real))
        baseline.append(serve(inst, lm.choice, real))
    saving = saving_vs(mean_costs(plans), mean_costs(baseline))

    def total(runs, item: str) -> float:  # type: ignore[no-untyped-def]
        return sum(r.bill_usd[item] for r in runs)

    experts = 1 - total(plans, "experts_usd") / total(baseline, "experts_usd")
    full = 1 - sum(r.cost for r in plans) / sum(r.cost for r in baseline)
    assert saving["experts"] == pytest.approx(experts, abs=1e-6)
    assert saving["full_bill"] == pytest.approx(full, abs=1e-6)
    assert abs(saving["experts"] - saving["full_bill"]) > 1e-3
    # The full bill holds more than the experts: the non-expert functions, requests, S3.
    assert total(plans, "total_usd") > total(plans, "experts_usd")


def test_bo_output_shows_both_savings_and_which_one_the_paper_reports(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from moelambda.cli.bo import _print

    method = {
        "final_cost_usd": 2e-4, "experts_cost_usd": 1e-4, "cost_vs_oracle": 1.01,
        "saving_vs_lambdaml": {"full_bill": 0.1234, "experts": 0.4341},
        "prediction_mad": 3.0, "iterations": 5, "seconds_per_iteration": 0.1,
        "converged_at": None, "converged_s": None,
    }  # fmt: skip
    _print(
        {
            "setup": {"predictor": "bayes-pos-soft", "test_batches": 2, "tokens": 1280},
            "slo_s": 1.0,
            "methods": {"multi-eps": method},
            "oracle_cost_usd": 1.9e-4,
            "lambdaml_cost_usd": 2.3e-4,
            "lambdaml_experts_cost_usd": 1.8e-4,
            "throughput_tokens_per_s": {"multi-eps": 1000.0, "oracle": 1000.0, "lambdaml": 900.0},
        }  # fmt: skip
    )
    out = " ".join(capsys.readouterr().out.split())
    assert "12.3%" in out and "43.4%" in out
    assert "full bill" in out and "experts only" in out
    assert "the bill the paper's -43.41 % is measured on" in out
