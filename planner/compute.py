"""U_j: the seconds one expert spends on one token at each Lambda memory size.

The time is measured, not assumed: `measure_expert` runs the serving path's own expert stage
(`moe.ExpertStage`, i.e. `moe.expert_ffn`) with torch on this machine, on one thread (t1) and on
two (t2), and `token_compute_s` turns the two into U_j with Lambda's CPU share at each memory
option. The result and the expert it was timed on are written into the calibration file, so that
every later planning step reads U_j from there and can scale it to experts of other sizes with
`expert_compute_s`.
"""

from __future__ import annotations

import copy
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ground.errors import CalibrationError
from ground.files import write_file_atomically
from planner.calibration import Calibration, ExpertComputeReference, load_calibration

if TYPE_CHECKING:  # torch and the model load only to measure, not to plan with the result
    import torch

    from moe import ExpertStage

__all__ = [
    "REFERENCE_MODEL",
    "CpuTimes",
    "ExpertTiming",
    "background_cpus",
    "calibrated_document",
    "cpu_model",
    "cpu_times",
    "compute_s_at",
    "dump_document",
    "expert_compute_s",
    "expert_reference",
    "ffn_flops_per_token",
    "flops_per_token",
    "measure_expert",
    "parallel_efficiency",
    "read_document",
    "reference_expert",
    "token_compute_s",
    "write_calibration",
]

REFERENCE_MODEL = "minilm"  # MoEfied as the CLI's default: 4 experts, top-2, seed 0
THREAD_COUNTS = (1, 2)  # t1 and t2
WARMUP_CALLS = 3  # untimed calls first: torch allocates buffers and spins up its thread pool
MIN_LOAD_WINDOW_S = 0.5  # shortest wall time over which /proc/stat's ticks measure a load
SIGNIFICANT_DIGITS = 4  # timings on a shared machine vary by a few percent; more digits are noise

Progress = Callable[[str], None]


@dataclass(frozen=True)
class ExpertTiming:
    """Median seconds per token of one expert on one and on two threads, at one batch size."""

    t1_s_per_token: float
    t2_s_per_token: float
    batch_tokens: int

    @property
    def threads_efficiency(self) -> float:
        return parallel_efficiency(self.t1_s_per_token, self.t2_s_per_token)


def reference_expert(progress: Progress | None = None) -> ExpertStage:
    """Expert 0 of layer 0 of the default model (MiniLM, 4 experts, top-2), as a function runs it.

    All experts of a MoEfied layer have the same shape, so any one times the same computation.
    """
    from moe import ExpertStage, load_model

    model = load_model(REFERENCE_MODEL, experts=4, top_k=2, seed=0, progress=progress)
    bank = model.banks[0]
    return ExpertStage(bank.expert_tensors(0), bank.kind, bank.act)


def ffn_flops_per_token(hidden: int, width: int, kind: str) -> int:
    """FLOPs one token costs in an expert of `hidden` inputs and `width` intermediate units.

    Each multiply-add of a matmul counts 2 FLOPs: an "mlp" expert has two (h x w) matmuls, a
    "glu" expert three (gate, up, down). Element-wise work counts one FLOP per element: bias add
    and activation for "mlp", activation and gating product for "glu". The element-wise part is
    under 1% of the total for h >= 128, so how exactly GELU or SiLU is counted does not matter.
    """
    matmuls = 3 if kind == "glu" else 2
    return 2 * hidden * width * matmuls + 2 * width


def flops_per_token(weight_bytes: float, dtype_bytes: int) -> float:
    """FLOPs per token of a matmul-dominated stage of `weight_bytes`: two per weight (one
    multiply-add), as `ffn_flops_per_token` counts an expert's matmuls."""
    return 2.0 * weight_bytes / dtype_bytes


def parallel_efficiency(t1: float, t2: float) -> float:
    """t1 / (2 t2), clipped to (0, 1]: 1 means a second thread halves the time.

    Cache effects can make two threads slightly more than twice as fast; the clip keeps U_j from
    crediting Lambda's extra vCPUs with more than one core each.
    """
    return min(t1 / (2 * t2), 1.0)


def _timed_call(stage: ExpertStage, x: torch.Tensor, threads: int) -> float:
    """Wall time of one expert call on `threads` torch threads."""
    import torch

    torch.set_num_threads(threads)
    start = time.perf_counter()
    stage.run(x)
    return time.perf_counter() - start


