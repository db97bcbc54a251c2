"""The gates' routing metrics as CloudWatch embedded metric format (EMF) records: the one
definition `functions.metrics` writes and `planner.drift` reads (see functions/metrics.py).

One record per gate invocation: namespace `moelambda`, dimension `Layer`, one Count metric
`ExpertNNTokens` per expert of the layer (a token counts once for each of its k experts), and
`request_id` as a property.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["NAMESPACE", "expert_counts_record", "metric_name"]

NAMESPACE = "moelambda"


def metric_name(expert: int) -> str:
    return f"Expert{expert:02d}Tokens"


def expert_counts_record(layer: int, counts: np.ndarray, request_id: str) -> dict[str, Any]:
    """The EMF document of one gate's batch: `counts[e]` tokens routed to expert e."""
    metrics = {metric_name(e): int(n) for e, n in enumerate(counts)}
    return {
        "_aws": {
            "Timestamp": int(time.time() * 1000),
            "CloudWatchMetrics": [
                {
                    "Namespace": NAMESPACE,
                    "Dimensions": [["Layer"]],
                    "Metrics": [{"Name": name, "Unit": "Count"} for name in metrics],
                }
            ],
        },
        "Layer": str(layer),
        "request_id": request_id,
        **metrics,
    }
