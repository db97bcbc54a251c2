"""What each function may do in the bucket: the S3 side of its IAM policy, from the key scheme.

A function may read, write, list and delete only the keys its role touches in `ground.layout`:
an expert its own layer's and expert's shards and outputs, a gate its own layer's keys and the
previous layer's outputs, the tail its last layer's and the outputs. The request id in every
key is a `*`: it is the hash of the execution's ARN, which no policy can know in advance;
request isolation comes from the workflow owning that id (`ground.layout`), this from the role.

Listing is granted on exactly what a function may read (an `s3:prefix` condition), for two
reasons: S3 answers a missing key with 404 only to a caller that may list it, and the handlers
check a 403 on a key they may read by listing that key (`pipeline.transports.get_object`), so a
missing object reads as missing whichever answer S3 gives. The CDK app turns these patterns into
policies; the local runner enforces the synthesised policies on every request
(`pipeline.iam`), so what is declared here is what a run proves.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ground.layout import INPUTS_PREFIX, OUTPUTS_PREFIX, REQUESTS_PREFIX, RESULTS_PREFIX
from ground.stream import FINAL

__all__ = [
    "BATCH_INPUT_PREFIX",
    "Access",
    "batcher",
    "cleanup",
    "driver",
    "driver_expert",
    "endpoint",
    "expert",
    "gate",
    "head",
    "tail",
    "worker",
]

_ANY_REQUEST = f"{REQUESTS_PREFIX}*/"  # a request's prefix, whatever its id
BATCH_INPUT_PREFIX = "fd-"  # the front door's execution names (`functions.batcher`)


@dataclass(frozen=True)
class Access:
    """Key patterns (IAM wildcards, relative to the bucket) a function may use, by action.

    `read` also decides listing (`listed`): a function may learn whether a key it may read
    exists, and nothing more.
    """

    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    delete: tuple[str, ...] = ()
    extra_list: tuple[str, ...] = field(default=())

    @property
    def listed(self) -> tuple[str, ...]:
        """`s3:prefix` patterns of ListBucket: what it reads, and what it must find to delete."""
        return tuple(dict.fromkeys((*self.read, *self.extra_list)))

    def with_weights(self, weights_prefix: str, keys: list[str], config: bool = True) -> Access:
        """This access plus reading the export's manifest, its config files (unless `config` is
        False: an expert builds its stage from the manifest alone) and `keys`."""
        own = (f"{weights_prefix}manifest.json",)
        own += (f"{weights_prefix}config/*",) if config else ()
        own += tuple(f"{weights_prefix}{key}" for key in keys)
        return Access(own + self.read, self.write, self.delete, self.extra_list)


def _layer(layer: int) -> str:
    return f"{_ANY_REQUEST}{layer:02d}/"


def _gathered(layer: int) -> tuple[str, ...]:
    """What gathering layer `layer`'s expert sum reads: its routing and every expert output."""
    return (f"{_layer(layer)}routing.bin", f"{_layer(layer)}out/*")


def head() -> Access:
    """Reads the callers' uploads, writes the first hidden state."""
    return Access(read=(f"{INPUTS_PREFIX}*",), write=(f"{_ANY_REQUEST}head.bin",))


def gate(layer: int, method: str) -> Access:
    """Reads the previous layer's residual and outputs (the head's state for layer 0), writes
    its residual, routing and shards; a direct gate writes its experts' outputs itself."""
    if layer == 0:
        read: tuple[str, ...] = (f"{_ANY_REQUEST}head.bin",)
    else:
        read = (f"{_layer(layer - 1)}residual.bin", *_gathered(layer - 1))
    own = _layer(layer)
    shards = f"{own}out/*" if method == "direct" else f"{own}in/*"
    return Access(read=read, write=(f"{own}residual.bin", f"{own}routing.bin", shards))