def measure_expert(
    stage: ExpertStage, tokens: int, repeats: int, progress: Progress | None = None
) -> ExpertTiming:
    """Median time per token of `stage` on a (tokens, hidden) batch, on one and on two threads.

    The thread counts alternate call by call rather than run one after the other: the machine's
    speed drifts (other tenants, clock), and alternating makes the drift hit t1 and t2 alike
    instead of skewing their ratio, the parallel efficiency. The median ignores the odd
    preempted call. The input is seeded random data, since the FFN's time does not depend on the
    values, and torch's thread count is restored afterwards, whatever happens.
    """
    import torch

    say = progress or (lambda _msg: None)
    x = torch.randn(tokens, stage.w_in.shape[-1], generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    times: dict[int, list[float]] = {n: [] for n in THREAD_COUNTS}
    try:
        say(f"warming up the expert on {tokens} tokens")
        for n in THREAD_COUNTS:
            for _ in range(WARMUP_CALLS):
                _timed_call(stage, x, n)
        say(f"timing the expert on 1 and 2 threads, {repeats} calls each of {tokens} tokens")
        for _ in range(repeats):
            for n in THREAD_COUNTS:
                times[n].append(_timed_call(stage, x, n))
    finally:
        torch.set_num_threads(threads)
    t1, t2 = (statistics.median(times[n]) / tokens for n in THREAD_COUNTS)
    return ExpertTiming(t1, t2, tokens)


def expert_reference(stage: ExpertStage, timing: ExpertTiming) -> ExpertComputeReference:
    """The calibration entry that says which expert, machine and torch `timing` belongs to."""
    import torch

    hidden, width = int(stage.w_in.shape[-1]), int(stage.w_out.shape[-1])
    return ExpertComputeReference(
        hidden=hidden,
        width=width,
        flops_per_token=ffn_flops_per_token(hidden, width, stage.kind),
        threads_efficiency=timing.threads_efficiency,
        t1_s_per_token=timing.t1_s_per_token,
        batch_tokens=timing.batch_tokens,
        torch_version=torch.__version__,
        cpu_model=cpu_model(),
    )


def token_compute_s(calibration: Calibration, t1: float, efficiency: float) -> np.ndarray:
    """U_j for every memory option, from the one-thread time `t1` and the thread efficiency.

    Lambda enforces its CPU share as a quota of CPU time shared by all of a function's threads
    (v = `vcpus_at(M_j)` CPU-seconds per second), and a parallel run spends t1 / efficiency
    CPU-seconds per token (2 t2 on two threads). Hence:

    * v <= 1: one thread is best and runs v of the time, so U_j = t1 / v.
    * v > 1: one thread gets a whole core (t1); threads on all cores use the whole quota but
      waste (1 - efficiency) of it, t1 / (v * efficiency). U_j is the faster of the two, so a
      second vCPU only pays once v * efficiency > 1, and U_j at v = 2 equals the measured t2.

    The efficiency is measured with two threads and assumed to hold for Lambda's up to six
    cores; the planner's memory options stay below 2 vCPUs, where it is measured, not assumed.
    """
    vcpus = np.array([calibration.vcpus_at(m) for m in calibration.memory_options_mb])
    usable = np.maximum(np.minimum(vcpus, 1.0), vcpus * efficiency)
    return t1 / usable


def expert_compute_s(calibration: Calibration, flops_per_token: float) -> np.ndarray:
    """U_j for an expert of `flops_per_token`, scaled from the expert the calibration measured.

    The scaling is linear in FLOPs: it assumes the matmuls run at the same FLOP rate whatever
    the expert's shape. That holds for experts of similar size at batches of hundreds of tokens;
    an expert much larger than the reference can fall out of cache and run slower, one much
    smaller is dominated by per-call overhead, so re-run `moelambda calibrate` on the model you
    serve when its experts differ by more than a few times.

    Raises:
        CalibrationError: If the calibration holds no measured U_j or no reference expert.
    """
    reference = calibration.expert_compute_reference
    times = calibration.expert_token_compute_s
    if reference is None or times is None:
        where = calibration.source_path or "the calibration file"
        raise CalibrationError(
            f"{where} holds no measured expert compute time (expert_token_compute_s and "
            "expert_compute_reference are null).",
            f"run `moelambda calibrate --calibration {where}` to measure them.",
        )
    return np.asarray(times) * (flops_per_token / reference.flops_per_token)


def compute_s_at(
    calibration: Calibration, flops_per_token: float, memory_mb: float | np.ndarray
) -> float | np.ndarray:
    """Seconds per token of `flops_per_token` on a function of `memory_mb`, any size.

    `expert_compute_s` reads U_j at the calibration's memory options; a driver or a
    monolithic function may have any memory up to Lambda's largest. This applies the same
    rule as `token_compute_s` (the one-thread time of the reference expert, scaled by FLOPs,
    over the CPU share the memory buys, parallel efficiency above one vCPU) at `memory_mb`.

    Raises:
        CalibrationError: If the calibration holds no measured reference expert.
    """
    reference = calibration.expert_compute_reference
    if reference is None:
        expert_compute_s(calibration, flops_per_token)  # raises, naming the fix
        raise AssertionError("unreachable")
    vcpus = np.minimum(
        np.asarray(memory_mb, dtype=float) / calibration.mb_per_vcpu, calibration.max_vcpus
    )
    usable = np.maximum(np.minimum(vcpus, 1.0), vcpus * reference.threads_efficiency)
    seconds = reference.t1_s_per_token * (flops_per_token / reference.flops_per_token) / usable
    return float(seconds) if np.ndim(seconds) == 0 else seconds


def cpu_model() -> str:
    """The CPU's name as /proc/cpuinfo gives it, or what `platform` knows off Linux."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


class CpuTimes(NamedTuple):
    """CPU seconds since boot: all processes busy, all cores elapsed, and this process alone."""

    busy_s: float
    total_s: float
    own_s: float


def cpu_times() -> CpuTimes | None:
    """A snapshot for `background_cpus`, or None where /proc/stat does not exist."""
    try:
        with open("/proc/stat", encoding="utf-8") as stat:
            # user nice system idle iowait irq softirq steal; guest time is already in user.
            ticks = [int(t) for t in stat.readline().split()[1:9]]
    except OSError:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    own = os.times()
    busy = sum(ticks) - ticks[3] - ticks[4]
    return CpuTimes(busy / hz, sum(ticks) / hz, own.user + own.system)


def background_cpus(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """How many CPUs other processes kept busy between two snapshots (None if unknown).

    Timings on a machine shared with other work come out too slow, the two-thread one most (a
    thread that loses its core stalls the other at every synchronisation), so callers warn when
    this is not near 0. /proc/stat counts in 10-ms ticks, so a window shorter than
    `MIN_LOAD_WINDOW_S` cannot tell and gives None.
    """
    if before is None or after is None:
        return None
    cores = os.cpu_count() or 1
    elapsed = after.total_s - before.total_s
    if elapsed < MIN_LOAD_WINDOW_S * cores:
        return None
    others = (after.busy_s - before.busy_s) - (after.own_s - before.own_s)
    return max(others, 0.0) / elapsed * cores


def read_document(path: Path) -> dict[str, Any]:
    """The calibration file as JSON, decimals kept as written (0.0000002 stays 0.0000002)."""
    return json.loads(path.read_text(encoding="utf-8"), parse_float=Decimal)


def _rounded(value: Any) -> Any:
    """Floats to `SIGNIFICANT_DIGITS` significant digits, as decimals, recursively."""
    if isinstance(value, float):
        return Decimal(f"{value:.{SIGNIFICANT_DIGITS}g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def calibrated_document(
    document: dict[str, Any],
    compute_s: np.ndarray,
    reference: ExpertComputeReference,
    today: date,
) -> dict[str, Any]:
    """A copy of the calibration `document` with U_j and its reference expert filled in.

    Only `value`, `source`, `source_kind` ("measured") and `as_of` of
    `expert_token_compute_s` and `expert_compute_reference` change; units, notes and every
    other parameter stay as they are.
    """
    updated = copy.deepcopy(document)
    source = (
        f"measured by `moelambda calibrate` on {reference.cpu_model}, "
        f"torch {reference.torch_version}"
    )
    values = {
        "expert_token_compute_s": compute_s.tolist(),
        "expert_compute_reference": reference.model_dump(),
    }
    for name, value in values.items():
        updated["parameters"][name] |= {
            "value": _rounded(value),
            "source": source,
            "source_kind": "measured",
            "as_of": today.isoformat(),
        }
    return updated


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | Decimal)


def dump_document(value: Any, level: int = 0) -> str:
    """JSON in the calibration file's layout, so a rewrite changes only the lines it updates.

    Containers of numbers stay on one line (the memory options, one architecture's prices);
    everything else takes one line per item, indented by two spaces. Decimals print as written.
    """
    if isinstance(value, Decimal):
        return format(value, "f")
    if not isinstance(value, dict | list):
        return json.dumps(value)
    items = value.values() if isinstance(value, dict) else value
    parts = [dump_document(item, level + 1) for item in items]
    if isinstance(value, dict):
        parts = [f"{json.dumps(key)}: {part}" for key, part in zip(value, parts, strict=True)]
    start, end = "{}" if isinstance(value, dict) else "[]"
    if all(_is_scalar(item) for item in items):
        return start + ", ".join(parts) + end
    inner, outer = "  " * (level + 1), "  " * level
    return f"{start}\n{inner}" + f",\n{inner}".join(parts) + f"\n{outer}{end}"


def write_calibration(document: dict[str, Any], path: Path) -> Calibration:
    """Write `document` to `path` atomically, after checking that it loads as a calibration.

    The text goes to a temporary sibling first and is validated there, so an invalid document or
    an interrupted write leaves the file at `path` as it was.

    Returns:
        The calibration as loaded back from the new file.
    """
    loaded: list[Calibration] = []

    def write(tmp: Path) -> None:
        tmp.write_text(dump_document(document) + "\n", encoding="utf-8")
        loaded.append(load_calibration(tmp))

    write_file_atomically(path, write, force=True)
    return loaded[0].model_copy(update={"source_path": path})
