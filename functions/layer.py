"""Layer function: gathers the previous layer's experts, runs block + gate, scatters to experts.

The gather of layer LL-1 happens here (not in a function of its own) because the combine of
LL-1 is exported with layer LL: one function, one round trip to S3 less per layer.

The gate follows the batch's real routing where the method allows (`ground.semantics.adapts`):
an s3 or direct expert gets as many replicas as its real tokens need, within its reserved
concurrency; a pipelined layer's replicas started with the gate, so the plan's split is used.
"""

from __future__ import annotations

from itertools import groupby
from typing import Any

import numpy as np
import torch

# Building this stage needs Hugging Face's model classes: their common base (the bulk of the
# import) loads in INIT, where the cold-start model (`ground.coldstart`) counts each role's
# imports, not in the first call's weight load. The expert handler needs none of it.
import transformers.modeling_utils  # noqa: F401

from functions import config, metrics, warm, weights
from functions.common import CapacityError, gather_previous, s3_client, use_lambda_threads
from ground import layout
from ground.method import Method
from ground.semantics import adapts, runtime_replicas
from pipeline import transports

__all__ = ["CapacityError", "handler", "replicas_for"]


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "hidden_key", "previous", "expert_failures"?} -> {..., "experts"}.

    "experts" lists, in slot order, each expert function with a non-empty shard as
    {"shards": [...]}: the state machine maps over the functions, and over each one's shards.
    A pipelined layer's experts are already running: if this fails, they are told to stop.
    """
    if warm.is_ping(event):
        return warm.answer("layer")
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    try:
        return _run(cfg, s3, request_id, event)
    except Exception:
        if cfg.layer_plan.method == "pipelined":
            plan = cfg.layer_plan
            transports.abort_pipelined(s3, cfg.bucket, request_id, cfg.layer, list(plan.replicas))
        raise


def replicas_for(plan: config.LayerPlan, layer: int, experts: torch.Tensor) -> list[int]:
    """Replicas of each expert function for this batch's routing `experts` (N, k).

    Raises:
        CapacityError: A function's real tokens do not fit even its `max_replicas` replicas;
            raised before anything is scattered, naming every such function.
    """
    if not adapts(Method.parse(plan.method)):
        return list(plan.replicas)
    routed = experts.reshape(-1).numpy()
    slots = plan.slot_of()[routed[routed < len(plan.slot_of())]]  # adaptive: unused slots out
    tokens = np.bincount(slots, minlength=len(plan.replicas))
    cap = np.array(plan.max_replicas)
    replicas = runtime_replicas(
        tokens, np.array(plan.replicas), cap=cap, per_replica_max=np.array(plan.max_tokens)
    )
    over = np.flatnonzero(replicas > cap)
    if over.size:
        which = "; ".join(
            f"{transports.slot_label(i, plan.hosted[i])}: {tokens[i]:,} tokens, at most "
            f"{plan.max_tokens[i]:,} per replica on {cap[i]} replicas (its reserved concurrency)"
            for i in over
        )
        raise CapacityError(
            f"layer {layer} cannot take this batch ({plan.method}): {which}",
            "make the plan again with more memory for these experts or a higher G "
            "(max_replicas in the calibration), or send smaller batches.",
        )
    return [int(r) for r in replicas]


def _run(cfg: config.Config, s3: Any, request_id: str, event: dict[str, Any]) -> dict[str, Any]:
    index, plan = cfg.layer, cfg.layer_plan
    experts = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest.experts
    hosted = sum(len(members) for members in plan.hosted)
    if hosted != experts:
        raise config.ConfigError(
            f"MOELAMBDA_LAYER_PLAN hosts {hosted} experts, the model has {experts}",
            "deploy the plan made for this model's export, or upload that export.",
        )
    hidden = torch.from_numpy(transports.read_tensors(s3, cfg.bucket, event["hidden_key"])[0])
    expert_sum = None
    if index > 0:
        expert_sum = gather_previous(
            cfg, request_id, event.get("previous"), index - 1, event.get("expert_failures")
        )
    out = weights.layer(s3, cfg.bucket, cfg.weights_prefix, index).run(hidden, expert_sum)
    routed = out.experts.reshape(-1).numpy()
    counts = np.bincount(routed[(routed >= 0) & (routed < experts)], minlength=experts)
    metrics.emit(metrics.expert_counts_record(index, counts, request_id), cfg.metrics_file)
    replicas = replicas_for(plan, index, out.experts)

    residual_key = layout.residual_key(request_id, index)
    transports.write_tensors(s3, cfg.bucket, residual_key, out.residual.numpy())
    routing = (
        out.experts.numpy().astype("int64"),
        out.weights.numpy().astype("float32"),
        plan.slot_of(),  # the gatherer cuts each function's outputs per expert
    )
    transports.write_tensors(s3, cfg.bucket, layout.routing_key(request_id, index), *routing)

    ffn_in = out.ffn_in.numpy()
    shards = transports.split_shards(out.experts, replicas, [list(h) for h in plan.hosted])
    functions = list(plan.expert_functions)
    if plan.method == "direct":  # the experts have run when this returns: nothing to fan out
        transports.call_direct(
            s3,
            cfg.bucket,
            request_id,
            index,
            ffn_in,
            shards,
            functions,
            cfg.invoke,
            plan.payload_limit,
        )
        shards = []
    elif plan.method == "s3":
        transports.scatter_s3(s3, cfg.bucket, request_id, index, ffn_in, shards)
    else:
        transports.scatter_pipelined(s3, cfg.bucket, request_id, index, ffn_in, shards, plan.beta)
    key_of = layout.shard_key if plan.method == "s3" else layout.minibatch_prefix
    described = [
        s.describe(request_id, index, functions[s.expert])
        | {"input_key": key_of(request_id, index, s.expert, s.replica)}
        for s in shards
        if s.tokens.size
    ]
    grouped = groupby(described, key=lambda shard: shard["expert"])
    return {
        "request_id": request_id,
        "hidden_key": residual_key,
        "layer": index,
        "experts": [{"shards": list(group)} for _, group in grouped],
    }


warm.preload_if_provisioned("layer")
