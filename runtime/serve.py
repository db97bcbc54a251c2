"""`moelambda serve` as a call: an OpenAI-compatible HTTP server in front of a stream plan's
deployment on moto, the real handlers in this process.

`LocalServer` exports the plan's model, synthesises its stack, deploys it on moto
(`pipeline.stream_local`: the request queue, the workers started as the event source mapping
starts them) and serves `/v1/completions`, `/v1/chat/completions` and `/v1/models` on a local
port. Each request runs what the deployed endpoint function runs (`functions.endpoint`: check,
send to the queue, read the answer's chunks), with the endpoint's identity, so its policy
applies; unlike the deployed Function URL, it writes each piece of a streamed answer as the
worker settles it (server-sent events). A bad request gets OpenAI's error body and its 4xx;
the requests in flight go on.
"""

from __future__ import annotations

import json
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ground.errors import UsageError

if TYPE_CHECKING:
    from ground.plan import Plan
    from moe import MoEModel
    from pipeline.stream_local import StreamStack

__all__ = ["LocalServer", "refuse_stream", "stream_plan"]

ANSWER_DEADLINE_S = 900.0  # the longest a client waits for an answer (Lambda's timeout)


def stream_plan(path: Path) -> Plan:
    """The plan at `path`, if it serves a stream (`plan --traffic --slo-ttft --slo-tpot`).

    Raises:
        UsageError: It has no stream block.
    """
    from ground.plan import Plan

    document = Plan.load(path)
    if document.stream is None:
        raise UsageError(
            f"'{path}' does not serve a stream: it has no workers to send requests to.",
            "make the plan with `moelambda plan --traffic SPEC --slo-ttft S --slo-tpot S` on a "
            "decoder's traces.",
        )
    return document


def refuse_stream(plan: Plan, command: str) -> None:
    """Stop `command` (run-local, generate, replan) on a stream plan: its stack has no
    workflow to start and no driver to invoke; requests go to its queue.

    Raises:
        UsageError: `plan` is a stream plan.
    """
    if plan.stream is not None:
        raise UsageError(
            f"{command} runs a batch or a generation through the plan's workflow, and this "
            "plan serves a stream: requests go to its queue and its workers.",
            "serve it with `moelambda serve --plan PLAN` (an OpenAI-compatible endpoint), "
            "measure it with `moelambda bench stream`, or plan one invocation a request with "
            "`moelambda plan ... --per-request`.",
        )


class LocalServer:
    """The HTTP server and the stack behind it, for as long as the `with` block runs.

    Example::

        with LocalServer(Path("out/plan.json"), model) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="local")

    Args:
        plan: A stream plan (`stream_plan`).
        model: The plan's model, loaded.
        host: The address to listen on.
        port: The port to listen on (0: a free one).
        visibility_timeout_s: Replaces the queue's (tests of a dying worker).
        max_workers: Caps the workers below the plan's (`bench stream` runs one).
        metrics_file: Where the functions' metrics go (the workers' iteration timings).
        progress: Called with a message as each setup step starts.
    """

    def __init__(
        self,
        plan: Path,
        model: MoEModel,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        visibility_timeout_s: int | None = None,
        max_workers: int | None = None,
        metrics_file: Path | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.plan_path, self.model = plan, model
        self.document = stream_plan(plan)
        self.host, self.port = host, port
        self.visibility_timeout_s, self.max_workers = visibility_timeout_s, max_workers
        self.metrics_file = metrics_file
        self.say = progress or (lambda _: None)
        self.stack: StreamStack | None = None
        self._exit = ExitStack()
        self._http: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self._http is not None
        host, port = self._http.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def model_id(self) -> str:
        return self.document.model.model

    def __enter__(self) -> LocalServer:
        from cdk.app import DEFAULT_STACK, build_app
        from functions.local import LocalHandlers
        from moe import export_model
        from pipeline.stacks import flat_template
        from pipeline.stream_local import stream_stack

        try:
            root = Path(
                self._exit.enter_context(tempfile.TemporaryDirectory(prefix="moelambda-serve-"))
            )
            self.say("exporting weights and synthesising the stack")
            export_model(self.model, root / "weights")
            build_app(self.plan_path, root / "cdk.out", stack_name=DEFAULT_STACK)
            template = flat_template(root / "cdk.out", DEFAULT_STACK)
            self.say("deploying on moto and warming the worker")
            self.stack = self._exit.enter_context(
                stream_stack(
                    template,
                    root / "weights",
                    handlers=LocalHandlers(),
                    visibility_timeout_s=self.visibility_timeout_s,
                    max_workers=self.max_workers,
                    metrics_file=self.metrics_file,
                )
            )
            self._http = ThreadingHTTPServer((self.host, self.port), _handler_for(self))
            self._http.daemon_threads = True
            thread = threading.Thread(target=self._http.serve_forever, daemon=True)
            thread.start()
            self._exit.callback(self._http.server_close)
            self._exit.callback(self._http.shutdown)
        except BaseException:
            self._exit.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._exit.close()

    def answer(self, path: str, raw: bytes) -> tuple[int, dict[str, Any] | Iterator[bytes]]:
        """(status, JSON body or server-sent events) for one POST, as the endpoint answers."""
        from functions import config
        from functions.batcher import _client
        from functions.common import s3_client
        from functions.endpoint import pieces, submit
        from functions.openai_api import ApiError, answer_body, parse, sse_events

        assert self.stack is not None
        stream = self.document.stream
        assert stream is not None
        env = self.stack.endpoint_env
        try:
            request = parse(
                path,
                raw,
                model_id=self.model_id,
                tokenizer=self.model.tokenizer,
                max_prompt_tokens=stream.max_prompt_tokens,
                max_new_tokens=stream.max_new_tokens,
            )
            with config.local(env):
                message_id = submit(_client("sqs"), self.stack.queue_url, request)
        except ApiError as error:
            return error.status, error.body()
        created = int(time.time())

        def read() -> Iterator[tuple[str, dict[str, Any] | None]]:
            with config.local(env):  # the endpoint's identity, in the thread that reads
                yield from pieces(
                    s3_client(), self.stack.bucket, message_id, deadline_s=ANSWER_DEADLINE_S
                )

        if request.stream:
            return 200, sse_events(request, message_id, self.model_id, read(), created)
        try:
            final = [f for _, f in read() if f is not None][0]
        except ApiError as error:
            return error.status, error.body()
        return 200, answer_body(request, message_id, self.model_id, final, created)


def _handler_for(server: LocalServer) -> type[BaseHTTPRequestHandler]:
    from functions.openai_api import ApiError, models_body

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            """Quiet: the CLI prints what it serves."""

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, models_body(server.model_id, int(time.time())))
            else:
                self._json(404, ApiError(404, f"no such endpoint GET {self.path!r}.").body())

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            try:
                status, body = server.answer(self.path.split("?")[0], raw)
            except Exception as error:  # a bug, not the request: a 500 the client can read
                self._json(500, ApiError(500, f"{type(error).__name__}: {error}").body())
                return
            if isinstance(body, dict):
                self._json(status, body)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for event in body:
                    self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                    self.wfile.flush()
            except ApiError as error:  # after the headers: the error as the last event
                event = f"data: {json.dumps(error.body())}\n\n".encode()
                self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

    return Handler
