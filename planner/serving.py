"""What a plan is billed when it serves a real batch: the serving-cost simulator of BO (§8).

A plan is made from *predicted* counts; the batch that arrives routes its tokens as it will. Each
expert keeps its planned memory and replicas, unless the real tokens per replica break a
constraint of (12), in which case the deployment reacts as Alg. 2 does, by replicating:

* (i) memory: the real tokens per replica do not fit the configured memory. The expert is
  replicated until each replica's tokens fit (g' = ceil(d / t_max) with t_max the tokens its
  memory holds); if the memory does not hold the weights and one token, it is raised to the
  smallest option that does (a plan may give an expert predicted idle any memory);
* (ii) payload: direct transfer, and one replica's shard exceeds the payload limit D^p: replicate
  until every shard fits (g'' = ceil(d / t_pay));
* (iii) a misprediction of more than `alpha` tokens per replica that breaks no constraint: the
  replica runs longer or shorter, nothing is replicated.

The billed cost and latency are then the cost model's own (`evaluate`, `bill`) on an instance
whose counts are the real ones: the same formulas the planner optimised, not a second copy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from planner.costmodel import Choice, Evaluation, bill, evaluate
from planner.instance import MB, Instance, Method

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

    @property
    def cost(self) -> float:
        """The paper's objective on the real batch: the billed cost of all MoE layers."""
        return self.evaluation.cost

    @property
    def latency(self) -> float:
        return self.evaluation.latency

    def worst_case(self) -> Case:
        return Case(int(self.case.min()))


def _tokens_that_fit(inst: Instance, memory_mb: np.ndarray) -> np.ndarray:
    """Tokens one replica can hold resident in `memory_mb` ((L, E) or (L, E, J)) beside its
    weights and the runtime."""
    fixed = inst.expert_bytes / MB + inst.runtime_mb
    free = memory_mb - (fixed if memory_mb.ndim == 2 else fixed[..., None])
    per_token = (inst.token_bytes_in + inst.token_bytes_out) / MB
    return np.floor(free / per_token)


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
    memory = choice.memory.copy()
    planned = choice.replicas
    active = real > 0
    options = plan_inst.memory_mb
    # A memory that cannot hold the weights and a single token: the smallest option that can.
    every_option = np.broadcast_to(options, (*real.shape, options.size))  # (L, E, J)
    fits_one = _tokens_that_fit(plan_inst, every_option) >= 1
    too_small = active & ~np.take_along_axis(fits_one, memory[..., None], axis=2)[..., 0]
    if too_small.any():
        if not fits_one.any(axis=2)[too_small].all():
            raise ValueError("an expert does not fit the largest memory option with one token")
        memory = np.where(too_small, fits_one.argmax(axis=2), memory)
    t_max = np.maximum(_tokens_that_fit(plan_inst, options[memory]), 1.0)  # idle: any
    per_replica = np.ceil(real / planned)
    need_memory = np.ceil(real / t_max).astype(int)
    piped = (choice.method == Method.PIPELINED)[:, None]
    if plan_inst.pipelined_residency:
        # Pipelining keeps only 2*beta tokens resident: no shortfall while those fit.
        two_beta = 2 * np.minimum(choice.beta[:, None], per_replica)
        need_memory = np.where(piped & (two_beta <= t_max), 1, need_memory)
    shortfall = active & ((need_memory > planned) | too_small)
    direct = (choice.method == Method.DIRECT)[:, None]
    t_pay = plan_inst.direct_payload_bytes // max(
        plan_inst.token_bytes_in, plan_inst.token_bytes_out
    )
    need_payload = np.where(direct, np.ceil(real / t_pay), 1).astype(int)
    overflow = active & (need_payload > planned)
    replicas = np.maximum(planned, np.where(active, np.maximum(need_memory, need_payload), 1))
    off = np.abs(np.ceil(plan_inst.counts / planned) - per_replica) > alpha
    case = np.full(real.shape, int(Case.OK))
    case[off] = Case.MISPREDICTED
    case[overflow] = Case.PAYLOAD
    case[shortfall] = Case.MEMORY
    served = dataclasses.replace(choice, memory=memory, replicas=replicas)
    inst = dataclasses.replace(
        plan_inst,
        counts=real,
        max_replicas=max(plan_inst.max_replicas, int(replicas.max())),
        betas=plan_inst.betas,
    )
    evaluation = evaluate(inst, served)
    return Served(served, evaluation, bill(inst, served, evaluation), case, planned.copy())
