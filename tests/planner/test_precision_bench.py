"""The planner's decode model at a precision, as `bench precision` holds it to the measured
TPOT: the same model, the floor scaled by the stack's `weights_speed`."""

from __future__ import annotations

from pathlib import Path

import pytest

from ground.precision import parse_weights
from moe import MoEModel, at_precision, describe_model
from planner.calibration import WeightsSpeed, load_calibration
from planner.precision_bench import predicted_tpot
from tests.moe.test_stages import _tiny_llama


@pytest.fixture(scope="module")
def llama(tiny_dirs: dict[str, Path]) -> MoEModel:
    return _tiny_llama(tiny_dirs, experts=4, top_k=2)


def test_the_predicted_tpot_scales_the_floor_by_the_stacks_precision(llama: MoEModel) -> None:
    base = load_calibration(None)
    cal = base.model_copy(
        update={"weights_speed": {"int8": WeightsSpeed(compute=1.0, decode_floor=0.5)}}
    )
    floor = float(base.required("decode_layer_floor_s", "the test"))
    full = describe_model(llama)
    int8 = describe_model(at_precision(llama, parse_weights("int8")))
    for sequences in (1, 8):
        fp32_s, memory = predicted_tpot(full, cal, sequences)
        int8_s, same = predicted_tpot(int8, cal, sequences)
        assert memory == same and cal.vcpus_at(memory) == pytest.approx(1.0, abs=0.1)
        # (the int8 files' scales count as a few more weights of compute: under 1 %)
        assert fp32_s - int8_s == pytest.approx(0.5 * llama.num_layers * floor, rel=1e-2)
    faster = cal.model_copy(
        update={"weights_speed": {"int8": WeightsSpeed(compute=0.5, decode_floor=0.5)}}
    )
    assert predicted_tpot(int8, faster, 8)[0] < predicted_tpot(int8, cal, 8)[0]
