"""Scatter-gather between a layer's gate and its experts: direct, s3 and pipelined s3.

The gate splits the tokens routed to each expert function (the rows of every expert it hosts,
expert by expert) among that function's replicas (the contract's deterministic split) and ships
the rows with how many belong to each hosted expert; the experts compute and write their outputs
back; the next stage gathers them. Only the gate knows the plan's replica counts, so the
gatherer finds the outputs by listing the layer's `out/` prefix and checks every function's rows
against the routing the gate stored (with each expert's slot): a missing or extra output is an
error, never a silently wrong sum.

Nothing here decides sizes or talks to Lambda: the method, β, replicas and the function that
invokes an expert are all given by the caller.
"""

from __future__ import annotations

import base64
import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from botocore.exceptions import ClientError

from ground import layout
from ground.driver import overflows
from ground.errors import MoelambdaError
from moe import gather_shards, routing_shards
from pipeline.tensorio import decode, encode

__all__ = [
    "ShardRows",
    "TransportError",
    "call_direct",
    "call_remote",
    "delete_request",
    "direct_decode",
    "direct_encode",
    "direct_event",
    "gather",
    "get_object",
    "is_missing",
    "list_keys",
    "put_object",
    "read_tensors",
    "scatter_pipelined",
    "scatter_s3",
    "serve_pipelined",
    "slot_label",
    "split_shards",
    "write_tensors",
]

_WORKERS = 16  # concurrent S3 uploads and downloads of one function
_MISSING = ("404", "NoSuchKey", "NotFound")
_DENIED = ("403", "AccessDenied", "Forbidden")
Invoke = Callable[[str, dict[str, Any]], dict[str, Any]]


class TransportError(MoelambdaError):
    """A shard cannot be shipped (oversized inline payload) or its outputs are inconsistent."""


@dataclass(frozen=True)
class ShardRows:
    """Replica `replica` of the function in slot `expert`: positions of its rows in the layer's
    (N, h) input, and how many of them belong to each expert the function hosts."""

    expert: int
    replica: int
    tokens: np.ndarray  # int64 (n,): each hosted expert's rows in ascending token order
    hosted_rows: np.ndarray  # int64 (hosted,): rows per hosted expert, summing to n

    def rows_per_expert(self, start: int, stop: int) -> np.ndarray:
        """`hosted_rows` of the shard's rows start..stop (a pipelined minibatch)."""
        bounds = np.r_[0, np.cumsum(self.hosted_rows)]
        return np.diff(np.clip(bounds, start, stop)).astype(np.int64)

    def describe(self, request_id: str, layer: int, function: str) -> dict[str, Any]:
        """The shard dict of the contract, less the input key (a direct shard has none)."""
        return {
            "request_id": request_id,
            "layer": layer,
            "expert": self.expert,
            "replica": self.replica,
            "tokens": int(self.tokens.size),
            "function": function,
        }


def slot_label(slot: int, hosted: list[int] | tuple[int, ...]) -> str:
    """How errors name a layer's expert function: "expert 3", or "function 1 (experts 2, 7)"."""
    if list(hosted) == [slot]:
        return f"expert {slot}"
    return f"function {slot} (experts {', '.join(map(str, hosted))})"


def split_shards(
    experts: torch.Tensor, replicas: list[int], hosted: list[list[int]] | None = None
) -> list[ShardRows]:
    """Every (function, replica) pair, empty ones included, in (slot, replica) order, with rows.

    `hosted` lists each slot's experts (None: slot i hosts expert i). Rows of expert e are its
    (token, top-k slot) pairs in ascending token order; a function's rows are its experts' in
    turn, and replica r takes the r-th of R near-equal contiguous chunks: the split the
    gatherer undoes by concatenating.
    """
    hosted = [[i] for i in range(len(replicas))] if hosted is None else hosted
    unused_weights = torch.zeros(experts.shape)  # routing_shards splits weights too; not needed
    count = sum(len(h) for h in hosted)
    per_expert = [
        tokens.numpy().astype(np.int64)
        for tokens, _ in routing_shards(experts, unused_weights, count)
    ]
    shards = []
    for slot, members in enumerate(hosted):
        whole = ShardRows(
            slot,
            0,
            np.concatenate([per_expert[m] for m in members]),
            np.array([per_expert[m].size for m in members], dtype=np.int64),
        )
        start = 0
        for r, chunk in enumerate(np.array_split(whole.tokens, replicas[slot])):
            stop = start + chunk.size
            shards.append(ShardRows(slot, r, chunk, whole.rows_per_expert(start, stop)))
            start = stop
    return shards


