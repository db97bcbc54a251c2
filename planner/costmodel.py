"""Time, cost and latency of MoE layers (serverless-model.md §4-§5, §8b), vectorised over options.

For one layer, method and pipeline degree beta, `expert_options` evaluates every expert at every
memory option j and replica count g at once, as (E, J, G) arrays. Solvers choose one (j, g) per
expert; `evaluate` re-checks any complete choice against every constraint and prices it, and
`bill` itemises the full bill with the exact request counts of `ground.semantics`. One
implementation serves the planner, the solvers' property tests and the BO simulator.

What the deployed workflow does, and so what the model says (times from the end of the gate's
pre-scatter work `Instance.layer_s`, which every method shares; functions are warm):

* s3: the gate uploads every shard (T^up = T^dl + sum_i d_i D^in / B^s) and returns; the Map then
  starts the busy replicas: finish = T^up + T^str + 2 T^dl + r ((D^in + D^o)/B^s + U_j);
* pipelined: the replicas start with the gate and are billed from then, busy or idle; a busy one
  finishes at max(T^str + body - pre, T^up + one block + the last upload), body =
  ceil(r / b) (T^dl + b max(D^in/B^s + U_j, D^o/B^s)) + T^dl + b D^o/B^s, b = min(beta, r);
* direct: the gate sends each shard inline (r D^in / B^f), each replica runs T^str + r (D^o/B^f +
  U_j), and the gate stores what came back (T^dl + sum_i d_i D^o / B^s); the gate is billed the
  whole time;
* the layer's latency is its slowest expert's finish; the next gate gathers (in its `layer_s`);
* tokens per replica r = ceil(d / g); replicas with no token are not invoked (s3, direct);
* direct: feasible only if one replica's event, rows base64 in JSON, fits D^p;
* memory: P + M^itrm + resident tokens * (D^in + D^o) <= M_j, with resident = r (or 2b when
  pipelined with `pipelined_residency`).

With the "full" objective an expert's cost also holds the requests it causes (Lambda, S3 by
type, Standard transitions); `layer_terms` adds what a layer costs whatever its experts choose,
and the cost per second of its latency (a direct gate waiting; Express duration).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ground.semantics import (
    POLL_S,
    direct_event_bytes,
    express_duration_usd,
    max_direct_tokens,
    request_counts,
)
from planner.instance import MB, Instance, Method

__all__ = [
    "Choice",
    "Evaluation",
    "Options",
    "Solution",
    "bill",
    "evaluate",
    "expert_options",
    "global_terms",
    "price",
    "replica_limits",
    "usage",
    "layer_terms",
    "option_grid",
    "tokens_that_fit",
    "within_timeout",
]


@dataclass(frozen=True, eq=False)
class Options:
    """Every (memory j, replicas g) option of every expert of one layer, method and beta.

    Arrays are (E, J, G). Experts with no tokens cost nothing and finish at 0 (s3, direct: never
    invoked); a pipelined idle expert's replicas still start, wait for the gate and cost.
    """

    layer: int
    method: Method
    beta: int
    time: np.ndarray  # billed seconds of one busy replica
    cost: np.ndarray  # $ for all g replicas under the instance's objective
    experts_usd: np.ndarray  # $ of the expert functions' GB-s alone
    finish: np.ndarray  # when the expert's last replica is done, from the end of layer_s
    feasible: np.ndarray  # memory (and payload for direct) constraints hold


def _shape(inst: Instance, layer: int) -> tuple[np.ndarray, ...]:
    d = np.ceil(inst.counts[layer][:, None, None])  # (E,1,1) whole tokens
    g = inst.replicas[None, None, :].astype(float)  # (1,1,G)
    r = np.ceil(d / g)  # (E,1,G)
    u = inst.compute_s[None, :, None]  # (1,J,1)
    m = inst.memory_mb[None, :, None]  # (1,J,1)
    return d, g, r, u, m


def _minibatches(d: np.ndarray, g: np.ndarray, beta: int | np.ndarray) -> np.ndarray:
    """Minibatches of all replicas of an expert: its shards (`shard_sizes`) cut into beta rows."""
    q = np.floor(d / g)
    rem = d - q * g
    return rem * np.ceil((q + 1) / beta) + (g - rem) * np.ceil(q / beta)


def tokens_that_fit(inst: Instance, layer: int, memory_mb: np.ndarray) -> np.ndarray:
    """Tokens one replica of each expert can hold resident beside its weights and the runtime.

    `memory_mb` is (E,) or (E, J); the result has its shape.
    """
    fixed = inst.expert_bytes[layer] / MB + inst.runtime_mb
    free = memory_mb - (fixed if memory_mb.ndim == 1 else fixed[:, None])
    return np.floor(free / ((inst.token_bytes_in + inst.token_bytes_out) / MB))


def replica_limits(
    inst: Instance, choice: Choice, *, payload: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """(L, E) caps and tokens per replica the deployed gates apply to a batch's real counts.

    Cap: G for s3 and direct layers, whose gate spreads real tokens over more replicas when
    needed; the planned count for pipelined layers, whose replicas start before the gate knows
    the counts. Tokens per replica: what one replica's memory holds and, for direct (with
    `payload`), what one Invoke event carries.
    """
    caps = np.where(
        (choice.method == Method.PIPELINED)[:, None], choice.replicas, inst.max_replicas
    )
    fits = np.stack(
        [tokens_that_fit(inst, e, inst.memory_mb[choice.memory[e]]) for e in range(inst.layers)]
    )
    if payload:
        token_bytes = int(max(inst.token_bytes_in, inst.token_bytes_out))
        limit = max_direct_tokens(inst.direct_payload_bytes, token_bytes, inst.hosted)
        fits = np.where((choice.method == Method.DIRECT)[:, None], np.minimum(fits, limit), fits)
    return np.maximum(caps, choice.replicas), np.maximum(fits, 1).astype(int)


def expert_options(inst: Instance, layer: int, method: Method, beta: int = 1) -> Options:
    """Times, costs and feasibility of every option of every expert (formulas above)."""
    arrays = _option_arrays(inst, layer, method, np.array([float(beta)]))
    return Options(layer, method, int(beta), *(a[0] for a in arrays))


def option_grid(
    inst: Instance, layer: int, method: Method, betas: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cost, finish, feasible) of `expert_options` for all `betas` at once, as (B, E, J, G).

    One evaluation instead of one per beta: the exact solver builds every layer's frontier over
    all pipeline degrees, and per-call overhead dominated that.
    """
    _, cost, _, finish, feasible = _option_arrays(inst, layer, method, np.asarray(betas, float))
    return cost, finish, feasible


