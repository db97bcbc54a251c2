"""The OpenAI wire format alone (`functions.openai_api`): a chat request through the real
SmolLM2 tokenizer's chat template, and the streamed events of an answer."""

from __future__ import annotations

import json

import pytest

from functions.openai_api import ApiError, parse, sse_events
from moe import resolve_model
from moe._hf import load_tokenizer


@pytest.fixture(scope="module")
def smollm2_tokenizer():  # type: ignore[no-untyped-def]
    return load_tokenizer(resolve_model("smollm2"))


def test_a_chat_request_is_the_chat_template_s_tokens(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    body = json.dumps({"messages": messages, "temperature": 0}).encode()
    request = parse(
        "/v1/chat/completions",
        body,
        model_id="smollm2",
        tokenizer=smollm2_tokenizer,
        max_prompt_tokens=512,
        max_new_tokens=64,
    )
    text = smollm2_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert "What is the capital of France?" in text
    assert request.prompt == smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert request.kind == "chat" and request.settings["max_new_tokens"] == 64  # chat: longest
    with pytest.raises(ApiError, match="messages") as refused:
        parse(
            "/v1/chat/completions",
            b'{"messages": []}',
            model_id="smollm2",
            tokenizer=smollm2_tokenizer,
            max_prompt_tokens=512,
            max_new_tokens=64,
        )
    assert refused.value.status == 400


def test_a_chat_stream_opens_with_the_role_and_ends_with_the_reason(smollm2_tokenizer) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    request = parse(
        "/v1/chat/completions",
        body,
        model_id="smollm2",
        tokenizer=smollm2_tokenizer,
        max_prompt_tokens=512,
        max_new_tokens=8,
    )
    final = {"finish_reason": "eos", "usage": {"prompt_tokens": 5, "completion_tokens": 3}}
    pieces = iter([("Hel", None), ("", None), ("lo", final)])
    events = [
        json.loads(e[6:])
        for e in b"".join(sse_events(request, "m1", "smollm2", pieces, 0)).decode().split("\n\n")
        if e.startswith("data: {")
    ]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events if e["choices"])
    assert text == "Hello"
    assert events[-2]["choices"][0]["finish_reason"] == "stop"  # an end-of-sequence token
    assert events[-1]["usage"]["total_tokens"] == 8 and events[-1]["choices"] == []
    assert all(e["object"] == "chat.completion.chunk" and e["id"] == "chatcmpl-m1" for e in events)
