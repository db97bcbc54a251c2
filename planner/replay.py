"""A Plan re-evaluated on a batch it was not planned for: the request's real routing counts.

The plan fixes the decisions (method, beta, memory, replicas); the batch fixes the counts. The
cost model then predicts what every function of the deployed workflow takes on that batch, the
numbers `moelambda run-local` sets against the measured ones.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from pydantic import ValidationError

from ground.manifest import Manifest
from ground.plan import Plan, PlanError
from ground.semantics import adapts, runtime_replicas
from planner.build import instance_for
from planner.calibration import Calibration
from planner.costmodel import Choice, Evaluation, evaluate, expert_options, price, usage
from planner.driver import (
    DriverChoice,
    DriverEvaluation,
    DriverInstance,
    driver_instance,
    driver_usage,
    evaluate_driver,
    remote_options,
)
from planner.hardware.gpu_driver import gpu_driver_of
from planner.instance import Instance, Method
from planner.packing import pack

__all__ = [
    "PlanEvaluation",
    "calibration_of",
    "choice_of",
    "driver_of",
    "evaluate_plan",
    "function_seconds",
    "instance_of",
    "price_usage",
    "runtime_choice",
]


def calibration_of(plan: Plan) -> Calibration:
    """The calibration `plan` was made with.

    Raises:
        PlanError: It lacks an entry this version needs (a plan made by an older moelambda).
    """
    try:
        return Calibration.model_validate(plan.calibration)
    except ValidationError as err:
        missing = ", ".join(str(e["loc"][0]) for e in err.errors() if e["loc"])
        raise PlanError(
            f"the plan's calibration does not validate ({missing}): it was made by an older "
            "moelambda.",
            "make the plan again with `moelambda plan`.",
        ) from None


def instance_of(plan: Plan, manifest: Manifest, counts: np.ndarray, tokens: int) -> Instance:
    """The planning instance of `plan`'s model and calibration serving a batch of `counts`."""
    calibration = calibration_of(plan)
    via_invoke = plan.direct_payload_bytes == calibration.invoke_payload_bytes
    payload = "invoke" if via_invoke else "step-functions"
    inst = instance_for(
        manifest,
        counts,
        calibration,
        tokens=tokens,
        arch=plan.arch,
        workflow=plan.workflow,
        objective=plan.objective,
        payload=payload,
    )
    if not plan.packed:
        return inst
    return pack(inst, np.array([[e.hosted for e in layer.experts] for layer in plan.layers]))


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


def runtime_choice(plan: Plan, inst: Instance) -> Choice:
    """The plan's decisions as the gates apply them to `inst.counts`: replicas follow the counts.

    An s3 or direct gate spreads an expert's real tokens over as many replicas as memory and
    payload need (`ground.semantics.runtime_replicas`, up to the plan's cap); pipelined layers
    keep the plan's replicas.

    Raises:
        PlanError: An expert's real tokens need more replicas than its cap: the gate refuses it.
    """
    choice = choice_of(plan, inst)
    replicas = choice.replicas.copy()
    tokens = np.ceil(inst.counts)
    for layer in plan.layers:
        if not adapts(Method.parse(layer.method)):
            continue
        cap = np.array([e.max_replicas for e in layer.experts])
        fit = np.array([e.max_tokens_per_replica for e in layer.experts])
        wanted = runtime_replicas(tokens[layer.layer], replicas[layer.layer], cap, fit)
        over = np.flatnonzero(wanted > cap)
        if over.size:
            e = int(over[0])
            raise PlanError(
                f"layer {layer.layer} expert {e}: {int(tokens[layer.layer, e])} tokens need "
                f"{wanted[e]} replicas of at most {fit[e]} tokens, over its cap of {cap[e]}.",
                "re-plan with more memory for this expert, or a larger max_replicas (G).",
            )
        replicas[layer.layer] = wanted
    return Choice(choice.method, choice.beta, choice.memory, replicas)


