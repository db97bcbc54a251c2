"""Deployment semantics: what the emitted workflow does per request, in one place.

The cost model, the serving simulator, Plan validation, the state-machine builder, the handlers
and the local meter all read these rules, so a plan's promise and the deployed workflow cannot
drift apart. The numbers (limits, prices) live in the calibration file; this module holds the
rules that use them. No torch, boto3 or CDK here: everything is integers and numpy arrays.

The workflow of one request (per MoE layer e, experts i with d_i tokens on g_i replicas):

    Head (GET input, PUT hidden)
    per layer: the gate function reads the hidden state, gathers layer e-1's outputs (GET
      routing, LIST outputs, GET each), computes, writes residual and routing (2 PUT), then
      s3:        PUTs one object per non-empty shard and returns; then a Map over the experts
                 with a non-empty shard, each a Map over that expert's shards, invokes them
                 (GET shard, PUT output each);
      pipelined: runs beside a Map over every planned (expert, replica), started with the gate:
                 the gate PUTs minibatches of beta rows and a done marker per replica; each
                 replica polls (GETs) for its minibatches and PUTs one output per minibatch;
      direct:    invokes every non-empty shard itself with the rows inline, waits for all of
                 them, and PUTs one output object per shard;
    Tail (gathers the last layer, PUTs the output, LISTs and deletes the intermediates)

An expert function may host several experts of its layer (packing): the gate then splits the
rows of all of them (each expert's rows in turn, experts ascending) among the function's
replicas, and every shard, minibatch or direct event carries, beside its rows, how many rows
belong to each hosted expert (`hosted_rows_bytes`). Requests are counted per function: one
invocation serves a shard of every expert it hosts.

Billing: a function is billed from its start to its return. A direct gate is billed while its
experts run; a pipelined replica from its start with the gate, busy or idle; an S3 gate only
until its upload returns (the Map starts after it). Every started function is one Lambda request.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np

from ground.method import Method

__all__ = [
    "DIRECT_EVENT_BYTES",
    "POLL_S",
    "Requests",
    "S3_REQUEST_TYPES",
    "USAGE_KEYS",
    "adapts",
    "direct_event_bytes",
    "express_duration_usd",
    "hosted_rows_bytes",
    "max_direct_tokens",
    "request_counts",
    "runtime_replicas",
    "shard_sizes",
    "tensor_object_bytes",
    "threads_for",
]

POLL_S = 0.02  # a pipelined replica's first wait between polls; it doubles to 4x while idle

# Bytes of the JSON envelope of a direct Invoke event or response, payload string excluded, at
# the widest values the contract allows (64-character request id and function name, 6-digit
# layer, expert, replica and token numbers). `pipeline.transports` builds the events; a test
# checks that no event it builds exceeds this bound.
DIRECT_EVENT_BYTES = len(
    '{"request_id": "' + "r" * 64 + '", "layer": 999999, "expert": 999999, "replica": 999999, '
    '"tokens": 999999, "function": "' + "f" * 64 + '", "payload": ""}'
)


def tensor_object_bytes(rows: int, row_bytes: int, ndim: int = 2) -> int:
    """Bytes of one tensor in `pipeline.tensorio`'s format: magic, count, dtype, ndim, shape."""
    return 4 + 1 + 2 + 4 * ndim + rows * row_bytes


def hosted_rows_bytes(hosted: int) -> int:
    """Bytes the rows-per-hosted-expert tensor (int64, one per expert) adds to a shard object."""
    return 2 + 4 + 8 * int(hosted)


