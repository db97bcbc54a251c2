"""The endpoint function of a stream plan: OpenAI-compatible requests in, the queue's answers out.

Behind its Function URL it checks a request (`functions.openai_api.parse`, with the model's
tokenizer from the export), sends it to the request queue as one message, and reads the answer
the workers write under `results/<message id>/` (`ground.stream`): chunk 0, 1, ... as they
appear, then the final answer, which says how many chunks there were and holds the rest. A
reader polls: a chunk not there yet is a 404 (the endpoint may list `results/`), retried
every `poll_s`. `moelambda serve` runs the same `submit` and `pieces` behind a local HTTP
server that streams each piece as it comes; the Function URL here is BUFFERED, so a streamed
request's events arrive together at the end (Lambda streams responses only from its Node.js
runtime or a custom one; the bodies are the same).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import ClientError

from functions import config, weights
from functions.common import s3_client
from functions.openai_api import (
    ApiError,
    ApiRequest,
    answer_body,
    message_body,
    models_body,
    sse_events,
)
from functions.openai_api import parse as parse_request
from ground import stream
from pipeline.transports import is_missing

__all__ = ["handler", "pieces", "read_json", "submit"]


def submit(sqs: Any, queue: str, request: ApiRequest) -> str:
    """Send the request to the queue; its message id, which names its result."""
    return str(sqs.send_message(QueueUrl=queue, MessageBody=message_body(request))["MessageId"])


def read_json(s3: Any, bucket: str, key: str) -> dict[str, Any] | None:
    """The JSON object at `key`, None while it does not exist."""
    try:
        body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    except ClientError as error:
        if is_missing(s3, bucket, key, error):
            return None
        raise
    document: dict[str, Any] = json.loads(body)
    return document


def pieces(
    s3: Any,
    bucket: str,
    message_id: str,
    *,
    deadline_s: float,
    poll_max_s: float = stream.POLL_MAX_S,
) -> Iterator[tuple[str, dict[str, Any] | None]]:
    """The answer's text as the worker settles it: (text, None) per chunk, then
    (the rest, the final answer).

    A poll GETs the next chunk and, when it is not there, the final answer: two GETs, billed.
    Between polls the reader waits `ground.stream.FIRST_POLL_S`, doubled after every empty
    poll up to `poll_max_s`, and starts again from the first wait after each piece (the delay
    the planner adds, `ground.stream.seen_after`): a piece is seen within about one wait of its
    write, and a long wait costs a few GETs, not one per 20 ms (which,
    on a machine of two cores running the worker beside them, would also slow the worker).

    Raises:
        ApiError: 504 when no final answer came within `deadline_s` (a request in the queue
            past every worker's capacity); 400 when the worker refused the message.
    """
    ends = time.monotonic() + deadline_s
    index = 0
    wait = stream.FIRST_POLL_S
    while True:
        chunk = read_json(s3, bucket, stream.chunk_key(message_id, index))
        if chunk is not None:
            index += 1
            wait = stream.FIRST_POLL_S
            yield chunk["text"], None
            continue
        final = read_json(s3, bucket, stream.final_key(message_id))
        if final is not None:
            if "error" in final:
                raise ApiError(400, final["error"])
            for later in range(index, final["chunks"]):  # written before the final answer
                late = read_json(s3, bucket, stream.chunk_key(message_id, later))
                if late is None:
                    raise ApiError(500, f"chunk {later} of the answer is missing.")
                yield late["text"], None
            yield final["tail"]["text"], final
            return
        if time.monotonic() > ends:
            raise ApiError(504, f"no answer within {deadline_s:g} s: the deployment is busy.")
        time.sleep(wait)
        wait = min(2 * wait, poll_max_s)


def _response(status: int, body: Any, content_type: str = "application/json") -> dict[str, Any]:
    text = body if isinstance(body, str) else json.dumps(body)
    return {"statusCode": status, "headers": {"content-type": content_type}, "body": text}


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """A Function URL request (payload format 2.0) -> its response."""
    cfg = config.current()
    settings = stream.WorkerSettings.from_env(cfg.setting("MOELAMBDA_STREAM"))
    model_id = cfg.setting("MOELAMBDA_MODEL_ID")
    method = event.get("requestContext", {}).get("http", {}).get("method", "POST")
    path = event.get("rawPath", "/")
    created = int(time.time())
    if method == "GET" and path.rstrip("/") == "/v1/models":
        return _response(200, models_body(model_id, created))
    raw = event.get("body") or ""
    data = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()
    s3 = s3_client()
    loader = weights.loader(s3, cfg.bucket, cfg.weights_prefix)
    try:
        if method != "POST":
            raise ApiError(405, f"{method} {path}: POST a request, or GET /v1/models.")
        request = parse_request(
            path,
            data,
            model_id=model_id,
            tokenizer=loader.tokenizer,
            max_prompt_tokens=settings.max_prompt_tokens,
            max_new_tokens=settings.max_new_tokens,
        )
        from functions.batcher import _client

        message_id = submit(_client("sqs"), cfg.setting("MOELAMBDA_QUEUE_URL"), request)
        remaining = context.get_remaining_time_in_millis() / 1000 - 1 if context else 900.0
        got = pieces(s3, cfg.bucket, message_id, deadline_s=remaining)
        if request.stream:
            events = b"".join(sse_events(request, message_id, model_id, got, created))
            return _response(200, events.decode(), "text/event-stream")
        final = [f for _, f in got if f is not None][0]
        return _response(200, answer_body(request, message_id, model_id, final, created))
    except ApiError as error:
        return _response(error.status, error.body())