def driver_of(
    plan: Plan, manifest: Manifest, counts: np.ndarray, tokens: int
) -> tuple[DriverInstance, DriverChoice]:
    """A driver or monolithic plan's problem on a batch of `counts`, and its decisions as the
    driver applies them: each remote expert's replicas follow its real tokens (up to its cap),
    as `functions.driver` splits them.

    Raises:
        PlanError: An expert's real tokens need more replicas than its cap.
    """
    assert plan.driver is not None
    calibration = calibration_of(plan)
    base = instance_for(
        manifest,
        np.asarray(counts, dtype=float),
        calibration,
        tokens=tokens,
        arch=plan.arch,
        workflow=plan.workflow,
    )
    dinst = driver_instance(base, manifest, calibration, memory_mb=[plan.nonmoe_memory_mb])
    dinst = dataclasses.replace(dinst, payload_limit=plan.direct_payload_bytes)
    shape = (base.layers, base.experts)
    local = np.zeros(shape, bool)
    memory = np.zeros(shape, int)
    replicas = np.ones(shape, int)
    tokens_now = np.ceil(base.counts)
    for layer, own in zip(plan.layers, plan.driver.local, strict=True):
        local[layer.layer, own] = True
        for e in layer.experts:
            i = e.hosted[0]
            where = np.flatnonzero(base.memory_mb == e.memory_mb)
            if where.size == 0:
                raise PlanError(
                    f"layer {layer.layer} expert {i}: {e.memory_mb} MB is not a memory option "
                    "of the plan's calibration.",
                    "re-plan with `moelambda plan`; do not edit memory sizes by hand.",
                )
            memory[layer.layer, i] = where[0]
            wanted = runtime_replicas(
                tokens_now[layer.layer, i : i + 1],
                np.array([e.replicas]),
                np.array([e.max_replicas]),
                np.array([e.max_tokens_per_replica]),
            )[0]
            if wanted > e.max_replicas:
                raise PlanError(
                    f"layer {layer.layer} expert {i}: {int(tokens_now[layer.layer, i])} tokens "
                    f"need {wanted} replicas of at most {e.max_tokens_per_replica}, over its "
                    f"cap of {e.max_replicas}.",
                    "re-plan with more memory for this expert, or a larger max_replicas (G).",
                )
            replicas[layer.layer, i] = wanted
    return dinst, DriverChoice(0, local, memory, replicas)


@dataclasses.dataclass(frozen=True, eq=False)
class PlanEvaluation:
    """What the model says one execution of a plan does on a batch: its latency, each
    function's seconds per call (named as run-local reports them: `function_seconds` for the
    workflow; the driver's whole run and each busy remote expert's replica for a driver), what
    the meter counts (`usage`), USD by item (`bill`), and per function in the order of
    `plan.topology.function_names` when its invocation starts after the request is dispatched
    (`offset_s`) and how long it is billed (`duration_s`): what the traffic simulator replays.
    """

    latency_s: float
    seconds: dict[str, float]
    usage: dict[str, float]
    bill: dict[str, float]
    offset_s: np.ndarray
    duration_s: np.ndarray


def evaluate_plan(
    plan: Plan, manifest: Manifest, counts: np.ndarray, tokens: int
) -> PlanEvaluation:
    """The one re-scorer: `plan`'s decisions on a batch of `tokens` routed as `counts`, by the
    model its shape was planned with, built once (run-local, generate, replan and the traffic
    model read it).

    Raises:
        PlanError: A batch the plan's caps cannot take (`runtime_choice`, `driver_of`).
    """
    if plan.topology.driven:
        dinst, choice = driver_of(plan, manifest, counts, tokens)
        dinst = gpu_driver_of(plan, calibration_of(plan), manifest, dinst, choice.local)
        ev = evaluate_driver(dinst, choice)
        used = driver_usage(dinst, choice, ev)
        seconds = {"driver": ev.latency}
        busy = (np.ceil(dinst.base.counts) > 0) & ~choice.local
        for layer in plan.layers:
            for e in layer.experts:
                if busy[layer.layer, e.hosted[0]]:
                    name = f"layer{layer.layer:02d}/expert{e.expert:02d}"
                    seconds[name] = float(ev.expert_time[layer.layer, e.hosted[0]])
        offset, duration = _driver_timeline(plan, dinst, choice, ev)
        bill = price(dinst.base, used, ev.latency)
        return PlanEvaluation(ev.latency, seconds, used, bill, offset, duration)
    inst = instance_of(plan, manifest, np.asarray(counts, dtype=float), tokens)
    choice = runtime_choice(plan, inst)
    wf = evaluate(inst, choice)
    used = usage(inst, choice, wf)
    offset, duration = _workflow_timeline(inst, choice, wf)
    seconds = function_seconds(inst, choice, wf)
    return PlanEvaluation(
        wf.latency, seconds, used, price(inst, used, wf.latency), offset, duration
    )


