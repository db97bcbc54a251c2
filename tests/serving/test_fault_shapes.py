"""Which faults each shape can take (issue 52): expert-crash needs an expert function, which the
fan-out workflow and a driver's remote experts have and a one-function plan does not; the
other faults apply to every shape. `Faults.check_plan` refuses the one that cannot apply
(`run-local` calls it before loading anything: tests/test_bad_inputs.py)."""

from __future__ import annotations

import pytest

from ground.errors import UsageError
from pipeline.faults import Faults
from planner import load_calibration
from planner.build import instance_for
from planner.deployments import plan_driver_shape
from tests.traffic.plans import counts_of, tiny_manifest, tiny_plan


def test_expert_crash_applies_to_expert_functions_only() -> None:
    manifest, cal = tiny_manifest(), load_calibration()
    base = instance_for(manifest, counts_of(2, 4, 2048), cal, tokens=2048)
    one, driver = (
        plan_driver_shape(shape, base, manifest, cal, None, {"test": True})[0]
        for shape in ("monolithic", "driver")
    )
    workflow = tiny_plan(method="direct", tokens=2048)
    crash = Faults.parse("expert-crash=0.5")
    for plan in (driver, workflow):  # its remote experts, its expert functions
        crash.check_plan(plan)
    with pytest.raises(UsageError, match="monolithic plan has no expert function") as refused:
        crash.check_plan(one)
    assert "--deployment driver" in (refused.value.fix or "")
    # Every other fault, and expert-crash at rate 0, apply to one function too.
    Faults.parse("throttle=0.1,s3-slowdown=0.1,duplicate=0.1,expert-crash=0").check_plan(one)


def test_an_unknown_fault_is_not_called_a_malformed_item() -> None:
    with pytest.raises(UsageError, match="unknown fault 'crash'") as unknown:
        Faults.parse("crash=0.1")
    assert "throttle, s3-slowdown, expert-crash, duplicate" in str(unknown.value)
    with pytest.raises(UsageError, match="not a fault=rate item"):
        Faults.parse("throttle")
