"""A placement's torch side (`ground.placement.Placement`): moving tensors onto its device and
dtype, and back to the host format a function's boundary carries (float32 on the CPU)."""

from __future__ import annotations

import torch

from ground.errors import ModelError, UsageError
from ground.placement import Placement
from ground.precision import Weights
from moe._int8 import cpu_bf16

__all__ = ["check_device", "check_precision", "on_host", "place", "torch_dtype"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def torch_dtype(placement: Placement) -> torch.dtype:
    return _DTYPES[placement.dtype]


def check_device(placement: Placement) -> Placement:
    """`placement`, once its device is there to use.

    Raises:
        ModelError: CUDA asked for where torch sees no GPU (a CPU-only image, or no
            accelerator attached to the environment).
    """
    if placement.device == "cuda" and not torch.cuda.is_available():
        raise ModelError(
            "this function is placed on a GPU (MOELAMBDA_DEVICE=cuda), but torch sees no CUDA "
            "device.",
            "deploy it with the CUDA image (Dockerfile.expert built with DEVICE=cuda) on a "
            "GPU-backed capacity provider, or run it on the CPU (run-local does).",
        )
    return placement


def place(placement: Placement, value: torch.Tensor) -> torch.Tensor:
    """`value` on the placement's device, floating point cast to its dtype (indices kept)."""
    if value.is_floating_point():
        return value.to(device=placement.device, dtype=torch_dtype(placement))
    return value.to(device=placement.device)


def on_host(value: torch.Tensor) -> torch.Tensor:
    """`value` as it leaves a function: on the host, float32 if floating point."""
    value = value.detach().cpu()
    return value.float() if value.is_floating_point() else value


def check_precision(weights: Weights, placement: Placement | None = None) -> Weights:
    """`weights`, once the hardware that would run them can.

    Raises:
        UsageError: bf16 asked on a CPU without bfloat16 instructions, or int8 on a GPU (its
            kernels are CPU kernels: `moe._int8`).
    """
    device = "cpu" if placement is None else placement.device
    kinds = {weights.stack, weights.experts}
    if device == "cpu" and "bf16" in kinds and cpu_bf16() is None:
        raise UsageError(
            f"--weights {weights.label()}: this CPU has no bfloat16 instructions (neither "
            "AVX512-BF16 nor AMX-BF16 in /proc/cpuinfo), so torch would emulate bfloat16, "
            "slower than float32.",
            "use --weights int8 (any CPU) or fp32 here, or run bf16 on a GPU or a CPU that "
            "has them.",
        )
    if device == "cuda" and "int8" in kinds:
        raise UsageError(
            "--weights int8 runs on CPUs only: its kernels are torch's CPU int8 GEMMs.",
            "serve GPU functions at bf16 (their default) and int8 on CPU functions.",
        )
    return weights