def _workflow_timeline(
    inst: Instance, choice: Choice, ev: Evaluation
) -> tuple[np.ndarray, np.ndarray]:
    """Per function of the fan-out workflow (head, per layer its gate and expert functions,
    tail), its start after dispatch and its billed seconds. A pipelined layer's replicas start
    with their gate, a direct layer's once the gate has sent their rows, an s3 layer's once
    the gate's upload is done."""
    count = 2 + inst.layers * (1 + inst.experts)
    offset, duration = np.zeros(count), np.zeros(count)
    duration[0] = inst.head_s
    t = float(inst.head_s)
    f = 1
    experts = np.arange(inst.experts)
    for layer in range(inst.layers):
        method = Method(int(choice.method[layer]))
        pre = float(inst.layer_s[layer])
        routed = float(np.ceil(inst.counts[layer]).sum())
        opts = expert_options(inst, layer, method, int(choice.beta[layer]))
        j, g = choice.memory[layer], choice.replicas[layer] - 1
        time, finish = opts.time[experts, j, g], opts.finish[experts, j, g]
        offset[f] = t
        if method is Method.DIRECT:
            duration[f] = pre + float(ev.layer_latency[layer])
            store = inst.s3_delay_s + routed * inst.token_bytes_out / inst.s3_bandwidth
            start = t + pre + finish - time - store
        else:
            duration[f] = pre + inst.s3_delay_s + routed * inst.token_bytes_in / inst.s3_bandwidth
            start = t + pre + finish - time if method is Method.S3 else np.full(inst.experts, t)
        offset[f + 1 : f + 1 + inst.experts] = start
        duration[f + 1 : f + 1 + inst.experts] = time
        f += 1 + inst.experts
        t += pre + float(ev.layer_latency[layer])
    offset[f] = t
    duration[f] = inst.tail_s
    return offset, duration


def _driver_timeline(
    plan: Plan, dinst: DriverInstance, choice: DriverChoice, ev: DriverEvaluation
) -> tuple[np.ndarray, np.ndarray]:
    """Per function of a driven plan (the driver, then each layer's remote expert functions),
    its start after dispatch and its billed seconds: the driver from 0 for the whole request;
    a remote expert from when the driver, done with its layer's stage, has sent its rows."""
    b = dinst.base
    tokens = b.tokens
    count = 1 + sum(len(layer.experts) for layer in plan.layers)
    offset, duration = np.zeros(count), np.zeros(count)
    duration[0] = ev.latency
    t = b.warm_start_s + b.s3_delay_s + tokens * 8 / b.s3_bandwidth  # the ids read
    f = 1
    experts = np.arange(b.experts)
    for layer in plan.layers:
        e = layer.layer
        t += tokens * float(dinst.u_layer[choice.memory, e])
        opts = remote_options(dinst, e)
        j, g = choice.remote_memory[e], choice.replicas[e] - 1
        time, finish = opts.time[experts, j, g], opts.finish[experts, j, g]
        for x in layer.experts:
            i = x.hosted[0]
            offset[f] = t + float(finish[i] - time[i])
            duration[f] = float(time[i])
            f += 1
        t += float(ev.layer_latency[e])
    return offset, duration


def price_usage(plan: Plan, used: dict[str, float], seconds: float) -> dict[str, float]:
    """USD by item of a metered usage at the plan's prices; `seconds` is the execution's."""
    calibration = calibration_of(plan)
    zeros = np.zeros((1, 1))
    prices = Instance.build(
        zeros,
        calibration,
        expert_bytes=zeros,
        token_bytes=1,
        compute_s=np.zeros(len(calibration.memory_options_mb)),
        nonmoe_compute_s=0.0,
        tokens=1,
        arch=plan.arch,
        workflow=plan.workflow,
        objective=plan.objective,
    )
    return price(prices, used, seconds)


def function_seconds(
    inst: Instance, choice: Choice, ev: Evaluation | None = None
) -> dict[str, float]:
    """Predicted billed seconds of one call of every function, named as run-local reports them.

    Experts: one busy replica's billed time (idle s3/direct experts are not invoked and are left
    out). Gates: their `layer_s` plus the upload (s3, pipelined) or the whole layer (direct).
    `ev` is the choice's evaluation where the caller has it.
    """
    ev = evaluate(inst, choice) if ev is None else ev
    seconds = {"head": float(inst.head_s)}
    for layer in range(inst.layers):
        name = f"layer{layer:02d}"
        method = Method(int(choice.method[layer]))
        gate = float(inst.layer_s[layer])
        if method is Method.DIRECT:
            gate += float(ev.layer_latency[layer])
        else:
            routed = float(np.ceil(inst.counts[layer]).sum())
            gate += inst.s3_delay_s + routed * inst.token_bytes_in / inst.s3_bandwidth
        seconds[name] = gate
        busy = inst.counts[layer] > 0
        if method is Method.PIPELINED:
            busy[:] = True
        for e in np.flatnonzero(busy):
            seconds[f"{name}/expert{e:02d}"] = float(ev.expert_time[layer, e])
    seconds["tail"] = float(inst.tail_s)
    return seconds
