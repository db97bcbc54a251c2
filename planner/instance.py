"""The planning instance: every number the cost model needs for one model, batch and platform.

An `Instance` is plain numpy arrays and floats, built once from the predicted counts, the
model's stage sizes and the calibration, so the cost model and all solvers read the same facts
and none of them re-derives a price or a bandwidth.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ground.errors import UsageError
from ground.method import Method
from planner.calibration import Calibration

__all__ = ["Method", "Instance", "MB", "default_betas"]

MB = 1024.0 * 1024.0  # bytes per MB as Lambda counts memory (MiB)


def default_betas(counts: np.ndarray) -> tuple[int, ...]:
    """Pipeline degrees to choose from: powers of two below the largest shard, and that shard.

    (12e) allows any 1 <= beta <= max r; the candidates cover that range geometrically, and every
    solver chooses from the same set, so "optimal" means optimal over this set.
    """
    largest = max(1, math.ceil(float(np.max(counts, initial=1.0))))
    powers = [2**p for p in range(largest.bit_length()) if 2**p < largest]
    return (*powers, largest)


@dataclass(frozen=True, eq=False)
class Instance:
    """One planning problem (symbols of serverless-model.md §3-§5 in the comments).

    Times are seconds, sizes bytes unless the name says MB, money US dollars.
    """

    counts: np.ndarray  # (L, E) d_{e,i}: predicted tokens per expert
    expert_bytes: np.ndarray  # (L, E) P_{e,i}
    token_bytes_in: float  # D^in
    token_bytes_out: float  # D^o
    memory_mb: np.ndarray  # (J,) M_j
    compute_s: np.ndarray  # (J,) U_j for this model's expert, seconds per token
    max_replicas: int  # G
    warm_start_s: float  # T^str
    s3_delay_s: float  # T^dl
    s3_bandwidth: float  # B^s, bytes/s
    invoke_bandwidth: float  # B^f, bytes/s
    direct_payload_bytes: int  # D^p
    runtime_mb: float  # fixed part of M^itrm
    price_mb_s: float  # $ per MB-second
    request_usd: float
    s3_put_usd: float
    s3_get_usd: float
    s3_list_usd: float
    s3_delete_usd: float
    transition_usd: float  # Standard workflows, per state entered
    express_request_usd: float
    express_mb_s_usd: float  # Express duration, per MB-second of the billed memory
    express_memory_mb: float
    express_step_s: float
    nonmoe_memory_mb: float  # memory of the head, layer (gate) and tail functions
    head_s: float  # T^head: warm start, read the input, write the hidden state
    tail_s: float  # T^tail: gather the last layer, run the tail stage, write the output, delete
    layer_s: np.ndarray  # (L,) the gate's work before its scatter (see `Instance.build`)
    tokens: int
    workflow: str = "express"  # "express" or "standard": how the workflow itself is billed
    objective: str = "full"  # "full": the whole bill; "experts": the expert functions only
    betas: tuple[int, ...] = ()
    pipelined_residency: bool = False  # [beyond]: only 2*beta tokens resident when pipelining
    max_timeout_s: float = math.inf  # Lambda's limit on one invocation (expert, direct gate)
    map_max_concurrency: float = math.inf  # an inline Map's concurrent iterations (s3, pipelined)
    arch: str = "x86_64"
    meta: dict[str, object] = field(default_factory=dict)
    # Packing (`planner.packing`): each "expert" above is then a function hosting `hosted`
    # experts, `groups` (L, E, hosted) their ids, `source` the per-expert instance.
    hosted: int = 1
    groups: np.ndarray | None = None
    source: Instance | None = None

    def __post_init__(self) -> None:
        if not self.betas:
            object.__setattr__(self, "betas", default_betas(self.counts))

    @property
    def layers(self) -> int:
        return int(self.counts.shape[0])

    @property
    def experts(self) -> int:
        return int(self.counts.shape[1])

    @property
    def replicas(self) -> np.ndarray:
        """(G,) the replica counts 1..G."""
        return np.arange(1, self.max_replicas + 1)

    def fixed_s(self) -> float:
        """Latency that no MoE decision changes: head, tail and every non-MoE layer function."""
        return float(self.head_s + self.tail_s + self.layer_s.sum())

    @classmethod
    def build(
        cls,
        counts: np.ndarray,
        calibration: Calibration,
        *,
        expert_bytes: np.ndarray,
        token_bytes: float,
        compute_s: np.ndarray,
        nonmoe_compute_s: float,
        tokens: int,
        tail_compute_s: float = 0.0,
        arch: str = "x86_64",
        nonmoe_memory_mb: float = 1769.0,
        workflow: str = "express",
        objective: str = "full",
        payload: str = "invoke",
        betas: tuple[int, ...] = (),
        pipelined_residency: bool = False,
        meta: dict[str, object] | None = None,
    ) -> Instance:
        """Derive the non-MoE timings from the batch and put everything in one place.

        Every function is priced warm (steady state): its weights are cached in the container,
        so a call costs the warm start and its own S3 traffic, each request T^dl plus its bytes
        at B^s, in the order the handler makes them (`ground.semantics` lists them). The gate's
        work before its scatter (`layer_s`) reads the hidden state, gathers the previous layer
        (routing, a listing, the outputs), computes the block and gate, and writes the residual
        and the routing.

        Args:
            compute_s: (J,) U_j for one expert of this model, at each memory option.
            nonmoe_compute_s: seconds per token of a layer function (attention block + gate) at
                `nonmoe_memory_mb`.
            tail_compute_s: seconds per token of the tail stage (a decoder's LM head, a final
                norm) at `nonmoe_memory_mb`. Defaults to 0 (an instance priced without it).
            workflow: "express" or "standard" Step Functions pricing.
            objective: "full" (the whole bill) or "experts" (the paper's: expert functions).
            payload: "invoke" when the gate invokes its experts synchronously with the shard
                inline (the emitted workflow: 6 MB each way), "step-functions" when a direct
                payload would pass through a Step Functions state (256 KiB).
        """
        counts = np.asarray(counts, dtype=float)
        price = calibration.price(arch)
        cal = calibration
        if workflow not in ("express", "standard"):
            raise UsageError(f"unknown workflow type '{workflow}'.", "use express or standard.")
        if objective not in ("full", "experts"):
            raise UsageError(f"unknown objective '{objective}'.", "use full or experts.")
        dl, per_byte, start = (
            cal.s3_access_delay_s,
            1.0 / cal.s3_bandwidth_bytes_per_s,
            cal.warm_start_s,
        )
        hidden = tokens * float(token_bytes) * per_byte  # one (N, h) tensor at B^s
        routed = counts.sum(axis=1) * float(token_bytes) * per_byte  # a layer's shards at B^s
        gather = np.r_[0.0, 3 * dl + routed[:-1]]  # routing, listing, outputs of layer e-1
        routing = dl + counts.sum(axis=1) * 12 * per_byte  # int64 expert + float32 weight
        layer_s = start + 2 * (dl + hidden) + gather + tokens * nonmoe_compute_s + routing
        limit = {
            "step-functions": cal.step_functions_payload_bytes,
            "invoke": cal.invoke_payload_bytes,
        }
        if payload not in limit:
            raise UsageError(f"unknown payload path '{payload}'.", "use step-functions or invoke.")
        return cls(
            counts=counts,
            expert_bytes=np.asarray(expert_bytes, dtype=float),
            token_bytes_in=float(token_bytes),
            token_bytes_out=float(token_bytes),
            memory_mb=np.asarray(cal.memory_options_mb, dtype=float),
            compute_s=np.asarray(compute_s, dtype=float),
            max_replicas=cal.max_replicas,
            warm_start_s=start,
            s3_delay_s=dl,
            s3_bandwidth=cal.s3_bandwidth_bytes_per_s,
            invoke_bandwidth=cal.invoke_bandwidth_bytes_per_s,
            direct_payload_bytes=limit[payload],
            runtime_mb=float(cal.runtime_overhead_mb),
            price_mb_s=price.gb_second_usd / cal.billing_mb_per_gb,
            request_usd=price.request_usd,
            s3_put_usd=cal.s3_put_request_usd,
            s3_get_usd=cal.s3_get_request_usd,
            s3_list_usd=cal.s3_list_request_usd,
            s3_delete_usd=cal.s3_delete_request_usd,
            transition_usd=cal.step_functions_transition_usd,
            express_request_usd=cal.express_request_usd,
            express_mb_s_usd=cal.express_gb_second_usd / cal.billing_mb_per_gb,
            express_memory_mb=float(cal.express_memory_mb),
            express_step_s=cal.express_duration_step_s,
            nonmoe_memory_mb=nonmoe_memory_mb,
            # head: read the token ids (8 bytes each), write the hidden state; tail: gather the
            # last layer, read the residual, write the output (one hidden row per token at
            # most), list and delete the request's intermediates.
            head_s=start + 2 * dl + tokens * 8 * per_byte + hidden,
            tail_s=start
            + 3 * dl
            + float(routed[-1])
            + tokens * tail_compute_s
            + 2 * (dl + hidden)
            + 2 * dl,
            layer_s=layer_s,
            tokens=tokens,
            workflow=workflow,
            objective=objective,
            betas=betas,
            pipelined_residency=pipelined_residency,
            max_timeout_s=float(cal.max_timeout_s),
            map_max_concurrency=float(cal.map_max_concurrency),
            arch=arch,
            meta=dict(meta or {}),
        )
