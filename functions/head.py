"""Head function: token ids -> embeddings, the hidden state the first layer starts from."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# Building this stage needs Hugging Face's model classes: their common base (the bulk of the
# import) loads in INIT, where the cold-start model (`ground.coldstart`) counts each role's
# imports, not in the first call's weight load. The expert handler needs none of it.
import transformers.modeling_utils  # noqa: F401

from functions import config, warm, weights
from functions.common import s3_client, use_lambda_threads
from ground import layout
from ground.errors import UsageError
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
    given = event.get("input") or {}
    if "input_ids" in given:
        ids = _inline_ids(given["input_ids"])
    else:
        key = layout.input_key(layout.validate_execution_name(event.get("execution")))
        ids = transports.read_tensors(s3, cfg.bucket, key)[0]
    hidden = weights.head(s3, cfg.bucket, cfg.weights_prefix).run(torch.from_numpy(ids))
    key = layout.head_key(request_id)
    transports.write_tensors(s3, cfg.bucket, key, hidden.numpy())
    return {"request_id": request_id, "hidden_key": key}


def _inline_ids(value: Any) -> np.ndarray:
    """Token ids sent in the execution input, as an (N, T) int64 array."""
    try:
        ids = np.asarray(value, dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as err:
        raise UsageError(
            f"input_ids is not a list of lists of token ids: {err}",
            'send {"input_ids": [[101, 2023, ...], ...]} with windows of equal length.',
        ) from err
    if ids.ndim != 2 or ids.size == 0 or (ids < 0).any():
        raise UsageError(
            f"input_ids must be a non-empty 2-D list of non-negative token ids, not shape "
            f"{ids.shape}",
            'send {"input_ids": [[101, 2023, ...], ...]} with windows of equal length.',
        )
    return ids


warm.preload_if_provisioned("head")
