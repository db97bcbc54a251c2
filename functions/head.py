"""Head function: token ids -> embeddings, the hidden state the first layer starts from."""

from __future__ import annotations

from typing import Any

import torch

from functions import config, weights
from functions.common import s3_client, use_lambda_threads
from ground import layout
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "input_key"} -> {"request_id", "hidden_key"}."""
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    ids = transports.read_tensors(s3, cfg.bucket, event["input_key"])[0]
    hidden = weights.head(s3, cfg.bucket, cfg.weights_prefix).run(torch.from_numpy(ids))
    key = layout.head_key(request_id)
    transports.write_tensors(s3, cfg.bucket, key, hidden.numpy())
    return {"request_id": request_id, "hidden_key": key}
