"""The gates' routing metrics: tokens per expert of every batch, in CloudWatch's embedded
metric format (EMF), so that drift from the plan's popularity shows in CloudWatch and
`moelambda replan` can read it back.

One record per gate invocation: namespace `moelambda`, dimension `Layer`, one metric
`ExpertNNTokens` (Count) per expert of the layer (a token counts once for each of its k
experts, as the plan's `tokens` do), plus `request_id` as a property. On Lambda the record is
one line on stdout, which CloudWatch Logs turns into metrics (the format is a JSON document
with an `_aws` member, https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/
CloudWatch_Embedded_Metric_Format_Specification.html; Powertools for AWS Lambda's Metrics
writes the same document). Locally, `run-local --metrics-out FILE` sets
`MOELAMBDA_METRICS_FILE` and the records are appended to that file, one per line.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

from ground.routing_metrics import NAMESPACE, expert_counts_record, metric_name

__all__ = ["NAMESPACE", "emit", "expert_counts_record", "metric_name"]

_LOCK = threading.Lock()


def emit(record: dict[str, Any], path: str | None) -> None:
    """Write `record` where the deployment reads it: the local metrics file `path` when the
    runner set one, stdout on Lambda, nowhere otherwise (a local run without --metrics-out)."""
    line = json.dumps(record, separators=(",", ":"))
    if path:
        with _LOCK, open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
    elif os.environ.get("AWS_LAMBDA_FUNCTION_NAME"):
        print(line, flush=True)
