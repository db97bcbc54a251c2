"""Layer function: gathers the previous layer's experts, runs block + gate, scatters to experts.

The gather of layer LL-1 happens here (not in a function of its own) because the combine of
LL-1 is exported with layer LL: one function, one round trip to S3 less per layer.
"""

from __future__ import annotations

from typing import Any

import torch

from functions import config, weights
from functions.common import gather_previous, s3_client
from ground import layout
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "hidden_key", "previous", "expert_failures"?} -> {..., "shards"}.

    A pipelined layer's experts are already running: if this fails, they are told to stop.
    """
    cfg = config.current()
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    try:
        return _run(cfg, s3, request_id, event)
    except Exception:
        if cfg.layer_plan.method == "pipelined":
            plan = cfg.layer_plan
            transports.abort_pipelined(s3, cfg.bucket, request_id, cfg.layer, list(plan.replicas))
        raise


def _run(cfg: config.Config, s3: Any, request_id: str, event: dict[str, Any]) -> dict[str, Any]:
    index, plan = cfg.layer, cfg.layer_plan
    experts = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest.experts
    if len(plan.replicas) != experts:
        raise config.ConfigError(
            f"MOELAMBDA_LAYER_PLAN lists {len(plan.replicas)} experts, the model has {experts}"
        )
    hidden = torch.from_numpy(transports.read_tensors(s3, cfg.bucket, event["hidden_key"])[0])
    expert_sum = None
    if index > 0:
        expert_sum = gather_previous(
            cfg, request_id, event.get("previous"), index - 1, event.get("expert_failures")
        )
    out = weights.layer(s3, cfg.bucket, cfg.weights_prefix, index).run(hidden, expert_sum)

    residual_key = layout.residual_key(request_id, index)
    transports.write_tensors(s3, cfg.bucket, residual_key, out.residual.numpy())
    routing = (out.experts.numpy().astype("int64"), out.weights.numpy().astype("float32"))
    transports.write_tensors(s3, cfg.bucket, layout.routing_key(request_id, index), *routing)

    ffn_in = out.ffn_in.numpy()
    shards = transports.split_shards(out.experts, list(plan.replicas))
    functions = list(plan.expert_functions)
    if plan.method == "direct":  # the experts have run when this returns: nothing to fan out
        transports.call_direct(
            s3, cfg.bucket, request_id, index, ffn_in, shards, functions, cfg.invoke
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
    return {
        "request_id": request_id,
        "hidden_key": residual_key,
        "layer": index,
        "shards": described,
    }
