"""What a plan is billed when it serves a real batch: the serving-cost simulator of BO (§8).

A plan is made from *predicted* counts; the batch that arrives routes its tokens as it will. The
simulator does what the deployed gates do (`ground.semantics.runtime_replicas`, the rule
`functions/layer.py` applies): in an s3 or direct layer the gate spreads an expert's real tokens
over as many replicas as memory and payload need, from the plan's count up to its cap (the
reserved concurrency); a pipelined layer's replicas were started with the gate and cannot
change, so more tokens only make them run longer (they hold two minibatches, not the shard).
Alg. 2's cases, per expert:

* (i) memory: the real tokens per planned replica do not fit its memory; the gate adds replicas
  (or, past the cap, the request fails: `Served.failed`);
* (ii) payload: direct, and a planned replica's shard would exceed the Invoke limit; the gate
  adds replicas likewise;
* (iii) a misprediction of more than `alpha` tokens per replica that breaks no limit: the
  replicas run longer or shorter.

The billed cost and latency are then the cost model's own (`evaluate`, `bill`) on an instance
whose counts are the real ones: the same formulas the planner optimised, not a second copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from ground.semantics import runtime_replicas
from planner.costmodel import Choice, Evaluation, bill, evaluate, replica_limits
from planner.instance import Instance, Method

__all__ = ["Case", "Served", "serve"]


class Case(IntEnum):
    """What happened to one expert on a real batch (Alg. 2 lines 10-21), most severe first."""

    MEMORY = 1  # (i) replicated (or given more memory) to fit its real tokens
    PAYLOAD = 2  # (ii) replicated so that every direct shard fits the payload limit
    MISPREDICTED = 3  # (iii) off by more than alpha tokens per replica, within every limit
    OK = 4


@dataclass(frozen=True, eq=False)
class Served:
    """One batch served by a plan: the deployment as run, its verdict, and what happened."""

    choice: Choice  # the plan's choice after the run-time replication
    evaluation: Evaluation  # on the real counts
    bill_usd: dict[str, float]
    case: np.ndarray  # (L, E) Case values
    planned_replicas: np.ndarray  # (L, E)
    failed: np.ndarray  # (L, E) the real tokens need more replicas than the cap: refused

    @property
    def cost(self) -> float:
        """The plan's objective on the real batch (the full bill, or the experts' cost)."""
        return self.evaluation.cost

    @property
    def latency(self) -> float:
        return self.evaluation.latency

    def worst_case(self) -> Case:
        return Case(int(self.case.min()))


def serve(
    plan_inst: Instance, choice: Choice, real_counts: np.ndarray, *, alpha: float = 64.0
) -> Served:
    """Serve a batch with real routing `real_counts` (L, E) on the plan `choice` of `plan_inst`.

    Args:
        plan_inst: The instance the plan was made on (its counts are the predicted ones).
        choice: The plan's decisions.
        real_counts: Tokens each expert really receives in the batch.
        alpha: Tokens per replica by which prediction and reality may differ before the expert
            counts as mispredicted (case iii). Default 64.
    """
    real = np.asarray(real_counts, dtype=float)
    if real.shape != plan_inst.counts.shape:
        raise ValueError(
            f"real counts {real.shape} do not match the plan {plan_inst.counts.shape}"
        )
    planned = choice.replicas
    caps, fits = replica_limits(plan_inst, choice)
    tokens = np.ceil(real)
    wanted = runtime_replicas(tokens, planned, caps, fits)
    failed = (wanted > caps) & (tokens > 0)
    replicas = np.minimum(wanted, caps)
    direct = (choice.method == Method.DIRECT)[:, None]
    grown = (replicas > planned) | failed
    per_replica = np.ceil(real / planned)
    off = np.abs(np.ceil(plan_inst.counts / planned) - per_replica) > alpha
    case = np.full(real.shape, int(Case.OK))
    case[off] = Case.MISPREDICTED
    case[grown & direct] = Case.PAYLOAD
    memory_fit = replica_limits(plan_inst, choice, payload=False)[1]
    case[grown & (per_replica > memory_fit)] = Case.MEMORY
    served = dataclasses.replace(choice, replicas=replicas)
    inst = dataclasses.replace(plan_inst, counts=real, betas=plan_inst.betas)
    evaluation = evaluate(inst, served)
    return Served(served, evaluation, bill(inst, served, evaluation), case, planned.copy(), failed)
