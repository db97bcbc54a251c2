"""The OpenAI-compatible wire format of a stream plan's endpoint: requests in, answers out.

One home for what `/v1/completions`, `/v1/chat/completions` and `/v1/models` accept and return,
used by the deployed endpoint function (`functions.endpoint`) and by `moelambda serve`'s local
HTTP server alike, so the `openai` client and `curl` work against either unchanged.

Accepted: `model` (the plan's), `prompt` (a string, or one list of token ids) or `messages`
(chat, where the tokenizer has a chat template), `max_tokens` (`max_completion_tokens` for chat),
`temperature` (OpenAI's default 1), `top_p`, `seed`, `stop` (a string or up to 4), `n` = 1,
`stream`, `stream_options`, `user`. What the server cannot honour (`n` > 1, `logprobs`, `echo`,
`best_of`, penalties other than 0, tools) is refused with a 400 naming the parameter, never
silently ignored. Errors have OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "ApiError",
    "ApiRequest",
    "answer_body",
    "finish_reason",
    "message_body",
    "models_body",
    "parse",
    "sse_events",
]

Kind = Literal["completion", "chat"]
PATHS: dict[str, Kind] = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
_IGNORED = {"user", "stream_options", "model", "stream"}
_REFUSED = {
    "logprobs": "token log-probabilities are not returned",
    "top_logprobs": "token log-probabilities are not returned",
    "echo": "the prompt is not echoed",
    "best_of": "one completion is sampled per request",
    "suffix": "insertion is not supported",
    "tools": "tool calls are not supported",
    "tool_choice": "tool calls are not supported",
    "functions": "function calls are not supported",
    "response_format": "structured output is not supported",
    "logit_bias": "logit biases are not applied",
}
_ZERO_ONLY = ("presence_penalty", "frequency_penalty")


class ApiError(Exception):
    """A request the endpoint refuses: its HTTP status and OpenAI's error body."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {
                "message": self.message,
                "type": kind,
                "param": self.param,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class ApiRequest:
    """A checked request: what the worker gets (`message_body`) and how to answer it."""

    kind: Kind
    prompt: list[int]
    settings: dict[str, Any]  # moe.GenerationConfig's fields
    stream: bool
    include_usage: bool


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ApiError(400, f"'{name}' must be a number from {low:g} to {high:g}.", name)
    return float(value)


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "'stop' must be a non-empty string or a list of them.", "stop")
    if len(stops) > 4:
        raise ApiError(400, "'stop' takes at most 4 strings.", "stop")
    return tuple(stops)


def _prompt(kind: Kind, body: dict[str, Any], tokenizer: Any) -> list[int]:
    """The request's prompt as token ids (chat: through the tokenizer's chat template)."""
    if kind == "chat":
        messages = body.get("messages")
        ok = isinstance(messages, list) and messages
        if not ok or not all(
            isinstance(m, dict)
            and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ApiError(
                400,
                "'messages' must be a non-empty list of {'role': ..., 'content': '...'}.",
                "messages",
            )
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(
                400,
                "this model's tokenizer has no chat template: use /v1/completions with a "
                "'prompt' instead.",
                "messages",
                "chat_template_missing",
            )
        # The template's text, then its ids: what tokenize=True returns differs by version.
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return [int(t) for t in tokenizer(text, add_special_tokens=False)["input_ids"]]
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str) and prompt:
        return [int(t) for t in tokenizer(prompt)["input_ids"]]
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        vocab = len(tokenizer)
        if not all(0 <= t < vocab for t in prompt):
            raise ApiError(400, f"'prompt' token ids must be below {vocab:,}.", "prompt")
        return list(prompt)
    raise ApiError(
        400,
        "'prompt' must be a non-empty string or a list of token ids (one prompt: n = 1).",
        "prompt",
    )


