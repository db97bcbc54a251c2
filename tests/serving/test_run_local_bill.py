"""What `run-local`'s metered bill says: requests exactly the plan's, GB-seconds this machine's
(not Lambda's), and each function's measured over predicted seconds. No run: the summary's
parts are built from numbers of the demo's kind (`make demo`: 14 requests, 98.8 GB-s metered
against 49.2 planned)."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from ground.semantics import USAGE_KEYS
from moelambda.cli import _render_local
from runtime.local import _predicted_vs_measured, metering


def _usage(**values: float) -> dict[str, float]:
    return dict.fromkeys(USAGE_KEYS, 0) | values


PLANNED = _usage(
    lambda_requests=14, s3_put=26, s3_get=26, s3_list=7, s3_delete=1, transitions=26,
    gb_s=49.235, experts_gb_s=14.018,
)  # fmt: skip
BILL = {"planned": {"total_usd": 0.001045}, "metered": {"total_usd": 0.001920}}


@pytest.fixture
def compared() -> dict[str, Any]:
    predicted = {"head": 0.271, "layer00": 1.948, "layer00/expert00": 3.115, "tail": 1.838}
    measured = {"head": [0.627], "layer00": [4.0, 6.0], "layer00/expert00": [9.345], "idle": [1.0]}
    runs = [{"seconds": 78.2}]
    return _predicted_vs_measured(predicted, 39.07, measured, runs)


def test_every_function_gets_its_measured_over_predicted_seconds(compared: dict) -> None:
    functions = compared["functions"]
    assert functions["head"]["measured_over_predicted"] == pytest.approx(0.627 / 0.271, abs=1e-3)
    assert functions["layer00"]["measured_over_predicted"] == pytest.approx(5.0 / 1.948, abs=1e-3)
    assert functions["layer00/expert00"]["measured_over_predicted"] == pytest.approx(3.0)
    # Nothing to divide: a function not called, or not predicted.
    assert functions["tail"]["measured_over_predicted"] is None
    assert functions["idle"]["measured_over_predicted"] is None
    assert compared["request"]["measured_over_predicted"] == pytest.approx(78.2 / 39.07, abs=1e-3)


def test_requests_are_exact_and_gb_seconds_are_this_machines(compared: dict) -> None:
    metered = PLANNED | {"gb_s": 98.8, "experts_gb_s": 30.1}
    block = metering(metered, PLANNED, BILL, compared)
    assert block["requests_equal_planned"] and block["requests_differing"] == {}
    assert block["gb_s"] == {
        "measured_here": 98.8,
        "predicted_lambda": 49.235,
        "measured_over_predicted": pytest.approx(98.8 / 49.235, abs=1e-3),
    }
    assert set(block["measured_over_predicted_s"]) == {"head", "layer00", "layer00/expert00"}
    requests, seconds, bill = block["lines"]
    assert requests.startswith("requests metered = planned (exact): 14 Lambda requests")
    assert "60 S3 requests, 26 state transitions" in requests
    assert "GB-seconds measured on this machine 98.8 against 49.2 predicted for Lambda" in seconds
    assert "(2.01 x)" in seconds and "not Lambda's" in seconds
    assert "measured over predicted seconds per function" in seconds
    assert "$0.001045 planned, $0.001920 metered with this machine's seconds" in bill


def test_a_request_off_the_plan_is_named(compared: dict) -> None:
    metered = PLANNED | {"s3_get": 25, "s3_get_poll": 3, "gb_s": 98.8}
    block = metering(metered, PLANNED, BILL, compared)
    assert not block["requests_equal_planned"]
    assert block["requests_differing"] == {"s3_get": {"metered": 25, "planned": 26}}
    assert block["lines"][0].startswith("requests metered != planned: s3_get 25 against 26")
    assert "S3 polls, which depend on timing: 3, planned 0" in block["lines"][0]


def test_the_renderer_prints_the_ratios_and_the_wording(compared: dict) -> None:
    metered = PLANNED | {"gb_s": 98.8}
    summary = {
        "predicted_vs_measured": compared,
        "metering": metering(metered, PLANNED, BILL, compared),
    }
    console = Console(record=True, width=200)
    console.print(_render_local.seconds_table(summary))
    _render_local.metering(console, summary)
    text = console.export_text()
    assert "measured / predicted" in text and "3.00 x" in text
    assert "requests metered = planned (exact)" in text
    assert "GB-seconds measured on this machine" in text and "predicted for Lambda" in text
    _render_local.metering(console, {"metering": None})  # an unmetered run: nothing to say
