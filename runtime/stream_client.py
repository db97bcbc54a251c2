"""The load generator of `moelambda bench stream`, run as its own process: it sends each request
to an OpenAI-compatible endpoint at its arrival time and records when its first and last pieces
came.

    python -m runtime.stream_client URL REQUESTS.json OUT.json

REQUESTS.json: [{"at_s": seconds after the start, "prompt": [token ids], "max_tokens": N}, ...].
OUT.json: per request {"sent_s", "first_s", "done_s", "prompt_tokens", "completion_tokens",
"text", "status"}, seconds since the start (the client's own clock: what a user measures).
"""

from __future__ import annotations

import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["run"]


def _one(url: str, request: dict[str, Any], start: float, out: dict[str, Any]) -> None:
    body = {
        "prompt": request["prompt"],
        "max_tokens": request["max_tokens"],
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    delay = start + request["at_s"] - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    out["sent_s"] = time.perf_counter() - start
    post = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    text = []
    try:
        with urllib.request.urlopen(post, timeout=900) as response:
            for line in response:
                if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if event.get("choices"):
                    out.setdefault("first_s", time.perf_counter() - start)
                    text.append(event["choices"][0]["text"])
                if event.get("usage"):
                    out["prompt_tokens"] = event["usage"]["prompt_tokens"]
                    out["completion_tokens"] = event["usage"]["completion_tokens"]
        out["done_s"] = time.perf_counter() - start
        out["status"] = 200
    except Exception as error:  # recorded, not raised: the bench reports failed requests
        out["status"] = f"{type(error).__name__}: {error}"
    out["text"] = "".join(text)


def run(url: str, requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send every request at its time, each from its own thread; their records in order."""
    records: list[dict[str, Any]] = [{} for _ in requests]
    start = time.perf_counter()
    threads = [
        threading.Thread(target=_one, args=(url, r, start, rec), daemon=True)
        for r, rec in zip(requests, records, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return records


if __name__ == "__main__":
    url, given, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    out.write_text(json.dumps(run(url, json.loads(given.read_text()))))