def expert(layer: int, number: int, method: str) -> Access:
    """Its own shards in, its own outputs out; a direct expert touches no key at all."""
    if method == "direct":
        return Access()
    own = _layer(layer)
    return Access(read=(f"{own}in/{number:02d}/*",), write=(f"{own}out/{number:02d}/*",))


def tail(last: int, front_door: bool = False) -> Access:
    """Reads the last layer, writes the output (and reads it: a second delivery returns the
    output it finds), deletes the request's intermediates; behind the front door it also
    writes each client request's result."""
    read = (f"{_layer(last)}residual.bin", *_gathered(last), f"{OUTPUTS_PREFIX}*")
    everything = f"{REQUESTS_PREFIX}*"
    write = (f"{OUTPUTS_PREFIX}*", *((f"{RESULTS_PREFIX}*",) if front_door else ()))
    return Access(read=read, write=write, delete=(everything,), extra_list=(everything,))


def driver(remote_layers: list[int], front_door: bool = False) -> Access:
    """A driver (`ground.driver`) reads the callers' uploads and writes the output; for a layer
    with remote experts it writes the shards past the payload limit and reads their outputs,
    and it deletes those before it returns; behind the front door it writes each client
    request's result. A monolithic function touches no request key at all."""
    read = [f"{INPUTS_PREFIX}*", *(f"{_layer(layer)}out/*" for layer in remote_layers)]
    write = [
        f"{OUTPUTS_PREFIX}*",
        *((f"{RESULTS_PREFIX}*",) if front_door else ()),
        *(f"{_layer(layer)}in/*" for layer in remote_layers),
    ]
    overflow = (f"{REQUESTS_PREFIX}*",) if remote_layers else ()
    return Access(read=tuple(read), write=tuple(write), delete=overflow, extra_list=overflow)


def driver_expert(layer: int, number: int) -> Access:
    """An expert a driver invokes: nothing inline; past the payload limit its own shards in
    and its own outputs out, as an s3 expert's."""
    return expert(layer, number, "s3")


def cleanup() -> Access:
    """Finds and deletes a failed request's intermediates."""
    everything = f"{REQUESTS_PREFIX}*"
    return Access(delete=(everything,), extra_list=(everything,))


def batcher() -> Access:
    """The front door's batcher writes its executions' inputs, named `fd-<hash>`, and reads
    nothing: not a caller's own upload (another name), not a request's keys, not the weights."""
    return Access(write=(f"{INPUTS_PREFIX}{BATCH_INPUT_PREFIX}*",))


def worker(remote_layers: list[int]) -> Access:
    """A stream's generation worker (`ground.stream`), the plan's driver serving a queue: it
    looks for a request's final answer before admitting it (a HEAD of `results/*/final.json`,
    nothing else of the results: not another request's chunks), writes each request's chunks
    and final answer under `results/`, and, like the driver, writes a remote layer's shards
    past the payload limit, reads their outputs and deletes them. It reads no caller upload
    (`inputs/`) and writes no `outputs/`: its requests come in the queue's messages."""
    read = [f"{RESULTS_PREFIX}*/{FINAL}", *(f"{_layer(layer)}out/*" for layer in remote_layers)]
    write = [f"{RESULTS_PREFIX}*", *(f"{_layer(layer)}in/*" for layer in remote_layers)]
    overflow = (f"{REQUESTS_PREFIX}*",) if remote_layers else ()
    return Access(read=tuple(read), write=tuple(write), delete=overflow, extra_list=overflow)


def endpoint(weights_prefix: str) -> Access:
    """A stream's endpoint (its Function URL): it reads the results as they grow and the
    tokenizer, which the export keeps with the model's config under `config/` (through the
    export's loader, which reads `manifest.json` first: `functions.weights.loader`): no stage's
    weights, no request's keys, and it writes and deletes nothing (it sends the queue its
    requests, which its SQS statement allows)."""
    return Access(
        read=(f"{RESULTS_PREFIX}*", f"{weights_prefix}manifest.json", f"{weights_prefix}config/*")
    )
