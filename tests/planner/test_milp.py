"""The MILP against exhaustive enumeration, ODS and the baselines against the optimum, and
HiGHS against Gurobi, on seeded random small instances."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest

from ground.errors import UsageError
from planner import milp, milp_backends
from planner import ods as ods_module
from planner.baselines import lambdaml, random_methods, uniform
from planner.costmodel import Choice, Evaluation, Solution, evaluate
from planner.instance import Instance, Method
from planner.milp import solve_milp, solve_milp_mixed
from planner.ods import solve_ods
from tests.planner.small import brute_force, layer_table, small_instance

SHAPES = {
    "2x3x3": {},
    "3x2x2": {"layers": 3, "experts": 2, "memories": 2},
    "standard": {"workflow": "standard"},
    "experts": {"objective": "experts"},
}
CASES = [(shape, seed) for shape in SHAPES for seed in range(5)]
ALL = tuple(Method)


def _instance(case: tuple[str, int]) -> Instance:
    shape, seed = case
    return small_instance(seed, **SHAPES[shape])


def _slos(inst: Instance, methods: tuple[Method, ...]) -> dict[str, float | None]:
    """No SLO, two binding levels, the fastest possible latency exactly, and just below it.

    Only "none" when some layer has no feasible option at all (direct with too few replicas).
    """
    tables = [layer_table(inst, layer, methods) for layer in range(inst.layers)]
    free = brute_force(inst, None, methods)
    if free is None:
        return {"none": None}
    fastest = inst.fixed_s() + sum(min(row[1] for row in rows) for rows in tables)
    relaxed = evaluate(inst, free[1]).latency
    return {
        "none": None,
        "loose": fastest + 0.8 * (relaxed - fastest),
        "medium": fastest + 0.3 * (relaxed - fastest),
        "tight": fastest,
        "infeasible": fastest - 0.01,
    }


def _check_solution(inst: Instance, solution: Solution, slo_s: float | None) -> None:
    """Meets every constraint and re-evaluates to the reported cost and latency."""
    again = evaluate(inst, solution.choice, slo_s)
    assert again.violations == []
    assert again.cost == pytest.approx(solution.cost, rel=1e-12)
    assert again.latency == pytest.approx(solution.latency, rel=1e-12)
    pipelined = solution.choice.method == Method.PIPELINED
    assert np.all(solution.choice.beta[~pipelined] == 1)
    assert set(solution.choice.beta[pipelined]) <= set(inst.betas)


def _ids(case: tuple[str, int]) -> str:
    return f"{case[0]}-seed{case[1]}"


@pytest.mark.parametrize("case", CASES, ids=_ids)
@pytest.mark.parametrize("method", [*ALL, None], ids=lambda m: "mixed" if m is None else m.label)
def test_milp_equals_brute_force(case: tuple[str, int], method: Method | None) -> None:
    inst = _instance(case)
    methods = ALL if method is None else (method,)
    for name, slo in _slos(inst, methods).items():
        expected = brute_force(inst, slo, methods)
        if method is None:
            got = solve_milp_mixed(inst, slo, backend="highs")
        else:
            got = solve_milp(inst, method, slo, backend="highs")
        if expected is None:
            assert got is None, name
            continue
        assert got is not None, name
        assert got.optimal, name
        assert got.cost == pytest.approx(expected[0], rel=1e-7), name
        assert set(got.choice.method) <= {int(m) for m in methods}
        _check_solution(inst, got, slo)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_ods_is_feasible_and_never_beats_the_optimum(case: tuple[str, int]) -> None:
    inst = _instance(case)
    for name, slo in _slos(inst, ALL).items():
        optimum = brute_force(inst, slo)
        any_uniform = any(brute_force(inst, slo, (m,)) is not None for m in ALL)
        ods = solve_ods(inst, slo)
        assert (ods is not None) == any_uniform, name
        if ods is None:
            continue
        assert optimum is not None
        assert ods.solver == "ods" and ods.optimal is None and ods.note
        assert ods.cost >= optimum[0] * (1 - 1e-9), name
        _check_solution(inst, ods, slo)


def test_ods_reports_its_swaps() -> None:
    """Under the paper's objective the cheapest method per layer is too slow at a medium SLO.

    (Under the full bill, direct is both the cheapest and the fastest on these tiny instances,
    so ODS never has to swap there.)
    """
    inst = small_instance(2, objective="experts")
    ods = solve_ods(inst, None)
    assert ods is not None and ods.note.startswith("0 swaps")
    slo = _slos(inst, ALL)["medium"]
    ods = solve_ods(inst, slo)
    assert ods is not None and ods.note.startswith("1 swap;")


def test_ods_falls_back_to_the_cheapest_uniform_method(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rare on small instances, so forced: every assembled mix is declared too slow."""
    inst = small_instance(2, layers=3, replicas=4)  # all three methods fit
    real = ods_module.evaluate

    def always_too_slow(inst: Instance, choice: Choice, slo_s: float | None = None) -> Evaluation:
        return dataclasses.replace(real(inst, choice, slo_s), violations=["too slow"])

    monkeypatch.setattr(ods_module, "evaluate", always_too_slow)
    ods = solve_ods(inst, 100.0)
    cheapest = min(filter(None, (solve_milp(inst, m, 100.0) for m in ALL)), key=lambda s: s.cost)
    assert ods is not None and "fell back to uniform" in ods.note
    assert ods.cost == pytest.approx(cheapest.cost, rel=1e-9)


