"""Expert function: the experts of one layer it hosts, on one shard, by the layer's method."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from functions import config, warm, weights
from functions.common import s3_client, use_lambda_threads
from ground import layout
from moe import on_host, place
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """A shard dict (s3, pipelined) or a shard dict with "payload" (direct) -> its result.

    An expert a driver invokes (MOELAMBDA_DRIVER=1, method direct) takes its rows inline, or,
    for a shard past the payload limit, reads them from S3 and writes its output there.

    Layer, slot and hosted experts come from the environment, which decided the weights this
    container holds (all of them resident); an event naming another layer or slot was routed to
    the wrong function and is refused. The shard's rows are each hosted expert's in turn.
    A GPU-backed expert (its placement, `ground.placement`) runs them on its device; its rows
    come and go as float32 on the host.
    """
    if warm.is_ping(event):
        return warm.answer("expert")
    cfg = config.current()
    use_lambda_threads(cfg)
    index, number, method = cfg.layer, cfg.expert, cfg.method
    request_id = layout.validate_request_id(event.get("request_id"))
    for name, value in (("layer", index), ("expert", number)):
        if name in event and int(event[name]) != value:
            raise config.ConfigError(
                f"event for {name} {event[name]} reached the function of layer {index} "
                f"expert {number}"
            )
    replica = int(event["replica"])
    s3 = s3_client()
    stages = [weights.expert(s3, cfg.bucket, cfg.weights_prefix, index, m) for m in cfg.hosted]

    def compute(x: np.ndarray, hosted_rows: np.ndarray) -> np.ndarray:
        if len(hosted_rows) != len(stages) or int(hosted_rows.sum()) != x.shape[0]:
            raise config.ConfigError(
                f"a shard of {x.shape[0]} rows split {hosted_rows.tolist()} reached the function "
                f"of layer {index} slot {number}, which hosts experts {list(cfg.hosted)}"
            )
        parts = place(cfg.placement, torch.from_numpy(x)).split(hosted_rows.tolist())
        out = torch.cat([stage.run(part) for stage, part in zip(stages, parts, strict=True)])
        return on_host(out).numpy()

    result = {"request_id": request_id, "layer": index, "expert": number, "replica": replica}
    # A driver's expert takes rows past the payload limit through S3, as an s3 expert does.
    through_s3 = method == "direct" and "payload" not in event and cfg.invoked_by_driver
    if method == "direct" and not through_s3:  # the response must fit the Invoke limit too
        if "payload" not in event:
            raise config.ConfigError(
                f"a direct event for layer {index} expert {number} carries no rows (payload)"
            )
        y = compute(*transports.direct_decode(event["payload"]))
        return transports.direct_event(
            request_id, index, number, replica, y, limit=cfg.payload_limit
        )
    if method == "s3" or through_s3:
        x, hosted_rows = transports.read_tensors(
            s3, cfg.bucket, layout.shard_key(request_id, index, number, replica)
        )
        key = layout.out_key(request_id, index, number, replica)
        transports.write_tensors(s3, cfg.bucket, key, compute(x, hosted_rows))
        return result | {"tokens": x.shape[0], "output_key": key}
    minibatches, tokens = transports.serve_pipelined(
        s3,
        cfg.bucket,
        request_id,
        index,
        number,
        replica,
        compute,
        poll_s=cfg.poll_s,
        timeout_s=cfg.timeout_s,
    )
    return result | {"tokens": tokens, "minibatches": minibatches}


warm.preload_if_provisioned("expert")