def is_missing(s3: Any, bucket: str, key: str, error: ClientError) -> bool:
    """Whether `error`, raised reading `key`, means that the key does not exist.

    S3 answers a missing key with 404 only to a caller that may list it, else with 403, and
    whether a ListBucket conditioned on `s3:prefix` counts is not documented. A 403 is settled
    by listing the key itself, which a function may do for every key it may read
    (`ground.access`): absent means missing, present means really denied (raised by the caller).
    """
    code = error.response.get("Error", {}).get("Code")
    if code in _MISSING:
        return True
    if code not in _DENIED:
        return False
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1)
    return not any(obj["Key"] == key for obj in listed.get("Contents", []))


def get_object(s3: Any, bucket: str, key: str) -> bytes | None:
    """The object's bytes, or None if there is no such key (the pipelined poll needs to know)."""
    try:
        return s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if is_missing(s3, bucket, key, error):
            return None
        raise


def read_tensors(s3: Any, bucket: str, key: str) -> list[np.ndarray]:
    """The tensors of an object that must exist: an earlier stage wrote it."""
    data = get_object(s3, bucket, key)
    if data is None:
        raise TransportError(
            f"s3://{bucket}/{key} is missing",
            "the stage that writes it failed or the request was cleaned up; rerun the request.",
        )
    return decode(data)


def put_object(s3: Any, bucket: str, key: str, data: bytes) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=data)


def write_tensors(s3: Any, bucket: str, key: str, *arrays: np.ndarray) -> None:
    put_object(s3, bucket, key, encode(*arrays))


def _rows(ffn_in: np.ndarray, shard: ShardRows) -> np.ndarray:
    return np.ascontiguousarray(ffn_in[shard.tokens], dtype=np.float32)


def scatter_s3(
    s3: Any, bucket: str, request_id: str, layer: int, ffn_in: np.ndarray, shards: list[ShardRows]
) -> None:
    """One object per non-empty shard, at `layout.shard_key`."""

    def upload(s: ShardRows) -> None:
        key = layout.shard_key(request_id, layer, s.expert, s.replica)
        put_object(s3, bucket, key, encode(_rows(ffn_in, s), s.hosted_rows))

    with ThreadPoolExecutor(_WORKERS) as pool:
        list(pool.map(upload, [s for s in shards if s.tokens.size]))


