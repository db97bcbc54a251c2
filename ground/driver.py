"""Deployment semantics of the shapes beside the fan-out workflow: a driver, or one function.

A *driver* is one Lambda function that runs the whole non-MoE stack of a request in process:
head, every layer's attention block, norms, gate and combine, and the tail. It also runs the
experts the plan marks *local* (`Plan.driver.local`) in process. Every other (*remote*) expert
has its own function, which the driver calls per layer with a synchronous Invoke, all of a
layer's calls at once (one thread each), carrying the expert's routed rows. A *monolithic*
deployment is the driver with every expert local: one function, no remote call at all.

What one request does (`driver_request_counts` counts it, the meter of a local run counts the
same requests where they happen):

    Step Functions: one Task state invokes the driver (the front door's batcher and a client
      start the one-state workflow as they start the fan-out one);
    driver: GET inputs/<execution>.bin (unless the ids came inline), then per layer:
      layer stage on every token -> remote experts started, each non-empty shard (the gate's
      split over the expert's replicas, `ground.semantics.shard_sizes`) one Invoke, while the
      local experts run in process -> joined (`layer_seconds`: the longer of the two):
        inline:   the rows travel base64 in the Invoke's JSON event and response, when the
                  event fits the Invoke payload limit (`direct_event_bytes`);
        overflow: past it, through S3 under the request's prefix, as the s3 method does: the
                  driver PUTs the shard, the expert GETs it and PUTs its output, the driver GETs
                  that (2 PUT + 2 GET per shard);
      -> the tail; PUT outputs/<request id>.bin; if any shard overflowed, LIST and delete the
      request's prefix (1,000 keys per call).

Billing: the driver is billed from its start to its return, waits on its remote experts
included; a remote expert from its start to its return; every started function is one Lambda
request; the workflow is one Express execution (request and duration) or one Standard
transition. Nothing here imports torch, boto3 or CDK: the planner, the handlers and the CDK app
read the same rules.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from ground.semantics import Requests, direct_event_bytes, shard_sizes

__all__ = [
    "DRIVER_TRANSITIONS",
    "activation_bytes",
    "decode_local",
    "encode_local",
    "driver_request_counts",
    "layer_seconds",
    "overflows",
    "remote_call_s",
    "remote_table",
    "remote_table_bytes",
    "shard_counts",
]

DRIVER_TRANSITIONS = 1  # the one Task state a successful execution enters
# What a driver invokes for a remote expert: a function name (at most 64 characters on Lambda)
# or, where the plan provisions the expert, its `live` alias.
INVOKED_NAME_MAX = 64 + len(":live")


def remote_table(plan: Any, names: list[list[str]]) -> list[list[list[Any]]]:
    """The remote-expert table the driver's Task carries in its parameters (the state machine's
    definition sets it: hundreds of names would pass Lambda's 4 KB of environment): per layer,
    per expert function, [its first hosted expert, the name invoked, planned replicas, cap,
    max tokens per replica]. `plan` is a `ground.plan.Plan`; `names[layer][slot]` what its
    functions are invoked as."""
    return [
        [
            [e.hosted[0], name, e.replicas, e.max_replicas, e.max_tokens_per_replica]
            for e, name in zip(layer.experts, layer_names, strict=True)
        ]
        for layer, layer_names in zip(plan.layers, names, strict=True)
    ]


def remote_table_bytes(plan: Any) -> int:
    """At most the bytes `remote_table` adds to a driver Task's payload (0 for the fan-out
    workflow, whose Tasks carry no table): every name at its longest, JSON's spaced separators.

    The table rides beside the execution's input, under Step Functions' payload limit: the
    front door's batcher leaves it this room (`ground.frontdoor.inline_input_limit`).
    """
    if not plan.topology.driven:
        return 0
    names = [["x" * INVOKED_NAME_MAX] * len(layer.experts) for layer in plan.layers]
    return len(json.dumps({"remote": remote_table(plan, names)}).encode())


def overflows(rows: int | np.ndarray, token_bytes: int, limit: int) -> bool | np.ndarray:
    """Whether a remote shard of `rows` rows goes through S3: its inline Invoke event (the
    rows base64 in JSON) would exceed `limit`. The response carries as many rows of the same
    width, so an event that fits has a response that fits."""
    out = np.asarray(direct_event_bytes(np.asarray(rows), token_bytes)) > limit
    return bool(out) if out.ndim == 0 else out


def remote_call_s(
    round_trip_s: float,
    rows: float | np.ndarray,
    row_bytes: float,
    bandwidth: float,
    compute_s: float | np.ndarray,
    *,
    through_s3: bool | np.ndarray = False,
    s3_delay_s: float = 0.0,
    s3_bandwidth: float = 1.0,
) -> float | np.ndarray:
    """The one rule for a remote expert call's wall time, as its caller waits on it.

    A synchronous Invoke costs its round trip (`invoke_round_trip_s`: the callee's warm start
    and the Lambda front end's request), the `rows` rows' bytes in and out (`row_bytes`, both
    directions) at the Invoke `bandwidth`, and the callee's `compute_s` for them. A shard past
    the payload limit goes through S3 instead (`through_s3`): the caller PUTs it and GETs the
    output, the callee GETs it and PUTs its output (four request delays, each row's bytes
    twice at S3's bandwidth). Every model that prices a remote call (the driver's workload,
    generation's decode step, GPU groups) calls this, so they cannot disagree.
    """
    inline = round_trip_s + rows * row_bytes / bandwidth + compute_s
    if through_s3 is False:
        return inline
    stored = round_trip_s + 4 * s3_delay_s + 2 * rows * row_bytes / s3_bandwidth + compute_s
    return np.where(through_s3, stored, inline)


def layer_seconds(local_s: float | np.ndarray, remote_s: float | np.ndarray) -> float | np.ndarray:
    """A driver layer's expert phase: the handler starts its remote calls, runs its local
    experts meanwhile and then joins (`functions.driver`), so the phase lasts the longer of
    the two. The planner's models and the handler's measured layer line both use this."""
    return np.maximum(local_s, remote_s)


def shard_counts(tokens: int, replicas: int, token_bytes: int, limit: int) -> tuple[int, int, int]:
    """(non-empty shards, of which overflow, the most rows of an inline shard) of an expert
    whose `tokens` rows are split over `replicas` (`shard_sizes`, the split the driver makes)."""
    sizes = shard_sizes(tokens, replicas)
    busy = sizes[sizes > 0]
    over = overflows(busy, token_bytes, limit) if busy.size else np.zeros(0, bool)
    inline = busy[~over]
    return int(busy.size), int(over.sum()), int(inline.max(initial=0))


def _listing_calls(keys: int) -> int:
    return max(1, -(-keys // 1000))


def driver_request_counts(
    tokens: np.ndarray,
    replicas: np.ndarray,
    local: np.ndarray,
    token_bytes: int,
    limit: int,
) -> tuple[Requests, int]:
    """Every billed request of one driver execution, and its largest inline event's bytes.

    Args:
        tokens: (L, E) whole tokens routed to each expert.
        replicas: (L, E) replicas each remote expert's rows are split over (ignored where local).
        local: (L, E) True where the driver runs the expert itself.
        token_bytes: Bytes of one row either way (the wider of in and out).
        limit: The Invoke payload limit an inline event must fit.
    """
    total = Requests(lambda_requests=1, s3_get=1, s3_put=1, transitions=DRIVER_TRANSITIONS)
    keys = 0
    largest = 0
    remote = np.argwhere(~np.asarray(local, bool))
    for layer, expert in remote:
        busy, over, rows = shard_counts(
            int(tokens[layer, expert]), int(replicas[layer, expert]), token_bytes, limit
        )
        total.lambda_requests += busy
        total.s3_put += 2 * over
        total.s3_get += 2 * over
        keys += 2 * over
        if rows:
            largest = max(largest, int(direct_event_bytes(rows, token_bytes)))
    if keys:
        total.s3_list += _listing_calls(keys)
        total.s3_delete += _listing_calls(keys)
    return total, largest


def activation_bytes(
    tokens: int, token_bytes: int, top_k: int, states: float, *, remote: bool
) -> int:
    """Peak bytes of a batch's tensors in the driver, beside its weights and the runtime.

    `states` hidden-state-sized tensors per token are alive at once in a layer (the residual,
    the FFN input, the expert sum, the block's intermediates; measured, in the calibration
    file), plus the rows routed to the experts, once as the gathered input and once as the
    outputs (top_k rows per token); with `remote` experts, at worst every routed row is also
    held base64-encoded, once in an event and once in a response (4/3 of the raw bytes each).
    """
    routed = 2 * top_k + (top_k * 8 / 3 if remote else 0.0)
    return int(math.ceil(tokens * token_bytes * (states + routed)))


def encode_local(local: list[list[int]]) -> str:
    """The driver's local experts as its environment carries them (MOELAMBDA_DRIVER_LOCAL):
    per layer a hexadecimal bit mask (bit i: expert i), comma-separated. OLMoE's 16 layers of
    64 experts take 271 characters, where a list of numbers could pass Lambda's 4 KB."""
    return ",".join(format(sum(1 << int(i) for i in experts), "x") for experts in local)


def decode_local(text: str) -> list[list[int]]:
    """`encode_local`'s inverse.

    Raises:
        ValueError: Not comma-separated hexadecimal masks.
    """
    masks = [int(part, 16) for part in text.split(",")] if text else []
    return [[i for i in range(mask.bit_length()) if mask >> i & 1] for mask in masks]