def _option_arrays(
    inst: Instance, layer: int, method: Method, betas: np.ndarray
) -> tuple[np.ndarray, ...]:
    """(time, cost, experts_usd, finish, feasible), each (B, E, J, G) for the B pipeline degrees
    (ignored, B = 1 in effect, unless pipelined: every beta then gives the same arrays)."""
    d, g, r, u, m = _shape(inst, layer)
    beta = betas.reshape(-1, 1, 1, 1)  # (B,1,1,1): every array below broadcasts to (B,E,J,G)
    bs, dl, start = inst.s3_bandwidth, inst.s3_delay_s, inst.warm_start_s
    d_in, d_out = inst.token_bytes_in, inst.token_bytes_out
    pre = float(inst.layer_s[layer])
    routed = float(np.ceil(inst.counts[layer]).sum())
    busy = np.minimum(d, g)  # replicas with at least one token
    invoked = busy
    resident = r
    if method is Method.PIPELINED:
        b = np.maximum(np.minimum(beta, r), 1.0)
        block = dl + b * np.maximum(d_in / bs + u, d_out / bs)
        last = dl + b * d_out / bs
        upload = dl + routed * d_in / bs
        finish = np.maximum(start + np.ceil(r / b) * block + last - pre, upload + block + last)
        idle = np.maximum(start - pre, dl) + dl  # its done marker is written first, then read
        time = pre + finish
        replica_s = busy * time + (g - busy) * (pre + idle)
        finish = np.where(d > 0, finish, idle)
        invoked = g + 0 * d
        if inst.pipelined_residency:
            resident = np.minimum(2 * b, r)
    elif method is Method.S3:
        time = start + 2 * dl + r * ((d_in + d_out) / bs + u)
        finish = dl + routed * d_in / bs + time
        replica_s = busy * time
    else:
        time = start + r * (d_out / inst.invoke_bandwidth + u)
        finish = r * d_in / inst.invoke_bandwidth + time + dl + routed * d_out / bs
        replica_s = busy * time
    need_mb = inst.expert_bytes[layer][:, None, None] / MB + inst.runtime_mb
    feasible = need_mb + resident * (d_in + d_out) / MB <= m
    if method is Method.DIRECT:
        event = direct_event_bytes(r, int(max(d_in, d_out)), inst.hosted)
        feasible = feasible & (event <= inst.direct_payload_bytes)
    feasible = feasible & within_timeout(inst, method, pre, time, finish)
    experts_usd = replica_s * m * inst.price_mb_s
    cost = experts_usd
    if inst.objective == "full":
        cost = experts_usd + _request_usd(inst, method, beta, d, g, busy, invoked, pre)
    shape = (beta.shape[0], inst.experts, inst.memory_mb.size, inst.max_replicas)
    arrays = [np.broadcast_to(a, shape).copy() for a in (time, cost, experts_usd, finish)]
    feasible = np.broadcast_to(feasible, shape).copy()
    if method is not Method.PIPELINED:
        idle = np.broadcast_to(d == 0, shape)
        for a in arrays:
            a[idle] = 0.0
        # An expert predicted idle may still get tokens: its memory must hold at least one.
        one = np.broadcast_to(need_mb + (d_in + d_out) / MB <= m, shape)
        feasible[idle] = one[idle]
    if method is not Method.DIRECT and inst.experts > inst.map_max_concurrency:
        feasible[:] = False  # the Map over the experts would queue: only direct fans out wide
    return (*arrays, feasible)


