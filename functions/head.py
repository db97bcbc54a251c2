"""Head function: token ids -> embeddings, the hidden state the first layer starts from."""

from __future__ import annotations

from typing import Any

import torch

# Building this stage needs Hugging Face's model classes: their common base (the bulk of the
# import) loads in INIT, where the cold-start model (`ground.coldstart`) counts each role's
# imports, not in the first call's weight load. The expert handler needs none of it.
import transformers.modeling_utils  # noqa: F401

from functions import config, warm, weights
from functions.common import request_ids, s3_client, use_lambda_threads
from ground import layout
from pipeline import transports


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """{"request_id", "execution", "input"} -> {"request_id", "hidden_key"}.

    The state machine sets `request_id` (the hash of the execution's ARN) and `execution` (its
    name); `input` is the caller's execution input. The token ids come inline as
    `input["input_ids"]` (a list of equal-length lists of ints, within the workflow's input
    limit), else from `inputs/<execution name>.bin`, never from a key the caller names.
    """
    if warm.is_ping(event):
        return warm.answer("head")
    cfg = config.current()
    use_lambda_threads(cfg)
    request_id = layout.validate_request_id(event.get("request_id"))
    s3 = s3_client()
    ids = request_ids(s3, cfg.bucket, event)
    hidden = weights.head(s3, cfg.bucket, cfg.weights_prefix).run(torch.from_numpy(ids))
    key = layout.head_key(request_id)
    transports.write_tensors(s3, cfg.bucket, key, hidden.numpy())
    return {"request_id": request_id, "hidden_key": key}


warm.preload_if_provisioned("head")
