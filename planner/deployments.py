"""The deployment shapes as candidates: one function, a driver, the fan-out workflow.

`plan --deployment auto` plans every shape for the same batch and SLO and deploys the cheapest
that meets it; `candidates` reports each with its bill and latency, or why it is infeasible.
The workflow is planned by `planner.deploy` as before; the monolithic function and the driver by
`planner.driver`. Each shape is priced as its deployed form bills it (the full bill), so the
numbers compare. Under the paper's `experts` objective only the workflow is planned: a
function that holds its experts has no expert functions to price.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ground.errors import InfeasibleError
from ground.manifest import Manifest
from ground.plan import DriverPlan, ExpertPlan, GenerationPlan, LayerPlan, Plan, Totals
from ground.topology import topology
from planner.calibration import Calibration
from planner.costmodel import tokens_that_fit
from planner.driver import (
    DriverInstance,
    DriverSolution,
    driver_bill,
    driver_instance,
)
from planner.driver_solver import solve_driver, solve_monolithic
from planner.generation import GenerationInstance, GenerationSolution
from planner.instance import Instance
from planner.plan_writer import write_plan

__all__ = [
    "Candidate",
    "driver_plan",
    "generation_plan",
    "plan_driver_shape",
]


@dataclass(frozen=True, eq=False)
class Candidate:
    """One shape planned for the batch: its plan when feasible, else why not."""

    deployment: str
    plan: Plan | None
    reason: str | None
    latency_s: float | None = None
    bill_usd: float | None = None
    smallest_slo_s: float | None = None

    def describe(self) -> dict[str, Any]:
        """The JSON entry `plan` prints under `candidates`."""
        plan = self.plan
        local = None
        functions = None
        if plan is not None:
            local = 0 if plan.driver is None else sum(len(x) for x in plan.driver.local)
            functions = len(plan.topology.function_names(plan.layers))
        return {
            "deployment": self.deployment,
            "bill_usd": self.bill_usd,
            "latency_s": None if self.latency_s is None else round(self.latency_s, 6),
            "smallest_slo_s": (
                None if self.smallest_slo_s is None else round(self.smallest_slo_s, 6)
            ),
            "feasible": self.reason is None,
            "local_experts": local,
            "functions": functions,
            "memory_mb": None if plan is None else plan.nonmoe_memory_mb,
            "reason": self.reason,
        }


def plan_driver_shape(
    deployment: str,
    base: Instance,
    manifest: Manifest,
    calibration: Calibration,
    slo_s: float | None,
    counts_source: dict[str, Any],
    *,
    choose_workflow: bool = True,
) -> tuple[Plan, DriverSolution]:
    """The cheapest `deployment` ("monolithic" or "driver") plan of `base`'s batch.

    The one-state workflow that starts the driver is Express while the request fits its
    duration limit, else Standard (`choose_workflow`; else `base.workflow` as given).

    Raises:
        InfeasibleError: No plan of this shape; the message says why.
    """
    solve = solve_driver if topology(deployment).expert_functions == "some" else solve_monolithic
    dinst = driver_instance(base, manifest, calibration)
    solution = solve(dinst, slo_s)
    if choose_workflow and solution.latency > calibration.express_max_duration_s:
        dinst = driver_instance(
            dataclasses.replace(base, workflow="standard"), manifest, calibration
        )
        solution = solve(dinst, slo_s)
    return driver_plan(dinst, solution, manifest, calibration, slo_s, counts_source), solution


def driver_plan(
    dinst: DriverInstance,
    solution: DriverSolution,
    manifest: Manifest,
    calibration: Calibration,
    slo_s: float | None,
    counts_source: dict[str, Any],
) -> Plan:
    """The Plan document of a driver or monolithic solution.

    Each remote expert gets its own function (slot = its rank among the layer's remote
    experts), invoked by the driver; its cap is G replicas, over which the driver spreads a
    batch's real tokens as a direct gate does, each replica taking what its memory holds.
    """
    base, choice, ev = dinst.base, solution.choice, solution.evaluation
    layers = []
    for layer in range(base.layers):
        remote = np.flatnonzero(~choice.local[layer])
        memory = base.memory_mb[choice.remote_memory[layer]]
        fits = tokens_that_fit(base, layer, memory)
        experts = [
            ExpertPlan(
                expert=slot,
                hosts=[int(i)],
                memory_mb=int(memory[i]),
                replicas=int(choice.replicas[layer, i]),
                tokens=float(base.counts[layer, i]),
                time_s=float(ev.expert_time[layer, i]),
                cost_usd=float(ev.expert_cost[layer, i]),
                max_replicas=base.max_replicas,
                max_tokens_per_replica=max(int(fits[i]), 1),
            )
            for slot, i in enumerate(remote)
        ]
        layers.append(
            LayerPlan(
                layer=layer,
                method="direct",
                beta=1,
                latency_s=float(ev.layer_latency[layer]),
                cost_usd=float(ev.expert_cost[layer].sum())
                + dinst.rho(choice.memory) * float(ev.layer_latency[layer]),
                experts=experts,
            )
        )
    local = [[int(i) for i in np.flatnonzero(choice.local[e])] for e in range(base.layers)]
    local_mb = int(choice.local.sum()) * dinst.unit_mb
    activations = dinst.activations_local_mb if choice.monolithic else dinst.activations_mb
    return write_plan(
        manifest,
        calibration,
        solver="exact",
        workflow=base.workflow,
        objective="full",
        nonmoe_memory_mb=int(dinst.memory_mb[choice.memory]),
        optimal=solution.optimal,
        arch=base.arch,
        direct_payload_bytes=dinst.payload_limit,
        counts_source=counts_source,
        layers=layers,
        totals=Totals(
            tokens=base.tokens,
            moe_cost_usd=ev.experts_usd,
            bill_usd=driver_bill(dinst, choice, ev),
            latency_s=ev.latency,
            slo_s=slo_s,
        ),
        deployment=solution.deployment,
        driver=DriverPlan(
            local=local,
            local_tokens=[[float(base.counts[e, i]) for i in own] for e, own in enumerate(local)],
            time_s=ev.latency,
            weights_mb=round(dinst.nonmoe_mb + local_mb, 3),
            activations_mb=round(activations, 3),
        ),
    )


def generation_plan(
    ginst: GenerationInstance,
    solution: GenerationSolution,
    manifest: Manifest,
    calibration: Calibration,
    counts_source: dict[str, Any],
) -> Plan:
    """The Plan document of a generating driver or one function (`planner.generation`).

    Its functions, `totals` and their bill are the prefill's (`driver_plan` of B x P tokens,
    under the TTFT SLO); `driver.time_s` is the whole invocation; `generation` holds the rest.
    The bill per million input tokens is the prefill's exact bill (`driver_bill`) over its
    tokens, per million output tokens the decode steps' over the B x G new tokens.
    """
    ev, choice, dinst = solution.evaluation, solution.choice, ginst.prefill
    driver_solution = DriverSolution(
        deployment=solution.deployment,
        choice=choice.driver_choice(ginst),
        evaluation=ev.prefill,
        seconds=solution.seconds,
        optimal=None,
        min_latency=ev.ttft_s,
        note="local sets: each layer's most popular experts; one memory and replica count "
        "for every remote expert",
    )
    plan = driver_plan(
        dinst, driver_solution, manifest, calibration, solution.slo_ttft_s, counts_source
    )
    prompts = ginst.sequences * ginst.prompt_tokens
    generation = GenerationPlan(
        batch_sequences=ginst.sequences,
        prompt_tokens=ginst.prompt_tokens,
        new_tokens=ginst.new_tokens,
        slo_ttft_s=solution.slo_ttft_s,
        slo_tpot_s=solution.slo_tpot_s,
        ttft_s=ev.ttft_s,
        tpot_s=ev.tpot_s,
        bill_per_million_input_usd=plan.totals.bill_usd["total_usd"] / prompts * 1e6,
        bill_per_million_output_usd=ginst.steps
        * ev.step_usd
        / (ginst.sequences * ginst.new_tokens)
        * 1e6,
        invokes_per_step=ev.invokes_per_step,
        kv_cache_mb=ginst.kv_mb,
    )
    assert plan.driver is not None
    return write_plan(
        manifest,
        calibration,
        solver="generation",
        workflow=plan.workflow,
        objective=plan.objective,
        nonmoe_memory_mb=plan.nonmoe_memory_mb,
        optimal=plan.optimal,
        arch=plan.arch,
        direct_payload_bytes=plan.direct_payload_bytes,
        counts_source=counts_source,
        layers=plan.layers,
        totals=plan.totals,
        deployment=plan.deployment,
        driver=plan.driver.model_copy(update={"time_s": generation.run_s}),
        generation=generation,
    )


def infeasible_everywhere(candidates: list[Candidate], slo_s: float | None) -> InfeasibleError:
    """One error for `auto` when no shape meets the SLO: each shape's reason, and the
    smallest SLO any of them meets."""
    reasons = "; ".join(f"{c.deployment}: {c.reason}" for c in candidates)
    smallest = [c.smallest_slo_s for c in candidates if c.smallest_slo_s is not None]
    if slo_s is not None and smallest:
        fix = f"pass --slo {min(smallest):.3f} or more, or plan for fewer --tokens."
    else:
        fix = "plan for fewer --tokens, or change the calibration's limits."
    return InfeasibleError(f"no deployment shape can serve this batch ({reasons}).", fix)
