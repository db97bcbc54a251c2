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

__all__ = [
    "BUSY_CPUS",
    "DECODE_BATCHES",
    "calibrate_compute",
    "calibrate_decode_table",
    "calibrate_weights",
    "check_calibrate",
]

BUSY_CPUS = 0.25  # other processes' CPU use above which the timings are flagged as inflated
DECODE_BATCHES = (1, 2, 4, 8, 16)  # sequences per timed decode step; planner.stream interpolates
DECODE_CONTEXT = (
    512  # tokens of context per sequence (the Azure conversation trace's mean is 1,155)
)
DECODE_STEPS = 12  # decode steps timed per batch and round (the median step is kept)


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


def calibrate_decode_table(
    source: Path,
    target: Path,
    *,
    batches: tuple[int, ...] = DECODE_BATCHES,
    context_tokens: int = DECODE_CONTEXT,
    repeats: int = 2,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure the decode step of the SmolLM2 MoE (E8 k4 + correction, the cached model
    `planner.precision_bench.DECODE_MODEL`) at each batch size, on one torch thread (a
    1,769 MB function's one vCPU), and write it into `target` (from `source`) as
    `decode_step_table[<planner.stream.decode_table_key>]` (other models' tables are kept).

    Each batch decodes `DECODE_STEPS` steps after a prefill of `context_tokens` tokens of
    Wikipedia text per sequence (different windows: a repeated prompt would route its rows
    alike), end-of-sequence ignored so every sequence stays in the batch; the step is the median
    gap between steps, the median over `repeats` rounds (batches interleaved per round). Gaps
    are the thread's CPU seconds (`time.thread_time`), not wall time: on one thread they are the
    step's compute, which other processes on a shared machine do not inflate by preempting it.

    Each round also decodes every batch on two threads, right after one, and keeps the ratio of
    their median wall-time steps (`two_thread_ratio`, the median over rounds): how much a
    second vCPU shortens a step, from which the planner takes Amdahl's serial share. This needs
    two idle cores; on a busy machine the ratio reads high (a plan then buys fewer vCPUs than
    it could use, never more).

    Raises:
        UsageError: `repeats` below one, `target` a directory, or fewer than two CPUs.

    Returns:
        What was measured: batches, step seconds, tokens per second, the file written.
    """
    import copy
    import itertools
    import os
    import statistics
    import time

    import torch

    from moe import describe_model, generate_tokens, load_corpus, load_model, make_windows
    from moe._generate import GenerationConfig
    from planner import compute
    from planner.precision_bench import DECODE_MODEL, _options
    from planner.stream import decode_table_key

    if repeats < 1:
        raise UsageError(f"--repeats {repeats} times nothing.", "pass --repeats 1 or more.")
    if target.is_dir():
        raise UsageError(f"--out '{target}' is a directory.", "pass a calibration file name.")
    if len(os.sched_getaffinity(0)) < 2:
        raise UsageError(
            "--decode-table times a decode step on one thread and on two, and this process "
            "may use one CPU.",
            "run it on a machine (or taskset) with two idle CPUs.",
        )
    say = progress or (lambda _message: None)
    document = compute.read_document(source)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        name, experts, top_k = DECODE_MODEL
        say("loading the SmolLM2 MoE (MoEfied and cached on first use)")
        model = load_model(name, options=_options(name, experts, top_k), progress=say)
        windows = make_windows(
            load_corpus("wiki"),
            model.tokenizer,
            tokens=max(batches) * context_tokens,
            window=context_tokens,
            seed=0,
        )
        config = GenerationConfig(max_new_tokens=DECODE_STEPS + 1)
        samples: dict[int, list[float]] = {b: [] for b in batches}
        ratios: dict[int, list[float]] = {b: [] for b in batches}

        def median_step(prompts: list[list[int]], clock: Callable[[], float]) -> float:
            stamps: list[float] = []
            generate_tokens(
                model.stages(),
                model.num_layers,
                prompts,
                model.expert_call(),
                config,
                pad_id=0,
                on_step=lambda step: stamps.append(clock()),
            )
            return statistics.median(b - a for a, b in itertools.pairwise(stamps))

        for round_ in range(repeats):
            for b in batches:
                say(f"round {round_ + 1}/{repeats}: {b} sequences")
                prompts = [list(map(int, w)) for w in windows[:b]]
                torch.set_num_threads(1)
                samples[b].append(median_step(prompts, time.thread_time))
                one = median_step(prompts, time.perf_counter)
                torch.set_num_threads(2)
                ratios[b].append(median_step(prompts, time.perf_counter) / one)
    finally:
        torch.set_num_threads(threads)
    steps = [statistics.median(samples[b]) for b in batches]
    two_threads = [statistics.median(ratios[b]) for b in batches]
    key = decode_table_key(describe_model(model))
    table = {
        "batches": list(batches),
        "step_s": steps,
        "two_thread_ratio": two_threads,
        "memory_mb": float(document["parameters"]["mb_per_vcpu"]["value"]),
        "context_tokens": context_tokens,
        "repeats": repeats,
        "torch_version": torch.__version__,
        "cpu_model": compute.cpu_model(),
    }
    updated = copy.deepcopy(document)
    entry = updated["parameters"].get("decode_step_table") or {"value": {}}
    entry |= {
        "value": (entry.get("value") or {}) | {key: compute._rounded(table)},
        "unit": "s per decode step of `batches[i]` sequences (step_s[i]) on one torch thread",
        "source": (
            f"measured by `moelambda calibrate --decode-table` ({repeats} interleaved rounds, "
            f"one torch thread, {DECODE_STEPS} steps each, median of the thread's CPU seconds; "
            f"two_thread_ratio: two threads' median wall-time step over one's, median of rounds) "
            f"on {compute.cpu_model()}, "
            f"torch {torch.__version__}: the SmolLM2 MoE (E8 k4 + correction), each sequence "
            f"{context_tokens} tokens of Wikipedia context"
        ),
        "source_kind": "measured",
        "command": "moelambda calibrate --decode-table",
        "as_of": date.today().isoformat(),
        "note": (
            "planner.stream: a worker's decode step of b sequences, interpolated between the "
            "batches; below one vCPU it takes longer by the CPU share, above it by Amdahl's "
            "law with the serial share 2 x two_thread_ratio - 1 (DecodeStepTable"
            ".serial_fraction); used for a plan of that model and weights with no remote "
            "expert, else the step is modelled. Measured on the development machine's CPU, not "
            "on Lambda's."
        ),
    }
    updated["parameters"]["decode_step_table"] = entry
    compute.write_calibration(updated, target)
    return {
        "file": str(target),
        "model": key,
        "batches": list(batches),
        "step_s": steps,
        "two_thread_ratio": two_threads,
        "tokens_per_s": [b / s for b, s in zip(batches, steps, strict=True)],
        "samples_s": {str(b): v for b, v in samples.items()},
        "context_tokens": context_tokens,
        "repeats": repeats,
    }