def within_timeout(
    inst: Instance,
    method: Method,
    pre: float,
    time: np.ndarray,
    finish: np.ndarray,
) -> np.ndarray:
    """Options whose invocations fit Lambda's timeout: a busy replica's billed time, and for
    direct also the gate, which waits for its slowest expert (layer_s + finish)."""
    fits = time <= inst.max_timeout_s
    if method is Method.DIRECT:
        fits = fits & (pre + finish <= inst.max_timeout_s)
    return fits


def _request_usd(
    inst: Instance,
    method: Method,
    beta: np.ndarray,
    d: np.ndarray,
    g: np.ndarray,
    busy: np.ndarray,
    invoked: np.ndarray,
    pre: float,
) -> np.ndarray:
    """$ of the requests an expert's option causes (per `ground.semantics.request_counts`).

    Per busy shard: s3 = the gate's PUT, the expert's GET and PUT, the gatherer's GET; direct =
    the gate's PUT of the output and the gatherer's GET; pipelined = the same four per minibatch,
    a done marker per replica and the polls (estimated: two GETs per 4 x POLL_S the replica
    waits for the gate, and two at the end). Standard workflows add the Map states entered.
    """
    put, get = inst.s3_put_usd, inst.s3_get_usd
    usd = invoked * inst.request_usd
    standard = inst.workflow == "standard"
    if method is Method.PIPELINED:
        mb = _minibatches(d, g, beta)
        wait = max(pre + inst.s3_delay_s - inst.warm_start_s, 0.0)
        polls = g * (2 + 2 * np.ceil(wait / (4 * POLL_S)))
        usd = usd + mb * 2 * (put + get) + g * put + polls * get
        if standard:
            usd = usd + (g + 1) * inst.transition_usd
    elif method is Method.S3:
        usd = usd + busy * 2 * (put + get)
        if standard:
            usd = usd + (busy + (d > 0)) * inst.transition_usd
    else:
        usd = usd + busy * (put + get)
    return usd


def layer_terms(inst: Instance, layer: int, method: Method) -> tuple[float, float]:
    """(dollars, dollars per second of latency) a layer costs whatever its experts choose.

    The gate: one Lambda request, its GB-s (s3, pipelined: until its upload returns; direct:
    `layer_s` plus the whole layer, as it waits for its experts), GET hidden, PUT residual and
    routing, and its layer's gather by the next function (GET routing, one listing); Standard:
    the layer's fixed states; Express: its duration. Zero under the "experts" objective.
    """
    if inst.objective != "full":
        return 0.0, 0.0
    gate_mb_s = inst.nonmoe_memory_mb * inst.price_mb_s
    pre = float(inst.layer_s[layer])
    upload = inst.s3_delay_s + float(np.ceil(inst.counts[layer]).sum()) * (
        inst.token_bytes_in / inst.s3_bandwidth
    )
    usd = inst.request_usd + 2 * inst.s3_get_usd + 2 * inst.s3_put_usd + inst.s3_list_usd
    per_s = _express_rate(inst)
    if method is Method.DIRECT:
        usd += pre * gate_mb_s
        per_s += gate_mb_s
    else:
        usd += (pre + upload) * gate_mb_s
    if inst.workflow == "standard":
        usd += {Method.S3: 2, Method.PIPELINED: 6, Method.DIRECT: 1}[method] * inst.transition_usd
    return usd, per_s


