"""The hardware a function runs on: one vocabulary, one registry line per kind.

A deployment's functions each run on one hardware kind; a candidate that uses several (a GPU
driver calling CPU expert functions) is named by its kinds joined with "+" (`candidate_name`:
"gpu+cpu"), so the kinds are the only words there are. Each kind says whether a plan on it can
run today: a kind that cannot is priced and reported, never chosen (`runnable`, `why_not`),
and so is a candidate whose weights' precision (`ground.precision`) one of its kinds does not
compute: bf16 on CPU Lambda, whose CPUs are not known to have bfloat16 instructions (the
calibration's `lambda_cpu_bf16`), and int8 on a GPU, for which no kernel runs here (its kernel
is a CPU one).

    cpu   CPU Lambda functions (the handlers in functions/, the image Dockerfile.expert)
    gpu   GPU-backed Lambda functions on Managed Instances (`planner.hardware.gpu_model`:
          sizes, speeds from the GPU catalogue `planner.hardware.catalogue`, prices): the same
          handlers from the same Dockerfile built with CUDA torch, their stages placed on the
          device at bfloat16 (`ground.placement`). Of its shapes, a GPU function holding the
          model and a GPU driver with CPU experts deploy; expert groups and layer stages have
          no handler, so a candidate using them is priced, reported and never chosen
          (`HardwarePlan.detail["deployable"]`).

Adding a kind (another accelerator) is its module beside gpu_model and one line in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ground.errors import UsageError

if TYPE_CHECKING:
    from ground.precision import Precision, Weights
    from planner.calibration import Calibration

__all__ = [
    "AUTO",
    "CHOICES",
    "KINDS",
    "HardwareKind",
    "candidate_name",
    "check_hardware",
    "kinds_of",
    "refuses",
    "runnable",
    "why_not",
]


@dataclass(frozen=True)
class HardwareKind:
    """One hardware kind: its name, what it is, and why a plan on it cannot run yet (None:
    its handlers run, so the planner may choose it)."""

    name: str
    label: str
    not_runnable: str | None = None


KINDS: dict[str, HardwareKind] = {
    "cpu": HardwareKind("cpu", "CPU Lambda"),
    "gpu": HardwareKind("gpu", "GPU-backed Lambda on Managed Instances"),
}
AUTO = "auto"  # every kind weighed; the cheapest runnable candidate chosen
CHOICES = (*KINDS, AUTO)


def check_hardware(value: str, *, flag: str = "--hardware") -> str:
    """`value` if it is a kind or auto.

    Raises:
        UsageError: It is neither; names the choices.
    """
    if value not in CHOICES:
        named = f"{', '.join(CHOICES[:-1])} or {CHOICES[-1]}"
        raise UsageError(f"{flag} {value!r} is not {named}.", "pass one of them.")
    return value


def candidate_name(kinds: Iterable[str]) -> str:
    """The name of a candidate whose functions run on `kinds` ("gpu", "gpu+cpu"), in the
    registry's order reversed (the driver's kind first)."""
    used = set(kinds)
    unknown = used - KINDS.keys()
    if unknown or not used:
        raise ValueError(f"unknown hardware kinds {sorted(unknown)}")
    return "+".join(k for k in reversed(KINDS) if k in used)


def kinds_of(name: str) -> list[str]:
    """The kinds a candidate's name spells."""
    kinds = name.split("+")
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"{name!r} names no hardware kinds")
    return kinds


def refuses(kind: str, precision: Precision, calibration: Calibration, arch: str) -> str | None:
    """Why functions of `kind` on `arch` cannot compute weights of `precision` (None: they
    can): bf16 on CPUs without bfloat16 instructions (`Calibration.cpu_refuses`), int8 on a
    GPU (int8's kernels are torch's CPU ones, `moe._int8`; a GPU function runs bf16,
    `ground.placement.GPU`)."""
    if kind == "cpu":
        return calibration.cpu_refuses(precision, arch)
    if kind == "gpu" and precision == "int8":
        return (
            "GPU-backed functions have no int8 kernel (int8 runs on CPUs: moe._int8), they run "
            "bf16 weights"
        )
    return None


def why_not(
    name: str,
    weights: Weights | None = None,
    calibration: Calibration | None = None,
    arch: str = "x86_64",
) -> str | None:
    """Why the candidate `name` cannot run (None: it can): a kind without handlers, or with
    `weights` given, a precision one of its kinds does not compute (`refuses`; the first kind
    runs the driver, so the stack and its local experts, the others the experts only).

    Raises:
        ValueError: `weights` without the `calibration` that says what CPUs compute.
    """
    kinds = kinds_of(name)
    reasons = [KINDS[k].not_runnable for k in kinds if KINDS[k].not_runnable]
    if weights is not None:
        if calibration is None:
            raise ValueError("a precision's runnability needs the calibration")
        for position, kind in enumerate(kinds):
            computed = (weights.stack, weights.experts) if position == 0 else (weights.experts,)
            reasons += [refuses(kind, p, calibration, arch) for p in dict.fromkeys(computed)]
    return "; ".join(r for r in reasons if r) or None


def runnable(
    name: str,
    weights: Weights | None = None,
    calibration: Calibration | None = None,
    arch: str = "x86_64",
) -> bool:
    """Whether every kind of the candidate `name` runs its handlers today (at `weights`)."""
    return why_not(name, weights, calibration, arch) is None
