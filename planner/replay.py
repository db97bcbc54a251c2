"""A Plan re-evaluated on a batch it was not planned for: the request's real routing counts.

The plan fixes the decisions (method, beta, memory, replicas); the batch fixes the counts. The
cost model then predicts what every function of the deployed workflow takes on that batch, the
numbers `moelambda run-local` sets against the measured ones.
"""

from __future__ import annotations

import numpy as np

from ground.manifest import Manifest
from ground.plan import Plan, PlanError
from planner.build import instance_for
from planner.calibration import Calibration
from planner.costmodel import Choice, evaluate, expert_options
from planner.instance import Instance, Method

__all__ = ["choice_of", "function_seconds", "instance_of"]


def instance_of(plan: Plan, manifest: Manifest, counts: np.ndarray, tokens: int) -> Instance:
    """The planning instance of `plan`'s model and calibration serving a batch of `counts`."""
    calibration = Calibration.model_validate(plan.calibration)
    via_invoke = plan.direct_payload_bytes == calibration.invoke_payload_bytes
    payload = "invoke" if via_invoke else "step-functions"
    return instance_for(
        manifest, counts, calibration, tokens=tokens, arch=plan.arch, payload=payload
    )


def choice_of(plan: Plan, inst: Instance) -> Choice:
    """The decisions `plan` records, as indices into `inst`'s options (make_plan's inverse)."""
    memory = np.zeros((inst.layers, inst.experts), dtype=int)
    replicas = np.ones((inst.layers, inst.experts), dtype=int)
    for layer in plan.layers:
        for e in layer.experts:
            where = np.flatnonzero(inst.memory_mb == e.memory_mb)
            if where.size == 0:
                raise PlanError(
                    f"layer {layer.layer} expert {e.expert}: {e.memory_mb} MB is not a memory "
                    "option of the plan's calibration.",
                    "re-plan with `moelambda plan`; do not edit memory sizes by hand.",
                )
            memory[layer.layer, e.expert] = where[0]
            replicas[layer.layer, e.expert] = e.replicas
    return Choice(
        method=np.array([int(Method.parse(layer.method)) for layer in plan.layers]),
        beta=np.array([layer.beta for layer in plan.layers]),
        memory=memory,
        replicas=replicas,
    )


def function_seconds(inst: Instance, choice: Choice) -> dict[str, float]:
    """Predicted wall time of one call of every function, named as run-local reports them.

    Experts: one replica's t_rep (idle experts are not invoked and are left out). Layer (gate)
    functions: T^NE; a direct gate also waits for its slowest expert, as it invokes them itself.
    """
    ev = evaluate(inst, choice)
    seconds = {"head": float(inst.head_s)}
    experts = np.arange(inst.experts)
    for layer in range(inst.layers):
        name = f"layer{layer:02d}"
        method = Method(int(choice.method[layer]))
        gate = float(inst.layer_s[layer])
        if method is Method.DIRECT:
            opts = expert_options(inst, layer, method, int(choice.beta[layer]))
            g = choice.replicas[layer] - 1
            j = choice.memory[layer]
            gate += float(opts.send[experts, g].max() + opts.finish[experts, j, g].max())
        seconds[name] = gate
        for e in np.flatnonzero(inst.counts[layer] > 0):
            seconds[f"{name}/expert{e:02d}"] = float(ev.expert_time[layer, e])
    seconds["tail"] = float(inst.tail_s)
    return seconds