def scatter_pipelined(
    s3: Any,
    bucket: str,
    request_id: str,
    layer: int,
    ffn_in: np.ndarray,
    shards: list[ShardRows],
    beta: int,
) -> None:
    """Upload minibatch 0 of every shard, then minibatch 1, ...; done.bin once a shard is complete.

    Wave order lets every expert start on its first β rows as early as possible; done.bin is
    written only after the shard's last minibatch has landed, so an expert that sees it knows
    every minibatch it announces is readable.
    """
    counts = {(s.expert, s.replica): -(-s.tokens.size // beta) for s in shards}

    def done(s: ShardRows) -> None:
        marker = np.array([counts[s.expert, s.replica], s.tokens.size], dtype=np.int64)
        put_object(
            s3, bucket, layout.done_key(request_id, layer, s.expert, s.replica), encode(marker)
        )

    def upload(item: tuple[ShardRows, int]) -> None:
        s, m = item
        start, stop = m * beta, (m + 1) * beta
        rows = _rows(ffn_in, s)[start:stop]
        key = layout.minibatch_key(request_id, layer, s.expert, s.replica, m)
        put_object(s3, bucket, key, encode(rows, s.rows_per_expert(start, stop)))

    with ThreadPoolExecutor(_WORKERS) as pool:
        list(pool.map(done, [s for s in shards if not s.tokens.size]))
        for m in range(max(counts.values(), default=0)):
            list(pool.map(upload, [(s, m) for s in shards if counts[s.expert, s.replica] > m]))
            list(pool.map(done, [s for s in shards if counts[s.expert, s.replica] == m + 1]))


ABORTED = -1  # done.bin's minibatch count when the gate failed: the expert stops at once


def abort_pipelined(
    s3: Any, bucket: str, request_id: str, layer: int, replicas: list[int]
) -> None:
    """Tell every (expert, replica) of a pipelined layer that its gate failed.

    The experts started with the gate and poll done.bin whenever a minibatch is missing; without
    this they would wait out their timeout, billed, before failing.
    """
    marker = encode(np.array([ABORTED, 0], dtype=np.int64))
    keys = [
        layout.done_key(request_id, layer, e, r)
        for e, count in enumerate(replicas)
        for r in range(count)
    ]
    with ThreadPoolExecutor(_WORKERS) as pool:
        list(pool.map(lambda key: put_object(s3, bucket, key, marker), keys))


def direct_encode(*arrays: np.ndarray) -> str:
    return base64.b64encode(encode(*arrays)).decode("ascii")


def direct_decode(payload: str) -> list[np.ndarray]:
    return decode(base64.b64decode(payload))


def direct_event(
    request_id: str,
    layer: int,
    expert: int,
    replica: int,
    rows: np.ndarray,
    *,
    limit: int,
    function: str | None = None,
    hosted_rows: np.ndarray | None = None,
) -> dict[str, Any]:
    """A direct Invoke's event (with `function` and `hosted_rows`) or an expert's response.

    The contract's fields, in the order `ground.semantics.DIRECT_EVENT_BYTES` bounds, then the
    rows (and in an event the rows per hosted expert) base64-encoded as "payload". Lambda
    limits the JSON, not the tensor, so the encoded JSON is measured here: an oversized message
    fails with its size before it is sent.
    """
    event: dict[str, Any] = {
        "request_id": request_id,
        "layer": layer,
        "expert": expert,
        "replica": replica,
        "tokens": int(rows.shape[0]),
    }
    if function is not None:
        event["function"] = function
    event["payload"] = direct_encode(rows, *(() if hosted_rows is None else (hosted_rows,)))
    size = len(json.dumps(event))
    if size > limit:
        what = "event" if function is not None else "response"
        raise TransportError(
            f"layer {layer} expert {expert} replica {replica}: the direct {what} of "
            f"{rows.shape[0]:,} tokens is {size:,} bytes of JSON, above the plan's direct "
            f"payload limit of {limit:,} bytes",
            "make the plan again (its max_tokens_per_replica must fit the payload), or plan "
            "this layer with method 's3' or 'pipelined'.",
        )
    return event


def call_direct(
    s3: Any,
    bucket: str,
    request_id: str,
    layer: int,
    ffn_in: np.ndarray,
    shards: list[ShardRows],
    functions: list[str],
    invoke: Invoke,
    limit: int,
) -> None:
    """Invoke each non-empty shard's expert with its rows inline and store what comes back.

    Every event is built and checked against `limit` before anything is invoked, so an
    oversized shard fails the request without paying for the other experts. All shards are
    invoked at once, one thread each: the gate is billed until the slowest returns.
    """
    calls = [
        (
            s,
            direct_event(
                request_id,
                layer,
                s.expert,
                s.replica,
                _rows(ffn_in, s),
                limit=limit,
                function=functions[s.expert],
                hosted_rows=s.hosted_rows,
            ),
        )
        for s in shards
        if s.tokens.size
    ]

    def call(item: tuple[ShardRows, dict[str, Any]]) -> None:
        s, event = item
        rows = direct_decode(invoke(functions[s.expert], event)["payload"])[0]
        if rows.shape[0] != s.tokens.size:
            raise TransportError(
                f"layer {layer} expert {s.expert} replica {s.replica} returned {rows.shape[0]} "
                f"rows for {s.tokens.size} tokens"
            )
        key = layout.out_key(request_id, layer, s.expert, s.replica)
        put_object(s3, bucket, key, encode(rows))

    if calls:
        with ThreadPoolExecutor(len(calls)) as pool:
            list(pool.map(call, calls))


def call_remote(
    s3: Any,
    bucket: str,
    request_id: str,
    layer: int,
    ffn_in: np.ndarray,
    shards: list[ShardRows],
    functions: list[str],
    invoke: Invoke,
    limit: int,
) -> tuple[dict[tuple[int, int], np.ndarray], int]:
    """A driver's call of its remote experts (`ground.driver`): every non-empty shard one
    synchronous Invoke, all at once; ({(slot, replica): output rows}, shards through S3).

    A shard whose inline event fits `limit` carries its rows base64 in the event and gets
    them back in the response; a larger one goes through S3 under the request's prefix as the
    s3 method's does (the driver PUTs it, the expert reads it and PUTs its output, the driver
    reads that), its event naming only the shard.
    """

    row_bytes = int(ffn_in.shape[1]) * 4  # float32 rows, as the planner counts them

    def call(s: ShardRows) -> tuple[tuple[int, int], np.ndarray, bool]:
        rows = _rows(ffn_in, s)
        through_s3 = bool(overflows(rows.shape[0], row_bytes, limit))
        if not through_s3:
            event = direct_event(
                request_id,
                layer,
                s.expert,
                s.replica,
                rows,
                limit=limit,
                function=functions[s.expert],
                hosted_rows=s.hosted_rows,
            )
            y = direct_decode(invoke(functions[s.expert], event)["payload"])[0]
        else:
            key = layout.shard_key(request_id, layer, s.expert, s.replica)
            put_object(s3, bucket, key, encode(rows, s.hosted_rows))
            event = s.describe(request_id, layer, functions[s.expert])
            answer = invoke(functions[s.expert], event)
            expected = layout.out_key(request_id, layer, s.expert, s.replica)
            if answer.get("output_key") != expected:
                raise TransportError(
                    f"layer {layer} expert {s.expert} replica {s.replica} answered "
                    f"{answer.get('output_key')!r}, not its output {expected}"
                )
            y = read_tensors(s3, bucket, expected)[0]
        if y.shape[0] != s.tokens.size:
            raise TransportError(
                f"layer {layer} expert {s.expert} replica {s.replica} returned {y.shape[0]} "
                f"rows for {s.tokens.size} tokens"
            )
        return (s.expert, s.replica), y, through_s3

    busy = [s for s in shards if s.tokens.size]
    if not busy:
        return {}, 0
    with ThreadPoolExecutor(len(busy)) as pool:
        results = list(pool.map(call, busy))
    return {key: y for key, y, _ in results}, sum(over for _, _, over in results)


def _minibatches(
    s3: Any,
    bucket: str,
    request_id: str,
    layer: int,
    expert: int,
    replica: int,
    poll_s: float,
    timeout_s: float,
) -> Iterator[list[np.ndarray]]:
    """Yield minibatches 0, 1, ... as the gate uploads them, until done.bin says that was all.

    Every poll costs GET requests, and an expert started alongside its gate waits the whole gate
    compute for minibatch 0: the wait doubles from `poll_s` up to 4 x `poll_s` while nothing
    arrives, and drops back to `poll_s` once minibatches flow. Each minibatch is read by exactly
    one successful GET; every other GET (a miss, or a read of done.bin) is a poll, which is how
    `ground.semantics.request_counts` and the meter tell data GETs from polls.
    """
    done_key = layout.done_key(request_id, layer, expert, replica)
    m = misses = 0
    deadline = time.monotonic() + timeout_s
    while True:
        key = layout.minibatch_key(request_id, layer, expert, replica, m)
        data = get_object(s3, bucket, key)
        if data is None:
            marker = get_object(s3, bucket, done_key)
            if marker is None:
                if time.monotonic() > deadline:
                    raise TransportError(
                        f"no minibatch at {key} and no {done_key} after {timeout_s:g} s",
                        "check that the layer function of this request ran; raise "
                        "MOELAMBDA_PIPELINE_TIMEOUT_S if it is slow.",
                    )
                time.sleep(poll_s * 2 ** min(misses, 2))
                misses += 1
                continue
            count = int(decode(marker)[0][0])
            if count == ABORTED:
                raise TransportError(
                    f"the layer {layer} function of request {request_id} failed; "
                    "this expert stops",
                    "see the layer function's error, the cause of the failed execution.",
                )
            if m >= count:
                return
            # done.bin is written after every minibatch: this one landed since the miss. What
            # the re-check reads is the minibatch, so no minibatch is ever read twice.
            data = get_object(s3, bucket, key)
            if data is None:
                raise TransportError(
                    f"done.bin announces {count} minibatches but {key} is missing",
                    "the layer function or a cleanup removed it; rerun the request.",
                )
        yield decode(data)
        m += 1
        misses = 0
        deadline = time.monotonic() + timeout_s


def serve_pipelined(
    s3: Any,
    bucket: str,
    request_id: str,
    layer: int,
    expert: int,
    replica: int,
    compute: Callable[[np.ndarray, np.ndarray], np.ndarray],
    *,
    poll_s: float,
    timeout_s: float,
) -> tuple[int, int]:
    """Compute each minibatch (rows, rows per hosted expert) as it appears; returns
    (minibatches, tokens).

    The upload of minibatch m runs on a background thread while m+1 is downloaded and computed.
    """
    minibatches = tokens = 0
    with ThreadPoolExecutor(1) as uploads:
        pending = []
        for x, hosted_rows in _minibatches(
            s3, bucket, request_id, layer, expert, replica, poll_s, timeout_s
        ):
            key = layout.out_minibatch_key(request_id, layer, expert, replica, minibatches)
            y = compute(x, hosted_rows)
            pending.append(uploads.submit(put_object, s3, bucket, key, encode(y)))
            minibatches += 1
            tokens += x.shape[0]
        for future in pending:
            future.result()
    return minibatches, tokens


def list_keys(s3: Any, bucket: str, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [obj["Key"] for page in pages for obj in page.get("Contents", [])]


def gather(
    s3: Any, bucket: str, request_id: str, layer: int, method: str, num_experts: int, hidden: int
) -> torch.Tensor:
    """The weighted sum of layer `layer`'s expert outputs at each token: (N, hidden).

    The gate stored the routing with each expert's function slot. A slot's outputs,
    concatenated in (replica, minibatch) order, restore the gate's row order: each hosted
    expert's rows in turn, experts ascending. They are cut per expert and handed to
    `gather_shards` with the stored routing.
    """
    experts, weights, slot_of = read_tensors(s3, bucket, layout.routing_key(request_id, layer))
    slots = int(slot_of.max(initial=-1)) + 1
    prefix = layout.out_prefix(request_id, layer)
    found: dict[int, list[tuple[tuple[int, int], str]]] = defaultdict(list)
    for key in list_keys(s3, bucket, prefix):
        slot, replica, minibatch = layout.parse_out_key(prefix, key)
        if (minibatch is not None) != (method == "pipelined") or slot >= slots:
            raise TransportError(f"unexpected output {key} for method '{method}' of layer {layer}")
        found[slot].append(((replica, minibatch or 0), key))
    keys = [key for pieces in found.values() for _, key in pieces]
    with ThreadPoolExecutor(_WORKERS) as pool:
        arrays = dict(
            zip(keys, pool.map(lambda k: read_tensors(s3, bucket, k)[0], keys), strict=True)
        )
    routed = routing_shards(torch.from_numpy(experts), torch.from_numpy(weights), num_experts)
    parts = []
    for slot in range(slots):
        members = np.flatnonzero(slot_of == slot)
        pieces = [arrays[key] for _, key in sorted(found[slot])]
        y = np.concatenate(pieces) if pieces else np.zeros((0, hidden), np.float32)
        sizes = [routed[m][0].numel() for m in members]
        if y.shape[0] != sum(sizes):
            raise TransportError(
                f"layer {layer} {slot_label(slot, members.tolist())}: its outputs hold "
                f"{y.shape[0]} rows but the gate routed {sum(sizes)} tokens to it",
                "an expert invocation failed or is still running; rerun the request.",
            )
        for m, part in zip(members, np.split(y, np.cumsum(sizes)[:-1]), strict=True):
            parts.append((*routed[m], torch.from_numpy(part)))
    return gather_shards(experts.shape[0], hidden, parts)


def delete_request(s3: Any, bucket: str, request_id: str) -> int:
    """Delete every intermediate of a request, 1000 keys per call (the S3 maximum); the count."""
    keys = list_keys(s3, bucket, layout.request_prefix(request_id))
    for start in range(0, len(keys), 1000):
        batch = [{"Key": key} for key in keys[start : start + 1000]]
        response = s3.delete_objects(Bucket=bucket, Delete={"Objects": batch, "Quiet": True})
        if response.get("Errors"):
            first = response["Errors"][0]
            raise TransportError(
                f"could not delete {len(response['Errors'])} objects of request {request_id}, "
                f"e.g. {first.get('Key')}: {first.get('Message')}"
            )
    return len(keys)
