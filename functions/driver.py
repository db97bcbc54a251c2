"""Driver function: one request's whole model in one process, with its remote experts invoked.

The driver (`ground.driver`) runs the non-MoE stack of every layer (head, attention blocks,
norms, gates, combines, tail) and its local experts in process, through the one layer loop
(`moe.run_stages`); each layer's other experts it invokes, all at once, carrying their rows
inline or, past the Invoke payload limit, through S3 (`pipeline.transports.call_remote`). A
monolithic function is the driver with every expert local. A warm driver keeps every stage it
built (`functions.weights`).

Its local experts come from its environment (MOELAMBDA_DRIVER_LOCAL, which a provisioned
environment's INIT and a warmer's ping need); the remote ones, whose function names could pass
Lambda's 4 KB of environment, from the event the one-state workflow gives it (`remote`, set by
the state machine's definition, not by the caller).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# Building the stages needs Hugging Face's model classes: their import belongs to INIT.
import transformers.modeling_utils  # noqa: F401

from functions import config, metrics, warm, weights
from functions.common import (
    CapacityError,
    request_ids,
    s3_client,
    use_lambda_threads,
    write_results,
)
from ground import layout
from ground.semantics import runtime_replicas
from moe import LayerOutput, gather_shards, routing_shards, run_stages
from pipeline import transports

__all__ = ["handler"]


class _Stages:
    """The driver's stages, from the warm cache (`moe.Stages`)."""

    def __init__(self, s3: Any, bucket: str, prefix: str) -> None:
        self._where = (s3, bucket, prefix)

    def head(self) -> Any:
        return weights.head(*self._where)

    def layer(self, layer: int) -> Any:
        return weights.layer(*self._where, layer)

    def tail(self) -> Any:
        return weights.tail(*self._where)

    def expert(self, layer: int, expert: int) -> Any:
        return weights.expert(*self._where, layer, expert)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "execution", "input", "remote"} -> {"request_id", "output_key"}.

    Intermediates exist only for shards that went through S3; they are deleted before the
    driver returns, whether it succeeds or fails (the workflow's cleanup is the fallback for
    a driver that dies). A second delivery computes the same output again.
    """
    if warm.is_ping(event):
        return warm.answer("driver")
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    manifest = weights.loader(s3, cfg.bucket, cfg.weights_prefix).manifest
    local = cfg.driver_local
    remote = config.remote_plan(event.get("remote"), manifest.num_layers, local, manifest.experts)
    ids = request_ids(s3, cfg.bucket, event)
    stages = _Stages(s3, cfg.bucket, cfg.weights_prefix)
    overflowed = 0

    def experts(layer: int, out: LayerOutput) -> torch.Tensor:
        nonlocal overflowed
        routed = out.experts.reshape(-1).numpy()
        counts = np.bincount(routed[routed < manifest.experts], minlength=manifest.experts)
        metrics.emit(metrics.expert_counts_record(layer, counts, request_id), cfg.metrics_file)
        shards_of = routing_shards(out.experts, out.weights, manifest.experts)
        parts = {
            e: (shards_of[e][0], shards_of[e][1], stages.expert(layer, e).run(out.ffn_in[t]))
            for e in local[layer]
            if (t := shards_of[e][0]).numel()
        }
        functions = remote[layer]
        shards = _shards(layer, functions, shards_of)
        got, over = transports.call_remote(
            s3,
            cfg.bucket,
            request_id,
            layer,
            out.ffn_in.numpy(),
            shards,
            [f.function for f in functions],
            cfg.invoke,
            cfg.payload_limit,
        )
        overflowed += over
        for slot, f in enumerate(functions):
            tokens, w = shards_of[f.expert]
            pieces = [got[key] for key in sorted(got) if key[0] == slot]
            if pieces:
                parts[f.expert] = (tokens, w, torch.from_numpy(np.concatenate(pieces)))
        # expert by expert, as the monolithic forward adds them
        ordered = [parts[e] for e in sorted(parts)]
        return gather_shards(out.ffn_in.shape[0], manifest.hidden_size, ordered)

    try:
        output = run_stages(stages, manifest.num_layers, torch.from_numpy(ids), experts)
        result = output.numpy().astype("float32")
        key = layout.output_key(request_id)
        write_results(s3, cfg.bucket, result, (event.get("input") or {}).get("requests"))
        transports.write_tensors(s3, cfg.bucket, key, result)
    finally:
        if overflowed:
            transports.delete_request(s3, cfg.bucket, request_id)
    return {"request_id": request_id, "output_key": key}


def _shards(
    layer: int,
    functions: list[config.RemoteFunction],
    shards_of: list[tuple[torch.Tensor, torch.Tensor]],
) -> list[transports.ShardRows]:
    """Each remote expert's rows split over the replicas its real tokens need (the plan's,
    more where one replica's memory cannot hold its share, up to its cap), as a direct gate
    splits them (`ground.semantics.runtime_replicas`).

    Raises:
        CapacityError: An expert's tokens do not fit even its cap of replicas.
    """
    tokens = np.array([shards_of[f.expert][0].numel() for f in functions], dtype=int)
    planned = np.array([f.replicas for f in functions], dtype=int)
    cap = np.array([f.max_replicas for f in functions], dtype=int)
    fits = np.array([f.max_tokens for f in functions], dtype=int)
    replicas = runtime_replicas(tokens, planned, cap, fits) if functions else planned
    over = np.flatnonzero(replicas > cap)
    if over.size:
        which = "; ".join(
            f"expert {functions[i].expert}: {tokens[i]:,} tokens, at most {fits[i]:,} per "
            f"replica on {cap[i]} replicas"
            for i in over
        )
        raise CapacityError(
            f"layer {layer} cannot take this batch: {which}",
            "make the plan again with more memory for these experts, or send smaller batches.",
        )
    shards = []
    for slot, (f, count) in enumerate(zip(functions, replicas, strict=True)):
        rows = shards_of[f.expert][0].numpy().astype(np.int64)
        for r, chunk in enumerate(np.array_split(rows, int(count))):
            shards.append(
                transports.ShardRows(slot, r, chunk, np.array([chunk.size], dtype=np.int64))
            )
    return shards


warm.preload_if_provisioned("driver")