def _express_rate(inst: Instance) -> float:
    return inst.express_memory_mb * inst.express_mb_s_usd if inst.workflow == "express" else 0.0


def global_terms(inst: Instance) -> tuple[float, float]:
    """(dollars, dollars per second) of everything outside the MoE layers.

    Head and tail (GB-s, requests, GET input, PUT hidden, GET residual, PUT output, a listing and
    a DeleteObjects call for the intermediates) and the workflow: Standard's two Task states, or
    Express's request and duration. Solvers price the workflow's duration without Express's
    rounding up to 100 ms, and assume every listing and delete needs one call (up to 1,000
    objects); `bill` counts both exactly.
    """
    if inst.objective != "full":
        return 0.0, 0.0
    usd = (inst.head_s + inst.tail_s) * inst.nonmoe_memory_mb * inst.price_mb_s
    usd += 2 * inst.request_usd + 2 * inst.s3_get_usd + 2 * inst.s3_put_usd
    usd += inst.s3_list_usd + inst.s3_delete_usd
    if inst.workflow == "standard":
        usd += 2 * inst.transition_usd
    else:
        usd += inst.express_request_usd
    return usd, _express_rate(inst)


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

    expert_cost: np.ndarray  # (L, E) $ under the objective
    expert_time: np.ndarray  # (L, E) billed seconds of one busy replica
    experts_usd: float  # the expert functions' GB-s alone (the paper's objective)
    layer_cost: np.ndarray  # (L,) $ under the objective, `layer_terms` included
    layer_latency: np.ndarray  # (L,) t^lat_e
    latency: float  # end to end, including non-MoE functions
    cost: float  # the objective: the full bill (as the solvers price it) or the experts' cost
    violations: list[str]

    @property
    def feasible(self) -> bool:
        return not self.violations


def evaluate(inst: Instance, choice: Choice, slo_s: float | None = None) -> Evaluation:
    """Cost and latency of `choice`, with every violated constraint named."""
    cost = np.zeros((inst.layers, inst.experts))
    time = np.zeros_like(cost)
    experts_usd = 0.0
    latency = np.zeros(inst.layers)
    layer_cost = np.zeros(inst.layers)
    violations = []
    experts = np.arange(inst.experts)
    for layer in range(inst.layers):
        method = Method(int(choice.method[layer]))
        opts = expert_options(inst, layer, method, int(choice.beta[layer]))
        j, g = choice.memory[layer], choice.replicas[layer] - 1
        cost[layer] = opts.cost[experts, j, g]
        time[layer] = opts.time[experts, j, g]
        experts_usd += float(opts.experts_usd[experts, j, g].sum())
        pre = float(inst.layer_s[layer])
        fits_time = within_timeout(
            inst, method, pre, opts.time[experts, j, g], opts.finish[experts, j, g]
        )
        for e in np.flatnonzero(~opts.feasible[experts, j, g]):
            what = "payload or memory" if method is Method.DIRECT else "memory"
            if method is not Method.DIRECT and inst.experts > inst.map_max_concurrency:
                what = f"an inline Map's {inst.map_max_concurrency:g} concurrent iterations"
            elif not fits_time[e]:
                what = f"Lambda's {inst.max_timeout_s:g} s timeout"
            violations.append(f"layer {layer} expert {e}: {what} limit")
        latency[layer] = float(opts.finish[experts, j, g].max())
        usd, per_s = layer_terms(inst, layer, method)
        layer_cost[layer] = cost[layer].sum() + usd + per_s * latency[layer]
    total = inst.fixed_s() + float(latency.sum())
    if slo_s is not None and total > slo_s * (1 + 1e-9):
        violations.append(f"latency {total:.4f} s exceeds the SLO {slo_s:.4f} s")
    usd, per_s = global_terms(inst)
    objective = float(layer_cost.sum()) + usd + per_s * inst.fixed_s()
    return Evaluation(cost, time, experts_usd, layer_cost, latency, total, objective, violations)


