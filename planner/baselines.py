"""Baseline deployments the planners are compared against (paper Fig. 10-12).

* `lambdaml`: LambdaML as the paper configures it: every expert function at 3,008 MB (the old
  Lambda maximum), one replica, no use of the predicted popularity beyond the method choice.
* `uniform`: the best deployment with one method for every layer (one of ODS's subproblems).
* `random_methods`: a random method per layer, with the best memory and replicas for it; it
  shows what choosing methods well is worth.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from planner.costmodel import Choice, Solution, evaluate
from planner.instance import Instance, Method
from planner.milp import solve_milp, solve_milp_mixed

__all__ = ["LAMBDAML_MEMORY_MB", "lambdaml", "random_methods", "uniform"]

LAMBDAML_MEMORY_MB = 3008.0


def _lambdaml_choices(inst: Instance, memory: int) -> list[Choice]:
    """One choice per (method, beta): every expert at `memory`, one replica."""
    shape = (inst.layers, inst.experts)
    choices = []
    for method in Method:
        for beta in inst.betas if method is Method.PIPELINED else (1,):
            choices.append(
                Choice(
                    method=np.full(inst.layers, int(method)),
                    beta=np.full(inst.layers, beta),
                    memory=np.full(shape, memory),
                    replicas=np.ones(shape, dtype=int),
                )
            )
    return choices


def lambdaml(inst: Instance, slo_s: float | None) -> Solution | None:
    """Every expert at the memory option closest to 3,008 MB, one replica, one method.

    The option closest to 3,008 MB is used (ties go to the smaller one); with the paper's options
    that is 3,072 MB. The method, and for PIPELINED one beta for all layers, is the cheapest
    combination that meets the memory, payload and SLO constraints; None if none does.
    """
    start = time.perf_counter()
    memory = int(np.argmin(np.abs(inst.memory_mb - LAMBDAML_MEMORY_MB)))
    scored = [(c, evaluate(inst, c, slo_s)) for c in _lambdaml_choices(inst, memory)]
    feasible = [(c, e) for c, e in scored if e.feasible]
    if not feasible:
        return None
    choice, evaluation = min(feasible, key=lambda ce: ce[1].cost)
    method = Method(int(choice.method[0]))
    note = f"{inst.memory_mb[memory]:g} MB, 1 replica, {method.label}"
    if method is Method.PIPELINED:
        note += f" beta {int(choice.beta[0])}"
    return Solution("lambdaml", choice, evaluation, time.perf_counter() - start, None, note)


def uniform(
    inst: Instance, method: Method, slo_s: float | None, *, time_limit_s: float = 60.0
) -> Solution | None:
    """The optimal deployment using `method` in every layer (the MILP), or None if infeasible."""
    solution = solve_milp(inst, method, slo_s, time_limit_s=time_limit_s)
    if solution is None:
        return None
    return dataclasses.replace(solution, solver=f"uniform-{method.label}")


def random_methods(
    inst: Instance, slo_s: float | None, seed: int | None = None, *, time_limit_s: float = 60.0
) -> Solution | None:
    """A uniformly random method per layer, then the optimal options for that assignment.

    Returns None when the drawn methods cannot meet the constraints (e.g. direct transfer where
    no replica count brings the payload under the limit, or a tight SLO).
    """
    rng = np.random.default_rng(seed)
    drawn = [Method(int(m)) for m in rng.integers(1, len(Method) + 1, size=inst.layers)]
    solution = solve_milp_mixed(
        inst, slo_s, allowed=[(m,) for m in drawn], time_limit_s=time_limit_s
    )
    if solution is None:
        return None
    note = f"methods {' '.join(m.label for m in drawn)}; {solution.note}"
    return dataclasses.replace(solution, solver="random-methods", note=note)
