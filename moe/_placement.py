"""A placement's torch side (`ground.placement.Placement`): moving tensors onto its device and
dtype, and back to the host format a function's boundary carries (float32 on the CPU)."""

from __future__ import annotations

import torch

from ground.errors import ModelError
from ground.placement import Placement

__all__ = ["check_device", "on_host", "place", "torch_dtype"]

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
