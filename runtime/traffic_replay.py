"""`moelambda run-local --traffic`: a compressed trace through real execution environments,
measured against the traffic simulator's prediction for the same arrivals.

The simulator (`planner.traffic.simulate`) models every function's execution environments:
one invocation at a time, the most recently used idle one first, reclaimed after an idle time,
a new one paying its INIT and its first call's weight load. This module realises that mechanism
with real processes and real clocks, independently of the simulator's kernels, and runs the
plan's own workflow through it:

- **One moto for every process.** This process holds moto (`mock_aws`: S3, IAM, Lambda, Step
  Functions); the plan's synthesised template is deployed on it and the weights uploaded, as
  in-process `run-local` does (`pipeline.local`), and moto's Step Functions interpreter runs the
  template's state machine, its Lambda invoke routed to the pool below. The environments reach
  the same moto through a small HTTP endpoint (`_bridge`: each request handed to moto's request
  dispatcher, as an in-process client's is; moto's own server needs flask, which is not
  installed). S3 requests are served one at a time (`pipeline.local.atomic_s3`).
- **Execution environments are processes.** An environment is a fresh `python -c` process
  started for one function with that function's environment variables (its AWS endpoint: the
  bridge): it imports the function's handler module (Lambda's INIT phase), then serves one
  invocation at a time (a JSON line in, a JSON line out); the handler loads its weights from
  moto S3 on its first call, as on Lambda. A direct gate invokes its experts through moto's
  Lambda API, which routes them to the pool like the state machine's calls.
- **The pool manager** (`runtime.environments`) keeps per function a stack of idle
  environments: an invocation takes the most recently used idle one, or starts a new one
  and waits for it (a cold start); an environment idle longer than the idle time is
  reclaimed (its process ended), by a reaper thread every 0.2 s and at every invocation.
  A function's reserved concurrency (the template's
  `ReservedConcurrentExecutions`) throttles invocations beyond it (Lambda's 429, which the
  state machine retries with its own policy). `max_environments` bounds all live processes
  (this machine's memory), like an account's concurrency limit; reaching it is reported, and
  then the comparison does not hold.
- **The front door** dispatches executions in real time by the deployed rule the simulator
  applies too (`ground.frontdoor.batches`: the event source's whole-second window and batch
  size for a traffic plan, only simultaneous requests sharing for any other plan), uploads
  each batch's token ids and starts one execution; no batching function runs, so the
  simulator's batcher is given no INIT and no delay. A request of n tokens runs as
  ceil(n / 128) windows of 128 tokens of embedded Wikipedia text; the simulator gets the same
  rounded sizes.
- **Every shape replays**: the fan-out workflow, a driver with its remote experts, one
  function. A request ends when the function that ends it returns (`_end_function`, by the
  shape as the simulator models it): the workflow's tail, or the driver, which its remote
  experts return to.
- **Time is compressed** by `compress`: arrival times and the idle time are divided by it; the
  real processes' INIT, weight loads and compute are not (they are what they are on this
  machine). The simulator is given the compressed arrivals and idle time too.

Before the trace (the **measurement at the start of the replay**): one environment per function
(as many as its warmer pings at once, for a function the plan warms) is started, at most
`prewarm_concurrency` functions at a time, timing its INIT (process start to handler
imported) and its first call's weight load (a warmer's ping, `functions.warm`); then a few warm
executions at batch sizes spanning the trace's measure each function's start offset after the
dispatch and its duration, and the end-to-end latency. The simulator is fed exactly these: a
`WorkflowModel` whose warm timings are the measured ones (interpolated over batch size as the
simulator always does), a `Platform` whose INIT and load are the measured ones, with no INIT
limit (a local process has none) and the replay's idle time, and the plan's batch policy. The
prewarmed environments enter the simulation as a warmer's first round at time 0 (one ping per
function, or the plan's warmer's k pings), the arrivals shifted after its INIT; those prewarm
cold starts are not counted on either side. Nothing is reclaimed before the trace starts: the
idle clock of every prewarmed environment starts with the trace on both sides.

**The plan's warmers** (a traffic plan's `warmer` capacity policies) are replayed: every
compressed interval after the first round, `k` concurrent pings (`functions.warm`) go through
the pool like any invocation, starting an environment when none is idle, at the times the
simulator's warmer rounds fall in the trace; a throttled ping is dropped. `warmer_pings`
counts them.

Contention, bounded rather than modelled: the processes share this machine's cores, so
environments that start at the same time slow each other (and warm calls) down, and the
simulator's INIT is a constant per function. The replay records each cold start's real INIT and
how many environments were starting with it, and every warm call's duration, and reports them
beside the values the simulator was given (`contention`). When starts overlap the agreement
breaks (docs/traffic.md measures it); the remedy taken is to replay at rates at which they do
not, and to say when they did (`starting_at_once`). Per request, `agreement.within_host` names
the requests that waited on a cold start of their own (one their execution's invocations made)
begun while more environments than this machine's cores were starting (`host_bound`; a failed
request is never named), and compares p99 without them, beside the share it left out; with more
than a quarter left out it gives no verdict. The rule is fixed by the core count, not by the
run. `start_limit` bounds the environments in INIT at once instead, but the starts it holds
back queue, which the simulator does not model either. Nothing is fitted to the run's own
outcome.

What is not replayed: provisioned concurrency and Lambda Managed Instances (listed in
`capacity_not_replayed`; the simulator is run without them too), the SQS queue and batching
function (`run-local --front-door` runs those), IAM enforcement (in-process `run-local` checks
it), faults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.driver import remote_table_bytes
from ground.errors import UsageError
from runtime.environments import POLL_S, ColdStart, EnvironmentPool, FunctionSpec, Throttled

if TYPE_CHECKING:
    from moe import MoEModel
    from planner.traffic.spec import Arrivals
    from planner.traffic.workflow import Functions

__all__ = [
    "MAX_EXCLUDED_SHARE",
    "MAX_REPLAY_REQUESTS",
    "WINDOW",
    "EnvironmentPool",
    "front_door",
    "host_bound",
    "replay_arrivals",
    "replay_traffic",
    "within_host",
]

Progress = Callable[[str], None]

WINDOW = 128  # tokens per window, as run-local and `moelambda profile` cut them
# Past this share of requests left out of `within_host`, its p99 gets no verdict.
MAX_EXCLUDED_SHARE = 0.25


def _sleep_until(t: float) -> float:
    delay = t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    return t


def front_door(
    times_s: np.ndarray,
    tokens: np.ndarray,
    max_tokens: int,
    window_s: float,
    records: int,
    origin: float,
    dispatch: Callable[[list[int], float], None],
) -> None:
    """Dispatch each execution (its requests, the monotonic time) at its delivery, request i
    arriving at `origin + times_s[i]`: the deployed front door's rule (`ground.frontdoor.
    batches`, an event source window of `window_s` and `records` messages, then the batcher's
    split by `max_tokens`), which the simulator's `batches_of` applies too. Without a front
    door the window is 0: only requests arriving at the same instant share an execution."""
    from ground import frontdoor

    for first, end, at, _ in frontdoor.batches(
        times_s.tolist(), tokens.tolist(), max_tokens, window_s, records
    ):
        dispatch(list(range(first, end)), _sleep_until(origin + at))


# ---------------------------------------------------------------------------------------------
# moto as a server, its Lambda invoke routed to the pool


@contextlib.contextmanager
def _bridge() -> Iterator[str]:
    """An HTTP endpoint on a free local port for the environments' AWS clients; its URL.

    Each request is handed to the moto mock of this process (`mock_aws` must be active), as
    an in-process client's request is (moto's botocore stubber): the service is read from the
    request's signature, the URL rewritten to that service's AWS endpoint. So every process
    sees one moto: the parent's S3, Lambda and Step Functions. (moto's own server needs flask,
    which this project does not install.)
    """
    import re

    from botocore.awsrequest import AWSPreparedRequest
    from botocore.compat import HTTPHeaders
    from moto.core.models import botocore_stubber
    from werkzeug.serving import WSGIRequestHandler, make_server
    from werkzeug.wrappers import Request, Response

    class Quiet(WSGIRequestHandler):
        def log_request(self, *args: Any, **kwargs: Any) -> None:
            pass

    scope = re.compile(r"Credential=[^/]+/[^/]+/([^/]+)/([^/]+)/aws4_request")

    @Request.application  # type: ignore[misc]
    def app(request: Request) -> Response:
        found = scope.search(request.headers.get("Authorization", ""))
        region, service = found.groups() if found else ("us-east-1", "s3")
        host = "s3.amazonaws.com" if service == "s3" else f"{service}.{region}.amazonaws.com"
        raw = request.environ.get("RAW_URI") or request.environ.get("REQUEST_URI") or "/"
        headers = HTTPHeaders()
        for key, value in request.headers.items():
            if key.lower() != "host":
                headers[key] = value
        headers["Host"] = host
        answer = botocore_stubber.process_request(
            AWSPreparedRequest(
                method=request.method,
                url=f"https://{host}{raw}",
                headers=headers,
                body=request.get_data(),
                stream_output=False,
            )
        )
        if answer is None:
            return Response(b"", status=404)
        status, out_headers, body = answer
        return Response(body, status=status, headers={k: str(v) for k, v in out_headers.items()})

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join()


@contextlib.contextmanager
def _environ(values: dict[str, str], drop: tuple[str, ...]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in (*values, *drop)}
    for k in drop:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _lambda_routed_to(pool: EnvironmentPool) -> Iterator[None]:
    """moto's Lambda invoke runs the function on the pool (a 429 when it throttles)."""
    from moto.awslambda.models import LambdaFunction

    from pipeline.local import _moto_throttle

    def invoke(function: LambdaFunction, event: Any = None) -> tuple[str, bool, str]:
        payload = event if isinstance(event, dict) else json.loads(event or "{}")
        try:
            ok, body = pool.invoke(function.function_name, payload)
        except Throttled:
            raise _moto_throttle(function.function_name) from None
        except Exception as error:  # the environment died: the runtime reports an error
            body, ok = {"errorType": type(error).__name__, "errorMessage": str(error)}, False
        return json.dumps(body), not ok, ""

    original = LambdaFunction._invoke_lambda
    LambdaFunction._invoke_lambda = invoke  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        LambdaFunction._invoke_lambda = original  # type: ignore[method-assign]


# ---------------------------------------------------------------------------------------------
# the replay


@dataclasses.dataclass
class _Execution:
    requests: list[int]
    tokens: int
    dispatched: float
    arn: str = ""
    request_id: str = ""
    status: str = "RUNNING"


class _Runner:
    """Starts executions of the deployed state machine and follows them to their end."""

    def __init__(self, s3: Any, sfn: Any, bucket: str, machine: str, windows: list[np.ndarray]):
        self.s3, self.sfn, self.bucket, self.machine = s3, sfn, bucket, machine
        self.windows = windows  # token ids per request, (windows, 128)
        self.executions: list[_Execution] = []
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._count = 0
        self._run = uuid.uuid4().hex[:8]

    def dispatch(
        self, requests: list[int], at: float, ids: np.ndarray | None = None
    ) -> _Execution:
        """Start one execution of `requests` (or of `ids`) dispatched at `at`, in a thread."""
        from ground import layout
        from pipeline.tensorio import encode

        batch = ids if ids is not None else np.concatenate([self.windows[r] for r in requests])
        with self._lock:
            name = f"{self._run}-{self._count:05d}"
            self._count += 1
            execution = _Execution(list(requests), int(batch.size), at)
            self.executions.append(execution)

        def start() -> None:
            self.s3.put_object(
                Bucket=self.bucket,
                Key=layout.input_key(name),
                Body=encode(batch.astype(np.int64)),
            )
            arn = self.sfn.start_execution(stateMachineArn=self.machine, name=name, input="{}")[
                "executionArn"
            ]
            execution.arn, execution.request_id = arn, layout.request_id_of(arn)

        thread = threading.Thread(target=start, daemon=True)
        thread.start()
        with self._lock:
            self._threads.append(thread)
        return execution

    def wait(self, deadline: float) -> None:
        """Until every execution stopped (or `deadline`, monotonic)."""
        for thread in list(self._threads):
            thread.join(max(deadline - time.monotonic(), 0.1))
        pending = [e for e in self.executions if e.status == "RUNNING" and e.arn]
        while pending and time.monotonic() < deadline:
            for execution in pending:
                info = self.sfn.describe_execution(executionArn=execution.arn)
                execution.status = info["status"]
            pending = [e for e in pending if e.status == "RUNNING"]
            if pending:
                time.sleep(POLL_S)


def _warmers(
    pool: EnvironmentPool,
    pings: list[tuple[float, str, int]],
    origin: float,
    stop: threading.Event,
) -> threading.Thread:
    """A thread that sends, at each `origin + t` (monotonic), `k` concurrent pings to the
    function named `name` for each (t, name, k) in time order, as the plan's scheduled
    warmers do, and ends when they are answered (or at `stop`); a throttled ping is dropped,
    as a failed scheduler invocation is."""
    from functions.warm import PING

    def ping(name: str) -> None:
        with contextlib.suppress(Throttled):
            pool.invoke(name, dict(PING))

    def run() -> None:
        sent = []
        for t, name, k in sorted(pings):
            if stop.wait(max(origin + t - time.monotonic(), 0.0)):
                break
            for _ in range(k):
                sent.append(threading.Thread(target=ping, args=(name,), daemon=True))
                sent[-1].start()
        for thread in sent:  # every ping answered before the run is read
            thread.join()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _functions(template: dict[str, Any], names: dict[str, str], lambdas: Any) -> dict[str, Any]:
    from pipeline.local import function_label

    reserved = {
        names[k]: int(r["Properties"].get("ReservedConcurrentExecutions") or 0)
        for k, r in template["Resources"].items()
        if r["Type"] == "AWS::Lambda::Function"
    }
    return {
        name: FunctionSpec(function_label(handler, env), handler, dict(env), reserved[name])
        for name, (handler, env) in lambdas.functions.items()
    }


def _quantiles(latency: np.ndarray) -> dict[str, float | None]:
    """p50, p95, p99, max as the simulator reports them (empirical, None when unbounded)."""
    if latency.size == 0:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    qs = np.quantile(latency, [0.5, 0.95, 0.99, 1.0], method="inverted_cdf")
    return {
        k: (round(float(v), 4) if np.isfinite(v) else None)
        for k, v in zip(("p50", "p95", "p99", "max"), qs, strict=True)
    }


def host_bound(
    execution_of: Sequence[str | None],
    latency: np.ndarray,
    cold_starts: list[ColdStart],
    cores: int,
) -> np.ndarray:
    """Which requests waited on a cold start of their own begun while more environments than
    `cores` were starting: request i, whose execution's request id is `execution_of[i]` (None
    for one never started) and whose latency is `latency[i]` (inf: failed).

    The simulator, like Lambda, gives every environment a CPU of its own; this machine's
    processes share `cores`, so a start begun in a larger crowd takes longer than the INIT the
    simulator was fed, and a request that waited on one measured the machine, not the model.
    An invocation waits on no start but its own (it takes an idle environment or starts one;
    one held back by `start_limit` is counted in the crowd it waits in), so a request waited on
    exactly the starts its execution's invocations made (`ColdStart.request_id`). A request
    whose execution merely overlapped a crowded start of another request or of a warmer shared
    the CPU with it, as a warm call shares it with whatever else runs (`contention`), but did
    not wait on it, and stays. A failed request always stays: its failure is a measurement the
    agreement must not drop. The rule is the host's core count against the starts the replay
    counted, fixed before any run.
    """
    crowded = {c.request_id for c in cold_starts if c.concurrent > cores and c.request_id}
    waited = np.array([e in crowded for e in execution_of], dtype=bool)
    return waited & np.isfinite(latency)


def within_host(
    execution_of: Sequence[str | None],
    latency: np.ndarray,
    simulated: np.ndarray,
    cold_starts: list[ColdStart],
    cores: int,
) -> dict[str, Any]:
    """p99's agreement without the requests `host_bound` names, and how many it left out.

    The requests left out are slow ones, so leaving them out brings p99 down: the ratio is
    given with the share left out (`excluded_share`), and with more than `MAX_EXCLUDED_SHARE`
    left out it gives no verdict (`p99_within_30pct` None, `no_verdict` the reason), since the
    rest no longer stand for the trace. With fewer, `p99_within_30pct` is the verdict and
    `no_verdict` None.
    """
    bound = host_bound(execution_of, latency, cold_starts, cores)
    inside = ~bound
    share = float(bound.sum()) / max(bound.size, 1)
    verdict = _p99_agreement(latency[inside], simulated[inside])
    no_verdict = None
    if share > MAX_EXCLUDED_SHARE:
        verdict["p99_within_30pct"] = None
        no_verdict = (
            f"{share * 100:.0f} % of the requests left out, more than "
            f"{MAX_EXCLUDED_SHARE * 100:.0f} %: the rest do not stand for the trace"
        )
    return {
        "cores": cores,
        "host_bound_requests": [int(i) for i in np.flatnonzero(bound)],
        "requests": int(inside.sum()),
        "excluded_share": round(share, 3),
        **verdict,
        "no_verdict": no_verdict,
    }


def _p99_agreement(measured: np.ndarray, simulated: np.ndarray) -> dict[str, Any]:
    """p99 measured over simulated, and whether it is within 30 % (the issue's bound)."""
    p99_m = _quantiles(measured)["p99"]
    p99_s = _quantiles(simulated)["p99"]
    return {
        "p99_measured_over_simulated": None
        if p99_m is None or not p99_s
        else round(p99_m / p99_s, 3),
        "p99_within_30pct": p99_m is not None
        and p99_s is not None
        and abs(p99_m - p99_s) <= 0.3 * p99_s,
    }


def _end_function(functions: Functions) -> str:
    """The function whose return ends a request, by the plan's shape as the simulator models
    it (`planner.traffic.workflow`): a function that waits on every later stage (the driver of
    a driver or one-function plan: its remote experts return to it, and it writes the output),
    else the one function of the last stage (the fan-out workflow's tail).

    Raises:
        ValueError: No such function (a shape this rule does not know).
    """
    spans = np.flatnonzero(functions.waits_on_later_stages)
    if spans.size == 1:
        return functions.names[int(spans[0])]
    last = np.flatnonzero(functions.stage == functions.stage.max())
    if spans.size == 0 and last.size == 1:
        return functions.names[int(last[0])]
    raise ValueError(f"no one function ends a request of this plan (functions {functions.names})")


def _warm_timings(
    pool: EnvironmentPool,
    runner: _Runner,
    sizes: list[int],
    repeats: int,
    ids: np.ndarray,
    order: list[str],
    timeout_s: float,
    end: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sizes, latency (S,), offset (S, F), duration (S, F)) of warm executions, one at a time,
    the median of `repeats` at each size; a first execution warms the path and is dropped. An
    execution's latency runs from its dispatch to the return of `end` (`_end_function`)."""

    def one(windows: int) -> dict[str, Any]:
        pool.reset_counts()
        execution = runner.dispatch([], time.monotonic(), ids[:windows])
        runner.wait(time.monotonic() + timeout_s)
        if execution.status != "SUCCEEDED":
            raise RuntimeError(f"a warm execution of {windows} windows ended {execution.status}")
        calls = [c for c in pool.invocations if c.request_id == execution.request_id]
        if any(c.cold for c in calls):
            raise RuntimeError("a calibration execution found a function cold")
        start = {
            f: min(c.start for c in calls if c.function == f)
            for f in order
            if any(c.function == f for c in calls)
        }
        longest = {f: max(c.end - c.start for c in calls if c.function == f) for f in start}
        returned = [c.end for c in calls if c.function == end]
        if not returned:
            raise RuntimeError(f"a warm execution of {windows} windows never invoked {end}")
        return {
            "latency": max(returned) - execution.dispatched,
            "offset": [start[f] - execution.dispatched if f in start else np.nan for f in order],
            "duration": [longest.get(f, 0.0) for f in order],
        }

    one(sizes[0])
    latency, offset, duration = [], [], []
    for windows in sizes:
        runs = [one(windows) for _ in range(repeats)]
        latency.append(float(np.median([r["latency"] for r in runs])))
        offset.append(np.nanmedian([r["offset"] for r in runs], axis=0))
        duration.append(np.median([r["duration"] for r in runs], axis=0))
    off = np.array(offset)
    # A function no batch of that size invoked (no token reached it) is not simulated there.
    off = np.where(np.isnan(off), np.nanmin(off, axis=1, keepdims=True), off)
    tokens = np.array(sizes, dtype=float) * WINDOW
    return tokens, np.array(latency), off, np.array(duration)


MAX_REPLAY_REQUESTS = 3000  # every request runs on this machine


def replay_arrivals(
    spec: str,
    *,
    scale: float,
    hours: float | None = None,
    minutes: float | None = None,
    compress: float = 10.0,
    idle_s: float | None = None,
    max_environments: int = 40,
    start_concurrency: int = 1,
    start_limit: int | None = None,
    seed: int = 0,
) -> Arrivals:
    """The arrivals a replay runs, every setting of it checked first: a replay starts real
    processes for minutes, so a setting it cannot use must fail before any of them.

    Args:
        spec: The traffic, as `planner.traffic.load_arrivals` reads it.
        scale: Multiplies the trace's arrival rate.
        hours: The period; or `minutes`; 10 minutes when neither is given.
        minutes: The period in minutes.
        compress, idle_s, max_environments, start_concurrency, start_limit: As
            `replay_traffic` takes them; checked here.
        seed: Seeds a generated stream.

    Raises:
        UsageError: A setting out of range, or a stream with no request or more than
            `MAX_REPLAY_REQUESTS`.

    Example::

        arrivals = replay_arrivals("azure-conv", scale=0.01, minutes=24)
    """
    from planner.traffic import load_arrivals, period_hours

    period_h = period_hours(hours, minutes)
    if not compress > 0:
        raise UsageError(f"--compress {compress} is not positive.", "pass e.g. --compress 10.")
    if idle_s is not None and not idle_s > 0:
        raise UsageError(f"--idle-s {idle_s} is not positive.", "pass e.g. --idle-s 600.")
    if start_concurrency < 1:
        raise UsageError(f"--start-concurrency {start_concurrency} is below 1.", "pass 1 or more.")
    if start_limit is not None and start_limit < 1:
        raise UsageError(f"--start-limit {start_limit} is below 1.", "pass 1 or more.")
    if max_environments < 1:
        raise UsageError(f"--max-environments {max_environments} is below 1.", "pass 1 or more.")
    period_h = 10.0 / 60 if period_h is None else period_h
    arrivals = load_arrivals(spec, scale=scale, hours=period_h, seed=seed)
    if arrivals.requests == 0:
        raise UsageError(
            f"--traffic {spec!r} at --scale {scale:g} has no request in {period_h * 60:g} "
            "minutes.",
            "pass a larger --scale or a longer --minutes.",
        )
    if arrivals.requests > MAX_REPLAY_REQUESTS:
        raise UsageError(
            f"{arrivals.requests:,} requests: the replay runs every one on this machine "
            f"(at most {MAX_REPLAY_REQUESTS:,}).",
            "pass a smaller --scale or fewer --minutes.",
        )
    return arrivals


def replay_traffic(
    plan: Path,
    model: MoEModel,
    arrivals: Arrivals,
    *,
    compress: float = 10.0,
    idle_s: float | None = None,
    prewarm_concurrency: int = 1,
    calibration_repeats: int = 2,
    max_environments: int = 40,
    start_limit: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Replay `arrivals`, compressed, through the plan's workflow on real processes, and set
    what was measured beside the simulator's prediction for the same arrivals.

    Args:
        plan: The plan JSON (`moelambda plan`; a traffic plan's batch policy is used).
        model: The plan's model, loaded (its weights are exported to moto S3).
        arrivals: The request stream, uncompressed (`planner.traffic.load_arrivals`).
        compress: Arrival times and the idle time are divided by this. Defaults to 10.
        idle_s: Idle seconds before an environment is reclaimed, uncompressed. Default: the
            calibration's assumption (600 s).
        prewarm_concurrency: Environments started at once before the trace. Defaults to 1.
        calibration_repeats: Warm executions per batch size measured before the trace.
        max_environments: The most live processes (memory); invocations beyond are throttled.
        start_limit: The most environments in INIT at once during the trace (None: no bound,
            as on Lambda); a further cold start waits, which the simulator does not model.
        seed: Seeds the shuffle of the text windows requests are cut from.
        progress: Called with a message as each step starts.

    Returns:
        `measured` and `simulated` (each `cold_starts {count, per_function}`, `latency_s {p50,
        p95, p99, max}`, batches), the plan's `deployment` and the function whose return ends a
        request (`request_ends_at`), the arrivals used, the compression, what the simulator was
        fed (`platform`), `contention`, `agreement` and `wall_s`: what `moelambda run-local
        --traffic --json` prints.

    Raises:
        UsageError: a non-positive compression or idle time, no arrivals, or a request or
            batch larger than the plan serves.
    """
    import boto3
    from moto import mock_aws

    from cdk.app import DEFAULT_STACK, build_app
    from functions.local import LocalHandlers
    from ground.plan import Plan
    from moe import export_model, load_corpus, make_windows
    from pipeline.local import BUCKET, REGION, InProcessLambdas, _deploy, atomic_s3
    from pipeline.stacks import flat_template
    from planner.traffic import Capacity, policies_of, simulate, workflow_model
    from planner.traffic.platform import platform_for, traffic_calibration

    say = progress or (lambda _: None)
    started = time.perf_counter()
    if not compress > 0 or not math.isfinite(compress):
        raise UsageError(f"--compress {compress} is not positive.", "pass e.g. --compress 10.")
    if idle_s is not None and not idle_s > 0:
        raise UsageError(f"--idle-s {idle_s} is not positive.", "pass e.g. --idle-s 600.")
    if arrivals.requests == 0:
        raise UsageError(
            "the traffic holds no request in the period.", "pass a longer --minutes or --hours."
        )
    document = Plan.load(plan)
    policy, _, _ = policies_of(document)
    cal, _ = traffic_calibration(document)
    assert cal.idle_reclaim_s is not None
    idle = float(cal.idle_reclaim_s.assumed_s if idle_s is None else idle_s)
    idle_c = idle / compress
    windows = np.maximum(np.ceil(arrivals.tokens / WINDOW), 1).astype(np.int64)
    tokens = windows * WINDOW
    times_c = arrivals.times_s / compress
    period_c = arrivals.period_s / compress
    largest = int(max(tokens.max(), policy.max_tokens))
    wf = workflow_model(document, largest)
    if tokens.max() > wf.feasible_tokens:
        raise UsageError(
            f"a request of {int(tokens.max())} tokens (whole {WINDOW}-token windows) is larger "
            f"than the plan serves ({wf.feasible_tokens}).",
            "replay a trace of smaller requests, or plan a larger batch.",
        )
    say("cutting text windows for the requests")
    pool_windows = make_windows(
        load_corpus("wiki"), model.tokenizer, tokens=WINDOW * 256, window=WINDOW, seed=seed
    )
    offsets = np.concatenate([[0], np.cumsum(windows)[:-1]])
    request_ids = [
        pool_windows[(o + np.arange(w)) % pool_windows.shape[0]]
        for o, w in zip(offsets, windows, strict=True)
    ]
    # The plan's scheduled warmers are replayed (compressed); other capacity policies are not.
    warmed: dict[str, tuple[float, int]] = {}
    not_replayed: dict[str, str] = {}
    for c in document.traffic.capacity if document.traffic is not None else []:
        if c.policy == "warmer":
            interval = float(c.warmer_interval_s or 0.0) / compress
            warmed[c.function] = (interval, int(c.warmer_concurrency))
        elif c.policy != "none":
            not_replayed[c.function] = c.policy
    fake = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }
    drop = ("AWS_SESSION_TOKEN", "AWS_PROFILE")
    with contextlib.ExitStack() as stack:
        root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="moelambda-replay-")))
        say("exporting weights and synthesising the stack")
        export_model(model, root / "weights")
        source = plan
        if document.traffic is not None:  # its warmers and aliases are not replayed
            source = document.model_copy(update={"traffic": None}).save(root / "plan.json")
        build_app(source, root / "cdk.out", stack_name=DEFAULT_STACK)
        template = flat_template(root / "cdk.out", DEFAULT_STACK)
        say("deploying the stack on moto")
        logging.getLogger("moto.stepfunctions").setLevel(logging.CRITICAL)
        stack.enter_context(_environ(fake, drop))
        stack.enter_context(mock_aws(config={"stepfunctions": {"execute_state_machine": True}}))
        stack.enter_context(atomic_s3())
        url = stack.enter_context(_bridge())
        run = uuid.uuid4().hex[:8]
        bucket = f"{BUCKET}-{run}"
        names: dict[str, str] = {}
        for logical, res in template["Resources"].items():
            if res["Type"] == "AWS::S3::Bucket":
                names[logical] = bucket
            elif res["Type"] == "AWS::Lambda::Function":
                names[logical] = f"fn-{run}-{logical}"[:64]
        s3 = boto3.client("s3", region_name=REGION)
        sfn = boto3.client("stepfunctions", region_name=REGION)
        s3.create_bucket(Bucket=bucket)
        for path in sorted(p for p in (root / "weights").rglob("*") if p.is_file()):
            s3.upload_file(
                str(path), bucket, "weights/" + path.relative_to(root / "weights").as_posix()
            )
        registry = InProcessLambdas(LocalHandlers())
        machine = _deploy(template["Resources"], names, bucket, registry)
        specs = _functions(template, names, registry)
        (root / "logs").mkdir()
        base_env = {k: v for k, v in os.environ.items() if k not in drop} | fake
        base_env["AWS_ENDPOINT_URL"] = url
        # Nothing is reclaimed while the environments are started and measured: the idle
        # time runs from the trace's start (the last warm execution used every function).
        pool = EnvironmentPool(specs, base_env, math.inf, root / "logs", max_environments)
        stack.callback(pool.close)
        stack.enter_context(_lambda_routed_to(pool))
        order = list(wf.functions.names)
        end = _end_function(wf.functions)
        by_label = {s.label: name for name, s in specs.items()}
        missing = [f for f in order if f not in by_label]
        if missing:
            raise RuntimeError(f"the template lacks the plan's functions {missing}")

        # The measurement at the start: INIT and first load per function, then warm timings.
        init = np.zeros(len(order))
        load = np.zeros(len(order))
        from functions.warm import PING

        say(f"starting the environments of {len(order)} functions")
        errors: list[BaseException] = []
        gate = threading.Semaphore(max(1, prewarm_concurrency))

        def start_one(k: int, label: str) -> None:
            """As many environments as the function's warmer keeps (one without): concurrent
            pings, each starting one, as the simulator's first warmer round does."""
            with gate:
                try:
                    count = warmed.get(label, (0.0, 1))[1]
                    firsts = np.zeros(count)

                    def ping(j: int) -> None:
                        t0 = time.monotonic()
                        ok, body = pool.invoke(by_label[label], dict(PING))
                        firsts[j] = time.monotonic() - t0
                        if not ok:
                            raise RuntimeError(f"{label}'s warm-up failed: {body}")

                    pings = [threading.Thread(target=ping, args=(j,)) for j in range(count)]
                    for t in pings:
                        t.start()
                    for t in pings:
                        t.join()
                    starts = [c.init_s for c in pool.cold_starts if c.function == label]
                    if len(starts) != count:
                        raise RuntimeError(f"{label}'s warm-up started {len(starts)} of {count}")
                    init[k] = float(np.median(starts))
                    load[k] = float(np.median(firsts)) - init[k]
                except BaseException as error:  # reported below
                    errors.append(error)

        threads = [threading.Thread(target=start_one, args=(k, f)) for k, f in enumerate(order)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        runner = _Runner(s3, sfn, bucket, machine, request_ids)
        sizes = sorted(
            {
                1,
                int(np.median(windows)),
                int(np.quantile(windows, 0.9)),
                int(min(windows.max(), policy.max_tokens // WINDOW or 1)),
            }
        )
        say(f"measuring warm executions at {', '.join(str(s * WINDOW) for s in sizes)} tokens")
        calib_ids = np.concatenate([pool_windows] * math.ceil(max(sizes) / pool_windows.shape[0]))
        grid, warm_latency, warm_offset, warm_duration = _warm_timings(
            pool, runner, sizes, calibration_repeats, calib_ids, order, timeout_s=300, end=end
        )
        runner.executions.clear()
        pool.reset_counts()
        pool.idle_s = idle_c
        pool.limit_starts(start_limit)

        # What the simulator is fed (below) fixes the trace's shift after the prewarm, `lead`,
        # and with it when the warmers' later rounds fall in the trace.
        base = platform_for(
            cal,
            wf.functions,
            document.arch,
            static_bytes=remote_table_bytes(document),
            idle_s=idle_c,
        )
        door = base.front_door
        if door is not None:  # the replay dispatches without a batching function
            door = dataclasses.replace(door, batcher_init_s=0.0, start_s=0.0, put_s=0.0)
        platform = dataclasses.replace(
            base, init_s=init, load_s=load, init_limit_s=math.inf, ping_s=0.0, front_door=door
        )
        lead = float(platform.cold_s()[0].max()) + 1e-3
        if not policy.front_door:
            window, records = 0.0, arrivals.requests
        elif door is not None:
            window, records = door.deployed(policy)
        else:
            window, records = policy.max_wait_s, arrivals.requests
        pings = [
            (m * interval - lead, by_label[f], k)
            for f, (interval, k) in warmed.items()
            for m in range(1, int((period_c + lead) / interval) + 1)
            if m * interval < period_c + lead
        ]

        # The trace.
        say(f"replaying {arrivals.requests} requests over {period_c:.0f} s")
        origin = time.monotonic() + 0.5
        pool.touch_idle(origin)  # the prewarmed environments' idle clocks start with it
        stop = threading.Event()
        warmer = _warmers(pool, pings, origin, stop)
        front_door(times_c, tokens, policy.max_tokens, window, records, origin, runner.dispatch)
        runner.wait(time.monotonic() + 600)
        warmer.join(max(origin + period_c - time.monotonic(), 0.0) + 60.0)
        stop.set()
        trace_end = time.monotonic()
        invocations = list(pool.invocations)
        cold_starts = list(pool.cold_starts)
        reclaimed = dict(pool.reclaimed)
        throttled = dict(pool.throttled)
        peak = dict(pool.peak)
        limit_reached = pool.limit_reached
        executions = list(runner.executions)

    # Measured: per request, its batch's end (the return of the function that ends it: the
    # tail, or the driver) minus its arrival.
    ends: dict[str, float] = {}
    for c in invocations:
        if c.function == end and c.request_id and c.ok:
            ends[c.request_id] = max(ends.get(c.request_id, 0.0), c.end)
    latency = np.full(arrivals.requests, np.inf)
    for e in executions:
        if e.status == "SUCCEEDED" and e.request_id in ends:
            for r in e.requests:
                latency[r] = ends[e.request_id] - (origin + times_c[r])
    tracked = [c for c in cold_starts if c.function in order]
    measured_cold = Counter(c.function for c in tracked)
    measured = {
        "requests": int(arrivals.requests),
        "batches": len(executions),
        "failed_batches": sum(e.status != "SUCCEEDED" for e in executions),
        "cold_starts": {
            "count": len(tracked),
            "per_function": dict(sorted(measured_cold.items())),
        },
        "latency_s": _quantiles(latency),
        "peak_environments": {f: int(peak[f]) for f in order if peak.get(f)},
        "reclaimed": reclaimed,
        "throttled": throttled,
        "environment_limit_reached": limit_reached,
        "warmer_pings": sum(
            1 for c in invocations if c.request_id is None and c.function in order
        ),
        "other_cold_starts": dict(
            Counter(c.function for c in cold_starts if c.function not in order)
        ),
    }

    # Simulated: the same arrivals, with what the replay realised.
    fed = dataclasses.replace(
        wf,
        sizes=grid if grid.size > 1 else np.array([grid[0], grid[0] + 1.0]),
        latency_s=warm_latency if grid.size > 1 else np.repeat(warm_latency, 2),
        offset_s=warm_offset if grid.size > 1 else np.repeat(warm_offset, 2, axis=0),
        duration_s=warm_duration if grid.size > 1 else np.repeat(warm_duration, 2, axis=0),
    )
    from planner.traffic.spec import Arrivals as _Arrivals

    sim_arrivals = _Arrivals(times_c + lead, tokens, period_c + lead, arrivals.source)
    once = Capacity("warmer", warmer_interval_s=period_c + lead + 1.0, warmer_concurrency=1)
    sim_capacity = [
        Capacity("warmer", warmer_interval_s=warmed[f][0], warmer_concurrency=warmed[f][1])
        if f in warmed
        else once
        for f in order
    ]
    result = simulate(fed, sim_arrivals, policy, platform, sim_capacity, reserve=True)
    # The warmers' first round at time 0 is the prewarm: its cold starts are not counted.
    prewarmed = {f: warmed.get(f, (0.0, 1))[1] for f in order}
    sim_cold = {f: n - prewarmed[f] for f, n in result.cold_starts.items() if n > prewarmed[f]}
    simulated = {
        "requests": int(result.latency_s.size),
        "batches": int(result.batch_tokens.size),
        "failed_batches": result.failed_batches + result.refused_batches,
        "cold_starts": {"count": int(sum(sim_cold.values())), "per_function": sim_cold},
        "latency_s": _quantiles(result.latency_s),
        "peak_environments": {f: n for f, n in result.peak_environments.items() if n},
    }

    # Contention: what the trace's cold starts and warm calls took against what was fed.
    index = {f: k for k, f in enumerate(order)}
    warm_calls = [c for c in invocations if not c.cold and c.function in index and c.ok]
    batch_tokens = {e.request_id: e.tokens for e in executions if e.request_id}
    ratios = []
    for c in warm_calls:
        if c.request_id not in batch_tokens:
            continue
        e_tokens = batch_tokens[c.request_id]
        expect = float(np.interp(e_tokens, fed.sizes, fed.duration_s[:, index[c.function]]))
        if expect > 0:
            ratios.append((c.end - c.start) / expect)
    contention = {
        "trace_init_s": {
            "median": round(float(np.median([c.init_s for c in tracked])), 3) if tracked else None,
            "max": round(float(max(c.init_s for c in tracked)), 3) if tracked else None,
        },
        "fed_init_s": {
            "median": round(float(np.median(init)), 3),
            "max": round(float(init.max()), 3),
        },
        "starting_at_once": dict(sorted(Counter(c.concurrent for c in tracked).items())),
        "start_limit": start_limit,
        "queued_for_start_s": round(float(sum(c.queued_s for c in tracked)), 3),
        "warm_call_vs_fed": {
            "median": round(float(np.median(ratios)), 3) if ratios else None,
            "p90": round(float(np.quantile(ratios, 0.9)), 3) if ratios else None,
        },
    }
    contention["prewarm_concurrency"] = prewarm_concurrency

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None or b == 0 else round(a / b, 3)

    cold_m, cold_s = measured["cold_starts"]["count"], simulated["cold_starts"]["count"]
    cold_diff = abs(cold_m - cold_s) / max(cold_s, 1)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cores = cores or os.cpu_count() or 1
    execution_of: list[str | None] = [None] * arrivals.requests
    for e in executions:
        for r in e.requests:
            execution_of[r] = e.request_id or None
    agreement = {
        "cold_starts_measured_over_simulated": ratio(cold_m, cold_s),
        "cold_starts_within_20pct": cold_diff <= 0.2,
        **_p99_agreement(latency, result.latency_s),
        "within_host": within_host(execution_of, latency, result.latency_s, tracked, cores),
    }
    return {
        "plan": document.solver,
        "deployment": document.deployment,
        "request_ends_at": end,
        "traffic": arrivals.describe(),
        "compression": compress,
        "arrivals": {
            "requests": int(arrivals.requests),
            "tokens": int(tokens.sum()),
            "period_s": round(period_c, 3),
            "time_s": [round(float(t), 4) for t in times_c],
            "tokens_per_request": [int(t) for t in tokens],
        },
        "idle_reclaim_s": {"uncompressed": idle, "replayed": idle_c},
        "prewarm_lead_s": round(lead, 3),
        "batch_policy": {"max_tokens": policy.max_tokens, "max_wait_s": policy.max_wait_s},
        "warmers_replayed": {
            f: {"interval_s": round(i, 3), "concurrency": k} for f, (i, k) in warmed.items()
        },
        "capacity_not_replayed": not_replayed,
        "measured": measured,
        "simulated": simulated,
        "agreement": agreement,
        "platform": {
            "init_s": {f: round(float(s), 3) for f, s in zip(order, init, strict=True)},
            "load_s": {f: round(float(s), 3) for f, s in zip(order, load, strict=True)},
            "warm_tokens": [int(t) for t in grid],
            "warm_latency_s": [round(float(s), 4) for s in warm_latency],
            "warm_offset_s": {
                f: [round(float(v), 4) for v in warm_offset[:, k]] for k, f in enumerate(order)
            },
            "warm_duration_s": {
                f: [round(float(v), 4) for v in warm_duration[:, k]] for k, f in enumerate(order)
            },
        },
        "latency_per_request_s": {
            "measured": [round(float(v), 4) if np.isfinite(v) else None for v in latency],
            "simulated": [
                round(float(v), 4) if np.isfinite(v) else None for v in result.latency_s
            ],
        },
        "contention": contention,
        "trace_wall_s": round(trace_end - origin, 3),
        "wall_s": round(time.perf_counter() - started, 3),
    }