def usage(inst: Instance, choice: Choice, evaluation: Evaluation) -> dict[str, float]:
    """What one execution of `choice` on `inst.counts` uses, as the meter of a local run counts.

    Requests come from `ground.semantics.request_counts` (polls are the model's estimate); GB-s
    of every function: experts (busy and, pipelined, idle replicas), head, gates, tail.
    """
    methods = [Method(int(m)) for m in choice.method]
    tokens = np.ceil(inst.counts).astype(int)
    polls = np.zeros(tokens.shape)
    gb_s = (inst.head_s + inst.tail_s) * inst.nonmoe_memory_mb
    payload = 0
    experts = np.arange(inst.experts)
    for layer, method in enumerate(methods):
        beta = int(choice.beta[layer])
        opts = expert_options(inst, layer, method, beta)
        j, g = choice.memory[layer], choice.replicas[layer] - 1
        gb_s += float(opts.experts_usd[experts, j, g].sum()) / inst.price_mb_s
        gate_s = float(inst.layer_s[layer])
        if method is Method.DIRECT:
            gate_s += float(evaluation.layer_latency[layer])
            rows = np.ceil(tokens[layer] / choice.replicas[layer])
            token_bytes = int(max(inst.token_bytes_in, inst.token_bytes_out))
            payload = max(payload, int(direct_event_bytes(rows.max(), token_bytes, inst.hosted)))
        else:
            gate_s += (
                inst.s3_delay_s + tokens[layer].sum() * inst.token_bytes_in / inst.s3_bandwidth
            )
        gb_s += gate_s * inst.nonmoe_memory_mb
        if method is Method.PIPELINED:
            wait = max(float(inst.layer_s[layer]) + inst.s3_delay_s - inst.warm_start_s, 0.0)
            polls[layer] = choice.replicas[layer] * (2 + 2 * np.ceil(wait / (4 * POLL_S)))
    counts = request_counts(
        methods, [int(b) for b in choice.beta], tokens, choice.replicas, poll_gets=polls
    )
    return counts.as_dict() | {
        "gb_s": gb_s / 1024.0,
        "experts_gb_s": evaluation.experts_usd / inst.price_mb_s / 1024.0,
        "payload_max_bytes": payload,
    }


def bill(inst: Instance, choice: Choice, evaluation: Evaluation) -> dict[str, float]:
    """The full bill of one batch by item, from the exact request counts of the workflow."""
    return price(inst, usage(inst, choice, evaluation), evaluation.latency)


def price(inst: Instance, used: dict[str, float], seconds: float) -> dict[str, float]:
    """Dollars of a usage (planned or metered, `ground.semantics.USAGE_KEYS`) by item.

    `seconds` is the execution's duration (Express bills it); the expert functions' share of
    the Lambda GB-s is reported apart as the paper's objective.
    """
    lambda_usd = used["gb_s"] * 1024.0 * inst.price_mb_s
    experts_usd = used["experts_gb_s"] * 1024.0 * inst.price_mb_s
    if inst.workflow == "express":
        workflow = inst.express_request_usd + express_duration_usd(
            seconds, inst.express_memory_mb, inst.express_step_s, inst.express_mb_s_usd
        )
    else:
        workflow = used["transitions"] * inst.transition_usd
    items = {
        "experts_usd": experts_usd,
        "nonmoe_usd": lambda_usd - experts_usd,
        "requests_usd": used["lambda_requests"] * inst.request_usd,
        "s3_usd": used["s3_put"] * inst.s3_put_usd
        + (used["s3_get"] + used["s3_get_poll"]) * inst.s3_get_usd
        + used["s3_list"] * inst.s3_list_usd
        + used["s3_delete"] * inst.s3_delete_usd,
        "workflow_usd": workflow,
    }
    items["total_usd"] = sum(items.values())
    return items


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
        """The objective the solver minimised (the full bill by default)."""
        return self.evaluation.cost

    @property
    def latency(self) -> float:
        return self.evaluation.latency
