"""`moelambda calibrate` as a call: time the reference expert on this machine and write U_j.

The planner's compute model needs U_j, the seconds per token of one expert at each Lambda
memory size; this machine's measurement (1 and 2 threads, scaled by the CPU share each memory
option gets) is the best stand-in the planner has until it is measured on Lambda itself.

Example::

    from pathlib import Path
    from planner.calibrate import calibrate_compute
    from planner import default_calibration_path

    summary = calibrate_compute(default_calibration_path(), Path("my-calibration.json"))
    print(summary["t1_s_per_token"], summary["background_cpus"])
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date
from pathlib import Path
from typing import Any

from ground.errors import UsageError

__all__ = ["BUSY_CPUS", "calibrate_compute", "calibrate_weights", "check_calibrate"]

BUSY_CPUS = 0.25  # other processes' CPU use above which the timings are flagged as inflated


def check_calibrate(tokens: int, repeats: int, out: Path) -> None:
    """Fail on bad arguments before loading the model or timing anything."""
    if tokens < 1:
        raise UsageError(
            f"--tokens {tokens} is not a batch size.", "pass --tokens 1 or more (default 1024)."
        )
    if repeats < 1:
        raise UsageError(f"--repeats {repeats} times nothing.", "pass --repeats 1 or more.")
    if out.is_dir():
        raise UsageError(f"--out '{out}' is a directory.", "pass a calibration file name.")


def calibrate_compute(
    source: Path,
    target: Path,
    *,
    tokens: int = 1024,
    repeats: int = 50,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time the reference expert, write U_j and the reference into `target` (from `source`),
    and return what was measured and written.

    Args:
        source: The calibration file to start from.
        target: Where to write the updated calibration (may be `source`).
        tokens: Tokens per timed expert call.
        repeats: Timed calls per thread count (the median is kept).
        progress: Called with a short status line as the work goes on.

    Returns:
        The summary `moelambda calibrate --json` prints; `background_cpus` above `BUSY_CPUS`
        means other processes inflated the timings.
    """
    from planner import compute, load_calibration

    check_calibrate(tokens, repeats, target)
    start = load_calibration(source)
    document = compute.read_document(source)
    stage = compute.reference_expert(progress=progress)
    before = compute.cpu_times()
    timing = compute.measure_expert(stage, tokens, repeats, progress=progress)
    busy = compute.background_cpus(before, compute.cpu_times())
    reference = compute.expert_reference(stage, timing)
    compute_s = compute.token_compute_s(start, timing.t1_s_per_token, timing.threads_efficiency)
    written = compute.write_calibration(
        compute.calibrated_document(document, compute_s, reference, date.today()), target
    )
    return {
        "file": str(target),
        "batch_tokens": timing.batch_tokens,
        "repeats": repeats,
        "hidden": reference.hidden,
        "width": reference.width,
        "flops_per_token": reference.flops_per_token,
        "t1_s_per_token": timing.t1_s_per_token,
        "t2_s_per_token": timing.t2_s_per_token,
        "threads_efficiency": timing.threads_efficiency,
        "cpu_model": reference.cpu_model,
        "torch_version": reference.torch_version,
        "background_cpus": busy,
        "options": [
            {"memory_mb": m, "vcpus": written.vcpus_at(m), "expert_token_compute_s": u}
            for m, u in zip(written.memory_options_mb, written.expert_token_compute_s, strict=True)
        ],
    }


def calibrate_weights(
    source: Path,
    target: Path,
    *,
    repeats: int = 5,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure each weight precision's speed against float32 on this machine
    (`planner.precision_bench`) and write it into `target` (from `source`) as `weights_speed`:
    per precision the `compute` ratio (U_j's scale) and the `decode_floor` ratio
    (`decode_layer_floor_s`'s scale). Returns the bench report, with the file written."""
    import copy

    import torch

    from planner import compute
    from planner.precision_bench import CALIBRATION_PROMPTS, bench_precision

    if repeats < 1:
        raise UsageError(f"--repeats {repeats} times nothing.", "pass --repeats 1 or more.")
    if target.is_dir():
        raise UsageError(f"--out '{target}' is a directory.", "pass a calibration file name.")
    document = compute.read_document(source)
    if "weights_speed" not in document["parameters"]:
        raise UsageError(
            f"{source} has no weights_speed entry to fill in.",
            "start from the packaged calibration (leave --calibration out) or one written by "
            "this version of moelambda.",
        )
    report = bench_precision(repeats=repeats, prompts=CALIBRATION_PROMPTS, progress=progress)
    speeds = {
        key: {
            "compute": row["speed_vs_fp32"]["compute"],
            "decode_floor": row["speed_vs_fp32"]["decode_floor"],
        }
        for key, row in report["rows"].items()
        if key in ("bf16", "int8")  # this CPU's kernels; fp32 is the unit
    }
    updated = copy.deepcopy(document)
    updated["parameters"]["weights_speed"] |= {
        "value": compute._rounded(speeds),
        "source": (
            f"measured by `moelambda calibrate --weights` ({repeats} interleaved rounds, one "
            f"torch thread) on {compute.cpu_model()}, torch "
            f"{torch.__version__}: the reference expert on 1,024 tokens (compute) and the "
            "SmolLM2 MoE (E8 k4 + correction) decoding one sequence (decode_floor)"
        ),
        "source_kind": "measured",
        "as_of": date.today().isoformat(),
    }
    compute.write_calibration(updated, target)
    report["file"] = str(target)
    report["weights_speed"] = speeds
    return report