def parse(
    path: str,
    raw: bytes,
    *,
    model_id: str,
    tokenizer: Any,
    max_prompt_tokens: int,
    max_new_tokens: int,
) -> ApiRequest:
    """Check one POST to `path`, whose body is `raw`, and turn it into the worker's request.

    Raises:
        ApiError: 404 for another path or model; 400 for a body that is not a request, a
            parameter out of range or not supported, or a prompt or `max_tokens` past the
            plan's longest (the message names the limit and the fix).
    """
    kind = PATHS.get(path.rstrip("/"))
    if kind is None:
        raise ApiError(
            404,
            f"no such endpoint {path!r}: POST /v1/completions or /v1/chat/completions.",
            code="not_found",
        )
    try:
        body = json.loads(raw or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the body is not JSON: {err}.") from err
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object.")
    if body.get("model") not in (None, model_id):
        raise ApiError(
            404,
            f"model {body.get('model')!r} is not served here: this endpoint serves "
            f"{model_id!r} (GET /v1/models).",
            "model",
            "model_not_found",
        )
    for name, why in _REFUSED.items():
        if body.get(name) not in (None, False, [], 0) and not (
            name == "best_of" and body[name] == 1
        ):
            raise ApiError(400, f"'{name}' is not supported: {why}.", name)
    for name in _ZERO_ONLY:
        if body.get(name) not in (None, 0, 0.0):
            raise ApiError(400, f"'{name}' is not supported: leave it at 0.", name)
    if body.get("n", 1) != 1:
        raise ApiError(400, "'n' must be 1: one completion per request.", "n")
    limit_name = (
        "max_completion_tokens"
        if kind == "chat" and "max_completion_tokens" in body
        else "max_tokens"
    )
    # OpenAI's defaults: 16 tokens for a completion, as many as the model may for a chat
    default = DEFAULT_MAX_TOKENS if kind == "completion" else max_new_tokens
    max_tokens = body.get(limit_name, default)
    if max_tokens is None:
        max_tokens = default
    if type(max_tokens) is not int or max_tokens < 1:
        raise ApiError(400, f"'{limit_name}' must be a positive integer.", limit_name)
    if max_tokens > max_new_tokens:
        raise ApiError(
            400,
            f"'{limit_name}' {max_tokens:,} is over this deployment's longest generation, "
            f"{max_new_tokens:,} tokens: ask for at most {max_new_tokens:,}.",
            limit_name,
            "max_tokens_too_large",
        )
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0.0:
        raise ApiError(400, "'top_p' must be above 0.", "top_p")
    seed = body.get("seed", 0)
    if seed is None:
        seed = 0
    if type(seed) is not int:
        raise ApiError(400, "'seed' must be an integer.", "seed")
    prompt = _prompt(kind, body, tokenizer)
    if len(prompt) > max_prompt_tokens:
        raise ApiError(
            400,
            f"the prompt has {len(prompt):,} tokens, over this deployment's longest, "
            f"{max_prompt_tokens:,}: shorten it.",
            "messages" if kind == "chat" else "prompt",
            "context_length_exceeded",
        )
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError(400, "'stream' must be true or false.", "stream")
    options = body.get("stream_options") or {}
    return ApiRequest(
        kind=kind,
        prompt=prompt,
        settings={
            "max_new_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p if temperature > 0 else 1.0,
            "seed": seed,
            "stop": list(_stop(body.get("stop"))),
        },
        stream=stream,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
    )


def message_body(request: ApiRequest) -> str:
    """The SQS message the worker reads (`functions.worker`)."""
    return json.dumps(
        {"prompt": request.prompt, "settings": request.settings}, separators=(",", ":")
    )


def finish_reason(reason: str | None) -> str | None:
    """OpenAI's finish reason for the worker's: an end-of-sequence token stops too."""
    return None if reason is None else ("length" if reason == "length" else "stop")


def _ids(kind: Kind, message_id: str) -> tuple[str, str]:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + message_id, (
        "chat.completion" if kind == "chat" else "text_completion"
    )


def answer_body(
    request: ApiRequest, message_id: str, model_id: str, final: dict[str, Any], created: int
) -> dict[str, Any]:
    """The whole answer (`stream: false`) from the worker's final answer."""
    answer_id, obj = _ids(request.kind, message_id)
    usage = final["usage"]
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason(final["finish_reason"])}
    if request.kind == "chat":
        choice["message"] = {"role": "assistant", "content": final["text"]}
    else:
        choice |= {"text": final["text"], "logprobs": None}
    return {
        "id": answer_id,
        "object": obj,
        "created": created,
        "model": model_id,
        "choices": [choice],
        "usage": usage | {"total_tokens": usage["prompt_tokens"] + usage["completion_tokens"]},
    }


def sse_events(
    request: ApiRequest,
    message_id: str,
    model_id: str,
    pieces: Iterator[tuple[str, dict[str, Any] | None]],
    created: int | None = None,
) -> Iterator[bytes]:
    """Server-sent events of a streamed answer: one per text piece, then the finish reason,
    the usage if asked, and `[DONE]`. `pieces` yields (text, None) as text settles and
    ("", final answer) last (`functions.endpoint.pieces`)."""
    created = int(time.time()) if created is None else created
    answer_id, obj = _ids(request.kind, message_id)
    obj = obj + ".chunk" if request.kind == "chat" else obj

    def event(choice: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
        doc: dict[str, Any] = {
            "id": answer_id,
            "object": obj,
            "created": created,
            "model": model_id,
            "choices": [choice] if choice else [],
        }
        if usage is not None:
            doc["usage"] = usage
        return f"data: {json.dumps(doc, separators=(',', ':'))}\n\n".encode()

    def piece(text: str, reason: str | None) -> dict[str, Any]:
        if request.kind == "chat":
            delta = {"content": text} if text or reason is None else {}
            return {"index": 0, "delta": delta, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    if request.kind == "chat":
        yield event(
            {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        )
    for text, final in pieces:
        if final is None or text:  # every chunk, even one whose text is not settled yet
            yield event(piece(text, None))
        if final is not None:
            yield event(piece("", finish_reason(final["finish_reason"])))
            if request.include_usage:
                usage = final["usage"]
                total = usage["prompt_tokens"] + usage["completion_tokens"]
                yield event({}, usage | {"total_tokens": total})
    yield b"data: [DONE]\n\n"


def models_body(model_id: str, created: int) -> dict[str, Any]:
    """`GET /v1/models`: the one model this deployment serves."""
    return {
        "object": "list",
        "data": [{"id": model_id, "object": "model", "created": created, "owned_by": "moelambda"}],
    }
