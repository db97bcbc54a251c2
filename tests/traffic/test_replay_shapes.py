"""`run-local --traffic` on every shape (issue 52): a one-function plan and a driver plan replay
to the end with their agreement verdict, as the fan-out workflow does (`test_replay.py`).

Before, the replay's warm calibration timed each execution to the return of a function named
"tail", which only the fan-out workflow has: on a driver or one-function plan it raised
`max() arg is an empty sequence` after starting the environments. A request now ends when the
function that ends it by the plan's shape returns (`traffic_replay._end_function`).

The replays are kept as small as the path allows: a one-layer tiny Mixtral (4 experts), plans
without a traffic block (no warmers, only simultaneous requests share a batch), and a stream of
two one-window requests 1.5 s apart, uncompressed: one environment per function, three warm
executions of one window, two executions in the trace.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from moelambda.cli import app
from tests.traffic.mixtral import save_one_layer_mixtral

runner = CliRunner()
STREAM = "time_s,tokens\n0,100\n1.5,120\n"  # two requests of one 128-token window each


def _cli(*args: str) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, (result.output, result.exception)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The stream, and a one-function and a driver plan of a one-layer tiny Mixtral (as
    `moelambda plan --deployment monolithic` and `--deployment driver` write them)."""
    root = tmp_path_factory.mktemp("shapes")
    save_one_layer_mixtral(root / "mixtral")
    traces = str(root / "t")
    _cli("profile", "--model", str(root / "mixtral"), "--tokens", "2048", "--out", traces)
    files = {"stream": root / "stream.csv"}
    files["stream"].write_text(STREAM)
    for shape in ("monolithic", "driver"):
        files[shape] = root / f"{shape}.json"
        out = ["--deployment", shape, "--out", str(files[shape])]
        _cli("plan", "--traces", traces, "--tokens", "1024", *out)
    return files


def _replay(plan: Path, stream: Path) -> dict[str, Any]:
    trace = ["--traffic", str(stream), "--minutes", "0.05", "--compress", "1"]
    return _cli("run-local", "--plan", str(plan), *trace)


def _check_verdict(out: dict[str, Any], functions: list[str]) -> None:
    """Both requests ran to the end on both sides, timed to the return of the function that
    ends them, and the agreement gives its verdict."""
    assert list(out["platform"]["init_s"]) == functions
    assert all(s > 0 for s in out["platform"]["warm_latency_s"])
    for side in ("measured", "simulated"):
        assert out[side]["requests"] == 2 and out[side]["failed_batches"] == 0, side
        assert out[side]["latency_s"]["p99"] is not None, side
    measured = out["latency_per_request_s"]["measured"]
    assert all(v is not None and v > 0 for v in measured), measured
    agreement = out["agreement"]
    assert agreement["p99_measured_over_simulated"] > 0
    assert isinstance(agreement["p99_within_30pct"], bool)
    within = agreement["within_host"]
    assert within["requests"] + len(within["host_bound_requests"]) == 2


def test_a_one_function_plan_replays_with_its_verdict(shapes: dict[str, Path]) -> None:
    out = _replay(shapes["monolithic"], shapes["stream"])
    _check_verdict(out, ["driver"])
    assert (out["deployment"], out["request_ends_at"]) == ("monolithic", "driver")
    assert set(out["measured"]["peak_environments"]) == {"driver"}


def test_a_driver_plan_replays_with_its_verdict(shapes: dict[str, Path]) -> None:
    from ground.plan import Plan

    plan = Plan.load(shapes["driver"])
    remote = plan.topology.function_names(plan.layers)
    assert remote[0] == "driver" and len(remote) > 1  # the driver and its remote experts
    out = _replay(shapes["driver"], shapes["stream"])
    _check_verdict(out, remote)
    assert (out["deployment"], out["request_ends_at"]) == ("driver", "driver")
    # The driver starts with the dispatch; its remote experts after it, within its call.
    offsets = out["platform"]["warm_offset_s"]
    durations = out["platform"]["warm_duration_s"]
    assert offsets["driver"][0] <= min(offsets[f][0] for f in remote[1:])
    assert durations["driver"][0] > 0
    # A remote expert the plan sends tokens to was invoked within the driver's executions.
    used = [
        f"layer{la.layer:02d}/expert{e.expert:02d}"
        for la in plan.layers
        for e in la.experts
        if e.tokens > 0
    ]
    assert used and all(durations[f][-1] > 0 for f in used), (used, durations)


def test_the_function_that_ends_a_request_follows_the_shape() -> None:
    """The tail in the fan-out workflow, the driver in a driver or one-function plan: read from
    the simulator's functions (stages, and who waits on the later ones), not from a name."""
    from planner import load_calibration
    from planner.build import instance_for
    from planner.deployments import plan_driver_shape
    from planner.traffic.workflow import workflow_model
    from runtime.traffic_replay import _end_function
    from tests.traffic.plans import counts_of, tiny_manifest, tiny_plan

    manifest, cal = tiny_manifest(), load_calibration()
    base = instance_for(manifest, counts_of(2, 4, 2048), cal, tokens=2048)
    plans = {
        shape: plan_driver_shape(shape, base, manifest, cal, None, {"test": True})[0]
        for shape in ("monolithic", "driver")
    }
    plans["workflow"] = tiny_plan(method="direct", tokens=2048)
    ends = {s: _end_function(workflow_model(p, 2048).functions) for s, p in plans.items()}
    assert ends == {"monolithic": "driver", "driver": "driver", "workflow": "tail"}
    functions = workflow_model(plans["driver"], 2048).functions
    assert np.flatnonzero(functions.waits_on_later_stages).tolist() == [0]