def direct_event_bytes(
    tokens: int | np.ndarray, token_bytes: int, hosted: int = 1
) -> int | np.ndarray:
    """Upper bound of the JSON bytes of a direct Invoke carrying `tokens` rows (either way) to a
    function hosting `hosted` experts.

    The rows travel base64-encoded inside the JSON event, 4/3 of the raw tensor: the 6 MB Invoke
    limit applies to the event, not to the tensor. The event also carries the rows per hosted
    expert; the response, rows only, is smaller.
    """
    raw = tensor_object_bytes(0, 0) + np.asarray(tokens) * token_bytes + hosted_rows_bytes(hosted)
    encoded = 4 * -(-raw // 3)
    out = DIRECT_EVENT_BYTES + encoded
    return int(out) if np.ndim(out) == 0 else out


def max_direct_tokens(limit_bytes: int, token_bytes: int, hosted: int = 1) -> int:
    """The most rows one direct Invoke can carry under `limit_bytes` (0 if not even one)."""
    room = (limit_bytes - DIRECT_EVENT_BYTES) // 4 * 3 - tensor_object_bytes(0, 0)
    tokens = max((room - hosted_rows_bytes(hosted)) // token_bytes, 0)
    while tokens > 0 and direct_event_bytes(tokens, token_bytes, hosted) > limit_bytes:
        tokens -= 1
    return int(tokens)


def adapts(method: Method) -> bool:
    """Whether the layer's replica count can follow the batch's real counts at run time.

    s3 and direct: the gate splits the real tokens into shards and the fan-out follows them.
    pipelined: the replicas start with the gate, before it knows the counts, so the plan's
    replicas are what runs; more tokens only make each replica run longer (its memory holds
    two minibatches, whatever the count).
    """
    return method is not Method.PIPELINED


def runtime_replicas(
    tokens: np.ndarray, planned: np.ndarray, cap: np.ndarray, per_replica_max: np.ndarray
) -> np.ndarray:
    """Replicas the gate uses for real counts: the plan's, more if memory or payload need them.

    `per_replica_max` is the most tokens one replica can take (memory, and payload for direct);
    the count never exceeds `cap` (the function's reserved concurrency). Where even `cap`
    replicas cannot hold the tokens, the result exceeds `cap`: the caller must refuse it.
    """
    tokens = np.asarray(tokens, dtype=float)
    need = np.ceil(tokens / np.maximum(per_replica_max, 1)).astype(int)
    wanted = np.maximum(np.asarray(planned, dtype=int), need)
    return np.where(need > cap, need, np.minimum(wanted, cap)).astype(int)


def shard_sizes(tokens: int, replicas: int) -> np.ndarray:
    """Rows of each replica: `tokens` split into `replicas` near-equal contiguous chunks.

    The first tokens % replicas chunks take one row more (numpy's array_split), the split the
    gate makes and the gatherer undoes.
    """
    q, rem = divmod(int(tokens), int(replicas))
    return np.array([q + 1] * rem + [q] * (int(replicas) - rem), dtype=int)


def threads_for(memory_mb: int, mb_per_vcpu: float) -> int:
    """torch threads of a function: the vCPUs Lambda grants at `memory_mb`, at least one.

    U_j above one vCPU assumes the extra cores compute; the image must not pin one thread.
    """
    return max(1, math.ceil(memory_mb / mb_per_vcpu - 1e-9))


def express_duration_usd(
    seconds: float, memory_mb: float, step_s: float, mb_s_usd: float
) -> float:
    """An Express execution's duration charge: its time rounded up to `step_s`, at the
    workflow's billed memory. The solvers price time linearly (`mb_s_usd` per second); only
    the bill rounds, so the two differ by less than one step's charge."""
    billed = math.ceil(seconds / step_s - 1e-9) * step_s
    return billed * memory_mb * mb_s_usd


@dataclass
class Requests:
    """Billed requests of one request's workflow, by type; `add` sums them.

    `s3_get` counts data GETs (and HEADs); a pipelined replica's polls, which depend on timing,
    are `s3_get_poll` and only estimated by the model.
    """

    lambda_requests: int = 0
    s3_put: int = 0
    s3_get: int = 0
    s3_get_poll: int = 0
    s3_list: int = 0
    s3_delete: int = 0
    transitions: int = 0

    def add(self, other: Requests) -> Requests:
        return Requests(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


S3_REQUEST_TYPES = {
    "PutObject": "s3_put",
    "GetObject": "s3_get",
    "HeadObject": "s3_get",
    "ListObjectsV2": "s3_list",
    "DeleteObjects": "s3_delete",
}
"""S3 operations by the `Requests` field they are billed under (a GET that finds nothing, or a
pipelined done marker, is a poll instead: `s3_get_poll`)."""

USAGE_KEYS = (
    *(f.name for f in fields(Requests)),
    "gb_s",
    "experts_gb_s",
    "payload_max_bytes",
)
"""What one execution uses, as the cost model plans it and a metered local run counts it:
the requests, Lambda GB-s (all functions, and the expert functions' share), the largest
direct Invoke event or response."""


def _listing_calls(keys: int) -> int:
    """ListObjectsV2 and DeleteObjects take at most 1,000 keys per call; one call at least."""
    return max(1, -(-keys // 1000))


@dataclass(frozen=True)
class _Layer:
    """The objects and invocations of one layer, from its per-expert counts and replicas."""

    invoked: int  # expert function invocations
    experts_mapped: int  # experts the Map iterates over (each one inner Map)
    inputs: int  # input objects: shards, or minibatches plus done markers
    outputs: int  # output objects: shards, or minibatches

    @classmethod
    def of(cls, method: Method, tokens: np.ndarray, replicas: np.ndarray, beta: int) -> _Layer:
        sizes = [shard_sizes(d, g) for d, g in zip(tokens, replicas, strict=True)]
        busy = sum(int((s > 0).sum()) for s in sizes)
        if method is Method.PIPELINED:
            minibatches = sum(int(np.ceil(s / beta).sum()) for s in sizes)
            replicas_all = int(np.sum(replicas))
            return cls(replicas_all, len(sizes), minibatches + replicas_all, minibatches)
        mapped = sum(1 for s in sizes if (s > 0).any()) if method is Method.S3 else 0
        return cls(busy, mapped, busy if method is Method.S3 else 0, busy)


def request_counts(
    methods: list[Method],
    betas: list[int],
    tokens: np.ndarray,
    replicas: np.ndarray,
    *,
    poll_gets: np.ndarray | None = None,
) -> Requests:
    """Every billed request one execution makes, with `tokens` (L, E) routed on `replicas`.

    `replicas` are the counts the run uses (`runtime_replicas` for adapting methods). Standard
    transitions count every state entered, as the execution history lists them (retries and
    failures add more; a successful run has none). `poll_gets` (L, E), if given, is the model's
    estimate of pipelined polls per expert.
    """
    total = Requests(lambda_requests=2, s3_get=1, s3_put=1, transitions=2)  # head: input, hidden
    keys = 2  # input.bin and head.bin under the request's prefix
    previous = _Layer(0, 0, 0, 0)
    for e, (method, beta) in enumerate(zip(methods, betas, strict=True)):
        layer = _Layer.of(method, tokens[e], replicas[e], beta)
        gate = Requests(
            lambda_requests=1 + layer.invoked, s3_get=1, s3_put=2
        )  # hidden; residual, routing
        if e > 0:  # gather layer e-1: GET routing, LIST its outputs, GET each
            gate.s3_get += 1 + previous.outputs
            gate.s3_list = _listing_calls(previous.outputs)
        if method is Method.S3:
            gate.s3_put += layer.inputs  # scatter
            gate.s3_get += layer.inputs  # each expert reads its shard
            gate.s3_put += layer.outputs  # each expert writes its output
            gate.transitions = 2 + layer.experts_mapped + layer.invoked  # Task, Map, inner Maps
        elif method is Method.PIPELINED:
            gate.s3_put += layer.inputs + layer.outputs
            gate.s3_get += layer.inputs - layer.invoked  # minibatches; done markers are polls
            # Parallel, gate Task, shard-list Pass, Map, inner Maps, Tasks, Choice, output Pass
            gate.transitions = 6 + layer.experts_mapped + layer.invoked
        else:
            gate.s3_put += layer.outputs  # the gate stores what its experts returned
            gate.transitions = 1
        if poll_gets is not None and method is Method.PIPELINED:
            gate.s3_get_poll = int(np.sum(poll_gets[e]))
        total = total.add(gate)
        keys += 2 + layer.inputs + layer.outputs
        previous = layer
    # tail: GET routing, LIST, GET outputs, GET residual; PUT output; LIST and delete the prefix
    tail = Requests(
        s3_get=2 + previous.outputs,
        s3_put=1,
        s3_list=_listing_calls(previous.outputs) + _listing_calls(keys),
        s3_delete=_listing_calls(keys),
    )
    return total.add(tail)
