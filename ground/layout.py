"""The S3 key scheme of a request's input, intermediates and output.

Every key is derived from the request id, so the gate, the experts and the gatherer agree on
where a shard lives without passing keys around. The workflow, not the caller, owns that id: it
is the SHA-256 of the execution's ARN (`request_id_of`, computed by the state machine with
States.Hash), unique per execution for Standard and Express alike, so two requests never share a
key whatever the caller sends. The caller's only key is its input, `inputs/<execution name>.bin`,
which the head derives from its own execution's name: a request cannot name another's data.
Behind the front door, each client's request gets its own result, `results/<message id>.bin`,
named by the SQS message id its SendMessage returned: assigned by SQS, unique per message.
"""

from __future__ import annotations

import hashlib
import re

from ground.errors import UsageError

__all__ = [
    "INPUTS_PREFIX",
    "OUTPUTS_PREFIX",
    "REQUESTS_PREFIX",
    "RESULTS_PREFIX",
    "done_key",
    "head_key",
    "input_key",
    "request_id_of",
    "validate_execution_name",
    "minibatch_prefix",
    "minibatch_key",
    "out_key",
    "out_minibatch_key",
    "out_prefix",
    "output_key",
    "parse_out_key",
    "request_prefix",
    "residual_key",
    "result_key",
    "routing_key",
    "shard_key",
    "validate_request_id",
]

REQUESTS_PREFIX = "requests/"  # a request's intermediates, deleted by the tail or cleanup
INPUTS_PREFIX = "inputs/"  # callers' uploaded inputs, by execution name
OUTPUTS_PREFIX = "outputs/"  # results, by request id
RESULTS_PREFIX = "results/"  # the front door's results, one per client request, by message id

_REQUEST_ID = re.compile(r"[A-Za-z0-9-]{1,64}")
_EXECUTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")  # what Step Functions accepts, minus unicode
_OUT = re.compile(r"(\d{2})/(\d{2})(?:\.bin|/(\d{4})\.bin)")


def validate_request_id(request_id: object) -> str:
    """The id if it is 1-64 letters, digits or dashes; anything else could escape its prefix."""
    if not isinstance(request_id, str) or not _REQUEST_ID.fullmatch(request_id):
        raise UsageError(
            f"invalid request id {request_id!r}",
            "use 1 to 64 characters from A-Z, a-z, 0-9 and '-'.",
        )
    return request_id


def validate_execution_name(name: object) -> str:
    """The execution name if it is 1-80 letters, digits, '-' or '_' (it names the input key)."""
    if not isinstance(name, str) or not _EXECUTION_NAME.fullmatch(name):
        raise UsageError(
            f"invalid execution name {name!r}",
            "start the execution with a name of 1 to 80 characters from A-Z, a-z, 0-9, '-' "
            "and '_'.",
        )
    return name


def request_id_of(execution_arn: str) -> str:
    """The request id the workflow derives from an execution's ARN (States.Hash, SHA-256)."""
    return hashlib.sha256(execution_arn.encode()).hexdigest()


def request_prefix(request_id: str) -> str:
    return f"{REQUESTS_PREFIX}{validate_request_id(request_id)}/"


def input_key(execution_name: str) -> str:
    """Where a caller uploads a request's token ids before starting the execution so named."""
    return f"{INPUTS_PREFIX}{validate_execution_name(execution_name)}.bin"


def head_key(request_id: str) -> str:
    return request_prefix(request_id) + "head.bin"


def _layer(request_id: str, layer: int) -> str:
    return f"{request_prefix(request_id)}{layer:02d}/"


def residual_key(request_id: str, layer: int) -> str:
    return _layer(request_id, layer) + "residual.bin"


def routing_key(request_id: str, layer: int) -> str:
    return _layer(request_id, layer) + "routing.bin"


def _shard(request_id: str, layer: int, side: str, expert: int, replica: int) -> str:
    return f"{_layer(request_id, layer)}{side}/{expert:02d}/{replica:02d}"


def shard_key(request_id: str, layer: int, expert: int, replica: int) -> str:
    return _shard(request_id, layer, "in", expert, replica) + ".bin"


def minibatch_prefix(request_id: str, layer: int, expert: int, replica: int) -> str:
    """Where a pipelined shard's minibatches and done.bin go."""
    return _shard(request_id, layer, "in", expert, replica) + "/"


def minibatch_key(request_id: str, layer: int, expert: int, replica: int, minibatch: int) -> str:
    return f"{minibatch_prefix(request_id, layer, expert, replica)}{minibatch:04d}.bin"


def done_key(request_id: str, layer: int, expert: int, replica: int) -> str:
    return minibatch_prefix(request_id, layer, expert, replica) + "done.bin"


def out_prefix(request_id: str, layer: int) -> str:
    return _layer(request_id, layer) + "out/"


def out_key(request_id: str, layer: int, expert: int, replica: int) -> str:
    return _shard(request_id, layer, "out", expert, replica) + ".bin"


def out_minibatch_key(
    request_id: str, layer: int, expert: int, replica: int, minibatch: int
) -> str:
    return f"{_shard(request_id, layer, 'out', expert, replica)}/{minibatch:04d}.bin"


def parse_out_key(prefix: str, key: str) -> tuple[int, int, int | None]:
    """(expert, replica, minibatch or None) of an output key listed under `out_prefix`."""
    match = _OUT.fullmatch(key[len(prefix) :]) if key.startswith(prefix) else None
    if match is None:
        raise ValueError(f"'{key}' is not an expert output key under '{prefix}'")
    minibatch = None if match[3] is None else int(match[3])
    return int(match[1]), int(match[2]), minibatch


def output_key(request_id: str) -> str:
    return f"{OUTPUTS_PREFIX}{validate_request_id(request_id)}.bin"


def result_key(message_id: str) -> str:
    """Where the tail writes one front-door request's rows of its batch's output."""
    return f"{RESULTS_PREFIX}{validate_request_id(message_id)}.bin"
