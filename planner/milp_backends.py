"""The MILP's solvers: HiGHS (highspy), or Gurobi where its licence takes the model.

`run` solves an assembled program (`planner.milp` builds it) with the backend asked for; with
"auto" it tries Gurobi and falls back to HiGHS, warning once per process, when the pip
licence's size limit (2,000 variables) refuses it.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np
from scipy import sparse

from ground.errors import UsageError

__all__ = ["Backend", "Program", "run"]

Backend = Literal["auto", "highs", "gurobi"]
_warned_gurobi = False
_TOLERANCE = 1e-9  # relative gap and feasibility: the optimum must match enumeration to 1e-7


class Program(Protocol):
    """A mixed-integer linear program: min cost x, row_lower <= matrix x <= row_upper,
    lower <= x <= upper, x integer where binary."""

    cost: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    binary: np.ndarray
    matrix: sparse.csr_matrix
    row_lower: np.ndarray
    row_upper: np.ndarray

    def describe(self) -> str: ...


@dataclass(frozen=True)
class _Result:
    """A backend's answer: x is None when the model is proven infeasible."""

    x: np.ndarray | None
    optimal: bool
    gap: float = 0.0


def _solve_highs(model: Program, start: np.ndarray, time_limit_s: float) -> _Result:
    import highspy

    h = highspy.Highs()
    options = {
        "output_flag": False,
        "time_limit": float(time_limit_s),
        "mip_rel_gap": _TOLERANCE,
        "mip_abs_gap": 0.0,
        "mip_feasibility_tolerance": _TOLERANCE,
        "primal_feasibility_tolerance": _TOLERANCE,
    }
    for name, value in options.items():
        h.setOptionValue(name, value)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = model.cost.size, model.row_lower.size
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = model.cost, model.lower, model.upper
    lp.row_lower_, lp.row_upper_ = model.row_lower, model.row_upper
    csc = model.matrix.tocsc()
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = (
        csc.indptr,
        csc.indices,
        csc.data,
    )
    kinds = highspy.HighsVarType
    lp.integrality_ = [kinds.kInteger if b else kinds.kContinuous for b in model.binary]
    h.passModel(lp)
    index = np.flatnonzero(model.binary).astype(np.int32)
    h.setSolution(index.size, index, start[index])  # binaries only: HiGHS fills the rest
    h.run()
    status = h.getModelStatus()
    statuses = highspy.HighsModelStatus
    if status in (statuses.kInfeasible, statuses.kUnboundedOrInfeasible):
        return _Result(None, True)  # the objective is bounded, so this means infeasible
    info = h.getInfo()
    feasible = info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible
    if status != statuses.kOptimal and not feasible:
        raise _no_solution(h.modelStatusToString(status), time_limit_s)
    x = np.array(h.getSolution().col_value)
    return _Result(x, status == statuses.kOptimal, float(info.mip_gap))


def _solve_gurobi(model: Program, start: np.ndarray, time_limit_s: float) -> _Result:
    import gurobipy as gp
    from gurobipy import GRB

    with gp.Env(empty=True) as env:
        env.setParam("OutputFlag", 0)
        env.start()
        with gp.Model(env=env) as m:
            vtype = np.where(model.binary, GRB.BINARY, GRB.CONTINUOUS)
            x = m.addMVar(
                model.cost.size, lb=model.lower, ub=model.upper, obj=model.cost, vtype=vtype
            )
            lo, hi = model.row_lower, model.row_upper
            sense = np.where(
                lo == hi, GRB.EQUAL, np.where(np.isinf(lo), GRB.LESS_EQUAL, GRB.GREATER_EQUAL)
            )
            m.addMConstr(model.matrix, x, sense, np.where(sense == GRB.GREATER_EQUAL, lo, hi))
            x.Start = np.where(model.binary, start, GRB.UNDEFINED)  # Gurobi fills the rest
            m.Params.TimeLimit = float(time_limit_s)
            m.Params.MIPGap = _TOLERANCE
            m.Params.MIPGapAbs = 0.0
            m.Params.FeasibilityTol = _TOLERANCE
            m.Params.IntFeasTol = _TOLERANCE
            m.optimize()
            if m.Status in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
                return _Result(None, True)
            if m.SolCount == 0:
                raise _no_solution(f"Gurobi status {m.Status}", time_limit_s)
            optimal = m.Status == GRB.OPTIMAL
            return _Result(np.array(x.X), optimal, 0.0 if optimal else float(m.MIPGap))


def _no_solution(status: str, time_limit_s: float) -> UsageError:
    return UsageError(
        f"the MILP found no deployment within {time_limit_s:g} s ({status}), "
        "and did not prove that none exists.",
        "raise time_limit_s, or loosen the SLO.",
    )


def run(
    model: Program, start: np.ndarray, backend: Backend, time_limit_s: float
) -> tuple[_Result, str]:
    """Solve with Gurobi when asked or when its licence takes the model, else with HiGHS."""
    global _warned_gurobi
    if backend == "highs":
        return _solve_highs(model, start, time_limit_s), "highs"
    try:
        import gurobipy
    except ImportError as error:
        if backend == "gurobi":
            raise UsageError("gurobipy is not installed.", "pip install gurobipy.") from error
        return _solve_highs(model, start, time_limit_s), "highs"
    try:
        return _solve_gurobi(model, start, time_limit_s), "gurobi"
    except gurobipy.GurobiError as error:
        if backend == "gurobi":
            raise UsageError(
                f"Gurobi cannot solve this model ({model.describe()}): {error.message}",
                "install a full Gurobi licence, or use backend='highs'.",
            ) from error
        if not _warned_gurobi:
            _warned_gurobi = True
            warnings.warn(
                f"Gurobi refused the MILP ({error.message}); solving with HiGHS instead. "
                "Further refusals in this process are not reported.",
                RuntimeWarning,
                stacklevel=4,
            )
    return _solve_highs(model, start, time_limit_s), "highs"
