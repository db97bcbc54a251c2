"""Where a function's stages live and at which precision: its device and weight dtype.

A CPU function runs its stages as exported (float32 on the CPU). A GPU-backed function runs
them on its accelerator at the precision the GPU model prices (`planner.hardware.gpu_model`:
bfloat16 weights, `GPU`), so a plan runs as it was priced and its weights fit the memory the
plan placed them in. The CDK app sets a function's placement in its environment (`ENV`, read by
`functions.config`); `moe.StageLoader` builds the stages on the device directly, a tensor at a
time, so the host needs room for one stage's file, not for the model.

Hidden states cross a function's boundary (S3, Invoke payloads, the output) as float32 on the
host whatever the placement: the wire format every other function and the cost model read.

Torch-free (the CDK app, the planner and the batcher read it); `moe._placement` holds what
needs torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ground.errors import ModelError

__all__ = ["CPU", "DEVICES", "DTYPES", "ENV", "GPU", "Placement"]

DEVICES = ("cpu", "cuda")
DTYPES = ("float32", "bfloat16")
ENV = ("MOELAMBDA_DEVICE", "MOELAMBDA_DTYPE")  # a function's environment variables


@dataclass(frozen=True)
class Placement:
    """A device and the dtype of the weights and activations on it."""

    device: str = "cpu"
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for value, allowed, variable in zip(
            (self.device, self.dtype), (DEVICES, DTYPES), ENV, strict=True
        ):
            if value not in allowed:
                raise ModelError(
                    f"{variable} {value!r} is not a placement this moelambda runs.",
                    f"set it to one of {', '.join(allowed)}.",
                )

    def environment(self) -> dict[str, str]:
        """The function environment that sets this placement (empty for the default)."""
        if self == CPU:
            return {}
        return dict(zip(ENV, (self.device, self.dtype), strict=True))

    def describe(self) -> str:
        return f"{self.device} {self.dtype}"


CPU = Placement()
GPU = Placement("cuda", "bfloat16")  # what `planner.hardware.gpu_model` prices (BF16 weights)
