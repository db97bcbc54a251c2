"""ODS, the paper's Optimal Deployment Search (Alg. 1, serverless-model.md §7).

1. Solve the fixed-method problem for each method, with the SLO (`solve_milp`): per-layer costs
   c[a, l] and layer solutions. A method whose fixed problem is infeasible (or finds nothing
   within its time limit) costs infinity everywhere.
2. Per layer take the method of least c[a, l], and the layer's part of that method's solution.
3. If the assembled deployment meets the SLO, return it. Otherwise take the layer of HIGHEST
   latency (the [fix]: the listing says argmin), set the cost of its chosen method to infinity
   and go back to 2, at most 2L times.
4. When nothing is left to swap, return the cheapest uniform-method solution (None if the SLO
   defeats all three methods).

Two choices the paper leaves open: the layer swapped is the slowest one that still has another
method left (swapping a layer's last method would end the search at once instead of trying the
next slowest layer), and when the search ends without a feasible mix, the uniform fallback.
ODS is a heuristic: it never claims optimality, and can cost more than the best uniform method.
"""

from __future__ import annotations

import time

import numpy as np

from ground.errors import UsageError
from planner.costmodel import Choice, Solution, evaluate
from planner.instance import Instance, Method
from planner.milp import solve_milp

__all__ = ["solve_ods"]


def _assemble(uniform: dict[Method, Solution], pick: np.ndarray) -> Choice:
    """Per layer, the part of the picked method's uniform solution."""
    parts = [uniform[Method(int(m))].choice for m in pick]
    return Choice(
        method=np.array([p.method[layer] for layer, p in enumerate(parts)]),
        beta=np.array([p.beta[layer] for layer, p in enumerate(parts)]),
        memory=np.stack([p.memory[layer] for layer, p in enumerate(parts)]),
        replicas=np.stack([p.replicas[layer] for layer, p in enumerate(parts)]),
    )


def _uniform(
    inst: Instance, slo_s: float | None, time_limit_s: float
) -> tuple[dict[Method, Solution], list[str]]:
    """Step 1: the three fixed-method solutions, and a word on each method that has none.

    A method whose MILP ends its time limit without any deployment is left out like an
    infeasible one: ODS is a heuristic and can still combine the other two.
    """
    found, missing = {}, []
    for method in Method:
        try:
            solution = solve_milp(inst, method, slo_s, time_limit_s=time_limit_s)
        except UsageError:
            missing.append(f"{method.label} found nothing in {time_limit_s:g} s")
            continue
        if solution is None:
            missing.append(f"{method.label} infeasible")
        else:
            found[method] = solution
    return found, missing


def _layer_costs(inst: Instance, uniform: dict[Method, Solution]) -> np.ndarray:
    """(3, L) c[a, l]: each method's per-layer cost in its own solution, inf when infeasible."""
    costs = np.full((len(Method), inst.layers), np.inf)
    for method, solution in uniform.items():
        costs[int(method) - 1] = solution.evaluation.layer_cost
    return costs


def solve_ods(
    inst: Instance, slo_s: float | None, *, time_limit_s: float = 60.0
) -> Solution | None:
    """Run ODS (module docstring) and return its deployment, or None if no method meets the SLO.

    Args:
        inst: The planning instance.
        slo_s: End-to-end latency limit in seconds, None for no limit.
        time_limit_s: Time limit of each of the three MILP solves. Defaults to 60.

    Returns:
        Solution with solver "ods", optimal None, and in `note` the number of swaps or the
        uniform method it fell back to.
    """
    start = time.perf_counter()
    uniform, missing = _uniform(inst, slo_s, time_limit_s)
    if not uniform:
        return None
    costs = _layer_costs(inst, uniform)
    swaps = 0
    while True:
        pick = np.argmin(costs, axis=0) + 1  # Method values
        choice = _assemble(uniform, pick)
        evaluation = evaluate(inst, choice, slo_s)
        if evaluation.feasible:
            methods = " ".join(Method(int(m)).label for m in pick)
            note = "; ".join(
                [f"{swaps} swap{'' if swaps == 1 else 's'}", f"methods {methods}", *missing]
            )
            return Solution("ods", choice, evaluation, time.perf_counter() - start, None, note)
        open_layers = np.flatnonzero(np.isfinite(costs).sum(axis=0) >= 2)
        if open_layers.size == 0 or swaps == 2 * inst.layers:
            break
        slowest = open_layers[np.argmax(evaluation.layer_latency[open_layers])]
        costs[pick[slowest] - 1, slowest] = np.inf
        swaps += 1
    best = min(uniform.values(), key=lambda s: s.cost)
    method = Method(int(best.choice.method[0]))
    note = "; ".join(
        [f"no feasible mix after {swaps} swaps, fell back to uniform {method.label}", *missing]
    )
    return Solution("ods", best.choice, best.evaluation, time.perf_counter() - start, None, note)
