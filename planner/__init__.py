"""Planning: calibration, cost model, solvers and the `Plan` they produce.

`instance_for` turns a model's manifest, predicted counts and the calibration into an `Instance`;
`solve_exact` (per-layer Pareto frontiers merged by a knapsack), `solve_ods` (the paper's
Algorithm 1) and `solve_milp` / `solve_milp_mixed` (HiGHS, or Gurobi when licensed) choose the
methods, memory sizes and replicas; `make_plan` writes the result as a validated `Plan`.
`plan_deployment` does what `moelambda plan` does, from a manifest and `counts_for_plan`'s counts.
"""

from __future__ import annotations

from ground.plan import Plan, PlanError
from planner.api import (
    PlannedDeployment,
    PlanningCounts,
    PlanOptions,
    counts_for_plan,
    plan_deployment,
    serverless_best,
    shape_counts_for_plan,
    write_pareto,
)
from planner.baselines import lambdaml, random_methods, uniform
from planner.build import instance_for, make_plan
from planner.calibration import Calibration, default_calibration_path, load_calibration
from planner.costmodel import Choice, Evaluation, Solution, bill, evaluate, expert_options, usage
from planner.exact import Frontier, solve_bounded, solve_exact, solve_frontier
from planner.instance import Instance, Method
from planner.milp import solve_milp, solve_milp_mixed
from planner.ods import solve_ods
from planner.replay import (
    PlanEvaluation,
    choice_of,
    evaluate_plan,
    function_seconds,
    instance_of,
    price_usage,
)

__all__ = [
    "Calibration",
    "Choice",
    "Evaluation",
    "Frontier",
    "Instance",
    "Method",
    "Plan",
    "PlanEvaluation",
    "PlanError",
    "PlanOptions",
    "PlannedDeployment",
    "PlanningCounts",
    "Solution",
    "bill",
    "choice_of",
    "counts_for_plan",
    "default_calibration_path",
    "evaluate",
    "evaluate_plan",
    "expert_options",
    "function_seconds",
    "instance_for",
    "instance_of",
    "lambdaml",
    "load_calibration",
    "make_plan",
    "plan_deployment",
    "price_usage",
    "random_methods",
    "serverless_best",
    "shape_counts_for_plan",
    "solve_bounded",
    "solve_exact",
    "solve_frontier",
    "solve_milp",
    "solve_milp_mixed",
    "solve_ods",
    "uniform",
    "usage",
    "write_pareto",
]
