"""Time, cost and latency of MoE layers (serverless-model.md §4-§5), vectorised over the options.

For one layer, method and pipeline degree beta, `expert_options` evaluates every expert at every
memory option j and replica count g at once, as (E, J, G) arrays. Solvers choose one (j, g) per
expert; `evaluate` re-checks any complete choice against every constraint, and `bill` prices it in
full. One implementation serves the planner, the solvers' property tests and the BO simulator.

Fixed forms of the paper's formulas (the [fix] notes of the design):

* tokens per replica r = ceil(d / g): a replica processes whole tokens;
* pipelined: minibatches of b = min(beta, r) tokens,
  t_rep = T^h + ceil(r / b) * (T^dl + b * max(D^in/B^s + U_j, D^o/B^s)) + T^dl + b * D^o/B^s;
* an expert reading from S3 cannot finish before the gate has uploaded its input: with the gate
  uploading all of the layer's tokens at B^s (T^up = T^dl + sum_i d_i D^in / B^s),
  S3: finish = max(T^h, T^up) + 2 T^dl + r ((D^in + D^o)/B^s + U_j),
  pipelined: finish = max(T^h + body, T^up + one block + the last upload);
* direct: feasible only if r * D^in <= D^p and r * D^o <= D^p;
* memory: P + M^itrm + resident tokens * (D^in + D^o) <= M_j, with resident = r (or 2b when
  pipelined with `pipelined_residency`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.instance import MB, Instance, Method

__all__ = [
    "Choice",
    "Evaluation",
    "Options",
    "Solution",
    "bill",
    "evaluate",
    "expert_options",
    "layer_latency",
]


@dataclass(frozen=True, eq=False)
class Options:
    """Every (memory j, replicas g) option of every expert of one layer, method and beta.

    Arrays are (E, J, G); `send` is (E, G) (the gate's direct send time, 0 for S3 methods).
    Experts with no tokens cost nothing and finish at 0 whatever they are given.
    """

    layer: int
    method: Method
    beta: int
    time: np.ndarray  # t_rep of one replica
    cost: np.ndarray  # $ for all g replicas: g * t_rep * M_j * price
    finish: np.ndarray  # when the expert's last replica is done, from the layer's start
    feasible: np.ndarray  # memory (and payload for direct) constraints hold
    send: np.ndarray


def _shape(inst: Instance, layer: int) -> tuple[np.ndarray, ...]:
    d = inst.counts[layer][:, None, None]  # (E,1,1)
    g = inst.replicas[None, None, :].astype(float)  # (1,1,G)
    r = np.ceil(d / g)  # (E,1,G)
    u = inst.compute_s[None, :, None]  # (1,J,1)
    m = inst.memory_mb[None, :, None]  # (1,J,1)
    return d, g, r, u, m


def expert_options(inst: Instance, layer: int, method: Method, beta: int = 1) -> Options:
    """Times, costs and feasibility of every option of every expert (formulas above)."""
    d, g, r, u, m = _shape(inst, layer)
    bs, dl = inst.s3_bandwidth, inst.s3_delay_s
    d_in, d_out = inst.token_bytes_in, inst.token_bytes_out
    head = inst.warm_start_s + dl + inst.expert_bytes[layer][:, None, None] / bs  # T^h (E,1,1)
    upload_all = dl + inst.counts[layer].sum() * d_in / bs  # T^up, the gate's upload
    resident = r
    send = np.zeros((inst.experts, inst.max_replicas))
    if method is Method.PIPELINED:
        b = np.maximum(np.minimum(float(beta), r), 1.0)
        block = dl + b * np.maximum(d_in / bs + u, d_out / bs)
        last = dl + b * d_out / bs
        body = np.ceil(r / b) * block + last
        time = head + body
        finish = np.maximum(head + body, upload_all + block + last)
        if inst.pipelined_residency:
            resident = np.minimum(2 * b, r)
    elif method is Method.S3:
        body = 2 * dl + r * ((d_in + d_out) / bs + u)
        time = head + body
        finish = np.maximum(head, upload_all) + body
    else:
        time = head + r * (d_out / inst.invoke_bandwidth + u)
        finish = time
        send = (r * d_in / inst.invoke_bandwidth)[:, 0, :]
    need_mb = inst.expert_bytes[layer][:, None, None] / MB + inst.runtime_mb
    feasible = need_mb + resident * (d_in + d_out) / MB <= m
    if method is Method.DIRECT:
        payload = r * max(d_in, d_out) <= inst.direct_payload_bytes
        feasible = feasible & payload
    cost = g * time * m * inst.price_mb_s
    idle = d == 0
    shape = (inst.experts, inst.memory_mb.size, inst.max_replicas)
    time, cost, finish = (np.broadcast_to(a, shape).copy() for a in (time, cost, finish))
    feasible = np.broadcast_to(feasible, shape).copy()
    idle = np.broadcast_to(idle, shape)
    time[idle] = cost[idle] = finish[idle] = 0.0
    feasible[idle] = True
    send[inst.counts[layer] == 0] = 0.0
    return Options(layer, method, int(beta), time, cost, finish, feasible, send)


def layer_latency(
    inst: Instance,
    layer: int,
    method: Method,
    finish_max: float | np.ndarray,
    send_max: float | np.ndarray = 0.0,
) -> float | np.ndarray:
    """MoE-E2E latency of a layer given its slowest expert (and, for direct, slowest send).

    Takes arrays of candidate maxima too, so solvers can evaluate many thresholds at once.
    """
    if method is Method.DIRECT:
        return send_max + finish_max + float(inst.load_s[layer])
    out = inst.s3_delay_s + inst.counts[layer].sum() * inst.token_bytes_out / inst.s3_bandwidth
    return np.maximum(finish_max, float(inst.load_s[layer])) + out


@dataclass(frozen=True)
class Choice:
    """A complete decision: per layer method and beta; per expert memory index and replicas."""

    method: np.ndarray  # (L,) Method values
    beta: np.ndarray  # (L,)
    memory: np.ndarray  # (L, E) index into memory_mb
    replicas: np.ndarray  # (L, E) 1..G


@dataclass(frozen=True)
class Evaluation:
    """A choice re-evaluated by the model: costs, latencies, and what it violates."""

    expert_cost: np.ndarray  # (L, E) $
    expert_time: np.ndarray  # (L, E) t_rep of one replica
    layer_cost: np.ndarray  # (L,)
    layer_latency: np.ndarray  # (L,) t^lat_e
    latency: float  # end to end, including non-MoE functions
    cost: float  # the paper's objective: all expert functions
    violations: list[str]

    @property
    def feasible(self) -> bool:
        return not self.violations


def evaluate(inst: Instance, choice: Choice, slo_s: float | None = None) -> Evaluation:
    """Cost and latency of `choice`, with every violated constraint named."""
    cost = np.zeros((inst.layers, inst.experts))
    time = np.zeros_like(cost)
    latency = np.zeros(inst.layers)
    violations = []
    experts = np.arange(inst.experts)
    for layer in range(inst.layers):
        method = Method(int(choice.method[layer]))
        opts = expert_options(inst, layer, method, int(choice.beta[layer]))
        j, g = choice.memory[layer], choice.replicas[layer] - 1
        cost[layer] = opts.cost[experts, j, g]
        time[layer] = opts.time[experts, j, g]
        for e in np.flatnonzero(~opts.feasible[experts, j, g]):
            what = "payload or memory" if method is Method.DIRECT else "memory"
            violations.append(f"layer {layer} expert {e}: {what} limit")
        latency[layer] = layer_latency(
            inst,
            layer,
            method,
            float(opts.finish[experts, j, g].max()),
            float(opts.send[experts, g].max()),
        )
    total = inst.fixed_s() + float(latency.sum())
    if slo_s is not None and total > slo_s * (1 + 1e-9):
        violations.append(f"latency {total:.4f} s exceeds the SLO {slo_s:.4f} s")
    return Evaluation(cost, time, cost.sum(axis=1), latency, total, float(cost.sum()), violations)


# Step Functions states one request enters per layer, besides one per shard the Map invokes:
# s3 = gate Task + Map; direct = gate Task (it invokes its experts itself); pipelined = Parallel,
# gate Task, static shard Pass, Map, output Pass and the Choice that checks the gate.
_LAYER_STATES = {Method.PIPELINED: 6, Method.S3: 2, Method.DIRECT: 1}


def bill(inst: Instance, choice: Choice, evaluation: Evaluation) -> dict[str, float]:
    """The full bill of one batch, beyond the paper's expert-only objective.

    Non-MoE functions, Lambda requests, S3 requests (weights are fetched on every start, as the
    head time T^h assumes; pipelining multiplies data requests by the minibatch count) and Step
    Functions transitions of the emitted workflow (head, tail, the layers' states, one per
    shard a Map invokes; a pipelined Map invokes every planned replica, busy or not).
    """
    active = inst.counts > 0
    replicas = np.where(active, choice.replicas, 0)
    shards = int(replicas.sum())
    nonmoe_s = inst.head_s + inst.tail_s + float(inst.layer_s.sum())
    d = inst.counts
    r = np.ceil(d / np.maximum(choice.replicas, 1))
    beta = np.maximum(np.minimum(choice.beta[:, None], r), 1)
    methods = [Method(int(m)) for m in choice.method]
    piped = choice.method[:, None] == Method.PIPELINED
    pieces = np.where(piped, np.ceil(r / beta), 1.0)
    s3_data = np.where(choice.method[:, None] == Method.DIRECT, 0.0, 2.0 * pieces * replicas)
    puts = float(s3_data.sum())  # the gate's inputs and the experts' outputs
    gets = float(s3_data.sum()) + shards + inst.layers + 2  # data, then every function's weights
    mapped = np.where(
        piped, choice.replicas, np.where(choice.method[:, None] == Method.S3, replicas, 0)
    )
    transitions = 2 + sum(_LAYER_STATES[m] for m in methods) + int(mapped.sum())
    bill = {
        "experts_usd": evaluation.cost,
        "nonmoe_usd": nonmoe_s * inst.nonmoe_memory_mb * inst.price_mb_s,
        "requests_usd": (shards + inst.layers + 2) * inst.request_usd,
        "s3_usd": puts * inst.s3_put_usd + gets * inst.s3_get_usd,
        "transitions_usd": transitions * inst.transition_usd,
    }
    bill["total_usd"] = sum(bill.values())
    return bill


@dataclass(frozen=True)
class Solution:
    """What every solver returns: the choice, the model's verdict on it, and how it was found.

    `optimal` is True when the solver proved optimality over the instance's decision space
    (methods, the instance's betas, memory options, 1..G replicas), False when it stopped early,
    None when it makes no such claim (heuristics such as ODS).
    """

    solver: str
    choice: Choice
    evaluation: Evaluation
    seconds: float
    optimal: bool | None
    note: str = ""

    @property
    def cost(self) -> float:
        return self.evaluation.cost

    @property
    def latency(self) -> float:
        return self.evaluation.latency