@pytest.mark.parametrize("seed", range(3))
def test_baselines_are_feasible_and_no_cheaper_than_the_optimum(seed: int) -> None:
    inst = small_instance(seed)
    slo = _slos(inst, ALL)["loose"]
    optimum = brute_force(inst, slo)
    assert optimum is not None
    found = [lambdaml(inst, slo), random_methods(inst, slo, seed=seed)]
    found += [uniform(inst, m, slo) for m in ALL]
    for solution in filter(None, found):
        assert solution.cost >= optimum[0] * (1 - 1e-9), solution.solver
        _check_solution(inst, solution, slo)


def test_lambdaml_uses_one_replica_near_3008_mb() -> None:
    inst = small_instance(1, memories=6)  # all six memory options, 3,008 MB among them
    solution = lambdaml(inst, None)
    assert solution is not None
    assert np.all(inst.memory_mb[solution.choice.memory] == 3008)
    assert np.all(solution.choice.replicas == 1)


def test_random_methods_are_reproducible() -> None:
    inst = small_instance(2, layers=3, replicas=4)  # direct fits too
    runs = [random_methods(inst, None, seed=s) for s in (7, 7)]
    assert runs[0] is not None and runs[1] is not None
    assert runs[0].note == runs[1].note
    assert runs[0].cost == runs[1].cost


def test_mixed_milp_rejects_a_wrong_number_of_layers() -> None:
    with pytest.raises(UsageError):
        solve_milp_mixed(small_instance(0), None, allowed=[(Method.S3,)])


def test_undominated_keeps_the_frontier_and_one_of_each_tie() -> None:
    cost = np.array([1.0, 2.0, 1.0, 3.0, 0.5])
    finish = np.array([5.0, 4.0, 5.0, 4.0, 6.0])
    keep = milp._undominated(cost, finish)
    assert keep.tolist() == [True, True, False, False, True]


def _gurobi_optimises() -> bool:
    """Whether gurobipy is installed with a licence that solves at least a tiny model."""
    try:
        import gurobipy as gp

        with gp.Env(empty=True) as env:
            env.setParam("OutputFlag", 0)
            env.start()
            with gp.Model(env=env) as model:
                model.addVar(ub=1.0, obj=1.0)
                model.optimize()
                return model.Status == gp.GRB.OPTIMAL
    except Exception:  # ImportError or any licence error
        return False


gurobi = pytest.mark.skipif(not _gurobi_optimises(), reason="gurobipy cannot optimise here")


@gurobi
@pytest.mark.parametrize("case", CASES[:3], ids=_ids)
def test_highs_and_gurobi_agree(case: tuple[str, int]) -> None:
    inst = _instance(case)
    for name, slo in _slos(inst, ALL).items():
        for allowed in (None, [(Method.PIPELINED,)] * inst.layers):
            highs, grb = (
                solve_milp_mixed(inst, slo, allowed=allowed, backend=backend)
                for backend in ("highs", "gurobi")
            )
            assert (highs is None) == (grb is None), name
            if highs is not None and grb is not None:
                assert grb.note.startswith("gurobi") and highs.note.startswith("highs")
                assert grb.optimal and highs.optimal
                assert grb.cost == pytest.approx(highs.cost, rel=1e-6), name


@gurobi
def test_a_model_too_large_for_the_licence_falls_back_to_highs_with_one_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    small = small_instance(0, layers=12, experts=32, memories=6, replicas=8)
    inst = dataclasses.replace(small, counts=small.counts * 25)  # ~2,400 columns, 2,800 rows
    try:
        solve_milp(inst, Method.S3, 1000.0, backend="gurobi")
    except UsageError as error:
        assert "size-limited" in str(error)
    else:
        pytest.skip("the Gurobi licence here takes the large model")
    monkeypatch.setattr(milp_backends, "_warned_gurobi", False)
    with pytest.warns(RuntimeWarning, match="HiGHS"):
        first = solve_milp(inst, Method.S3, 1000.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = solve_milp(inst, Method.S3, 1000.0)
    assert first is not None and second is not None
    assert first.note.startswith("highs") and first.optimal
    assert second.cost == first.cost
