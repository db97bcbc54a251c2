"""The gates' routing metrics as CloudWatch embedded metric format (EMF) records: the one
definition `functions.metrics` writes (through Powertools' Metrics) and `planner.drift` reads.

One record per gate invocation: namespace `moelambda`, dimension `Layer`, one Count metric
`ExpertNNTokens` per expert of the layer (a token counts once for each of its k experts), and
`request_id` as a property.
"""

from __future__ import annotations

from typing import Any

__all__ = ["NAMESPACE", "metric_name", "metric_value"]

NAMESPACE = "moelambda"


def metric_name(expert: int) -> str:
    return f"Expert{expert:02d}Tokens"


def metric_value(record: dict[str, Any], name: str) -> float:
    """A metric's value in an EMF record: a number, or a list of samples (Powertools writes
    `[7.0]`), which CloudWatch aggregates and a count sums."""
    value = record[name]
    if isinstance(value, list):
        return float(sum(float(v) for v in value))
    return float(value)
