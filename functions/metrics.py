"""The gates' routing metrics: tokens per expert of every batch, in CloudWatch's embedded
metric format (EMF), written by Powertools for AWS Lambda's Metrics, so that drift from the
plan's popularity shows in CloudWatch and `moelambda replan` can read it back.

One record per gate invocation (`expert_counts_record`): namespace `moelambda`, dimension
`Layer`, one metric `ExpertNNTokens` (Count) per expert of the layer (a token counts once for
each of its k experts, as the plan's `tokens` do), and `request_id` as metadata (a top-level
property, not a dimension). Powertools writes each value as a list of samples (`[7.0]`);
`ground.routing_metrics.metric_value` reads that and a plain number alike. The record is built
by an `EphemeralMetrics` of its own per call: the local runner runs many gates at once in one
process, and Powertools' `Metrics` shares its metric set across instances. On Lambda the
record is one line on stdout, which CloudWatch Logs turns into metrics (the format:
https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
CloudWatch_Embedded_Metric_Format_Specification.html). Locally, `run-local --metrics-out FILE`
sets `MOELAMBDA_METRICS_FILE` and the records are appended to that file, one per line.

Powertools flushes a metric set by itself when it reaches 100 metrics (`MAX_METRICS`): a
layer of more than 100 experts would split its record, which `replan` does not read.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import numpy as np
from aws_lambda_powertools.metrics import EphemeralMetrics, MetricUnit

from ground.routing_metrics import NAMESPACE, metric_name

__all__ = ["NAMESPACE", "emit", "expert_counts_record", "metric_name"]

_LOCK = threading.Lock()


def expert_counts_record(layer: int, counts: np.ndarray, request_id: str) -> dict[str, Any]:
    """The EMF document of one gate's batch, as Powertools serialises it: `counts[e]` tokens
    routed to expert e."""
    metrics = EphemeralMetrics(namespace=NAMESPACE)
    metrics.add_dimension(name="Layer", value=str(layer))
    for expert, count in enumerate(counts):
        metrics.add_metric(name=metric_name(expert), unit=MetricUnit.Count, value=int(count))
    metrics.add_metadata(key="request_id", value=request_id)
    return metrics.serialize_metric_set()


def emit(record: dict[str, Any], path: str | None) -> None:
    """Write `record` where the deployment reads it: the local metrics file `path` when the
    runner set one, stdout on Lambda, nowhere otherwise (a local run without --metrics-out)."""
    line = json.dumps(record, separators=(",", ":"))
    if path:
        with _LOCK, open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    elif os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        print(line, flush=True)
