"""Int8 weights on CPUs: the matrices, linear layers and embeddings `--weights int8` serves.

Weight-only int8: each weight matrix is stored as int8 values with one scale per output channel
(symmetric; the scale a bfloat16 number, rounded up, so the int8 values stay within 127 and
every kernel below uses the same scale exactly); activations are never quantized. A product
is ``(x W8^T) * scale``, x rounded to bfloat16, accumulated in float32, returned in x's dtype.

On a CPU with bfloat16 instructions (AVX512-BF16 or AMX: `cpu_bf16`), two kernels by the rows
of a call, both PyTorch's own (pinned with torch; no new native dependency):

* a few rows (a decode step, a remote expert's hit): ``torch._weight_int8pack_mm``, the
  weight-only int8 GEMM torchao and gpt-fast use on CPUs: it reads one byte per weight, where a
  step of a few rows is bound by reading weights. Measured here (one thread, weights out of
  cache): a 576 x 576 matrix at one row 110 us, against 266 us in float32;
* many rows (a prefill, a batch): the int8 values widened to bfloat16 (exactly: |v| <= 127) and
  one bfloat16 GEMM (oneDNN: AMX or AVX512-BF16), then the scales: at 1,024 rows of 576 x 576,
  1.6 ms against float32's 7.5 ms, where the first kernel takes 14 ms.

On any other CPU (Lambda's, as far as AWS documents them: `lambda_cpu_bf16` in the
calibration), the portable kernel: the row's values scaled to float32 per call and a float32
GEMM. It computes in float32 (no bfloat16 rounding), reads a quarter of the weight bytes from
the function's memory, and is slower than float32 on a step of a few rows (it writes the
float32 matrix it multiplies); `MOELAMBDA_INT8_KERNEL=portable` forces it, so its speed is
measured here too (`moelambda bench precision`).

Why not the int8 x int8 kernel (FBGEMM's dynamic quantized linear, `quantize_dynamic`): it
quantizes each call's activations per tensor to 8 bits, and decoders' activations have outlier
channels: the SmolLM2 MoE's perplexity rose 24 % (105.3 to 130.6) where bfloat16 activations
keep it within 1.4 % (`moelambda quality --weights int8`).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = [
    "FEW_ROWS",
    "Int8Embedding",
    "Int8Linear",
    "Int8Matrix",
    "cpu_bf16",
    "cpu_flags",
    "int8_kernel",
    "int8_shells",
    "quantize_stack",
]

_QMAX = 127.0
CPU_INFO = Path("/proc/cpuinfo")
# The instructions that make bfloat16 matmuls fast on x86 (oneDNN uses them through torch).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")
KERNEL_ENV = "MOELAMBDA_INT8_KERNEL"  # "bf16" or "portable": which kernel int8 runs
# Rows up to which a call takes the weight-only int8 GEMM, above which the widened bfloat16 GEMM
# (measured here: at 8 rows the first reads a quarter of the bytes; at 64 the second is 3x faster).
FEW_ROWS = 16
# The weight-only kernel reads its inputs in blocks of 16 values: at other widths it returns
# wrong numbers or crashes (measured with torch 2.13), so such matrices take the widened GEMM.
PACK_WIDTH = 16


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux lists them (empty where /proc/cpuinfo is not)."""
    try:
        text = CPU_INFO.read_text()
    except OSError:
        return frozenset()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "flags:")
    return frozenset(line.split(":", 1)[1].split())


def cpu_bf16() -> str | None:
    """The CPU's bfloat16 instructions by name ("avx512_bf16 amx_bf16"), or None without any.

    Without them torch still computes bfloat16, by converting every value to float32 and back:
    slower than float32. (ARM's BF16 extension is not detected: refused rather than guessed.)
    """
    if platform.machine().lower() in ("arm64", "aarch64"):
        return None
    return " ".join(flag for flag in BF16_FLAGS if flag in cpu_flags()) or None


def int8_kernel() -> str:
    """ "bf16" (this CPU computes bfloat16) or "portable"; `MOELAMBDA_INT8_KERNEL` overrides."""
    chosen = os.environ.get(KERNEL_ENV) or ("bf16" if cpu_bf16() else "portable")
    if chosen not in ("bf16", "portable"):
        raise ValueError(f"{KERNEL_ENV}={chosen!r}: use bf16 or portable")
    return chosen


def _scales(weight: torch.Tensor) -> torch.Tensor:
    """One scale per row, a bfloat16 number at least its largest magnitude over 127 (zero rows:
    1), so that rounding the row to int8 stays within +-127 and every kernel scales alike."""
    amax = weight.detach().float().abs().amax(dim=-1)
    scale = torch.where(amax > 0, amax / _QMAX, torch.ones_like(amax))
    rounded = scale.bfloat16().float()
    # the next bfloat16 up where rounding went down (the scale's bits, one unit higher)
    up = (rounded.view(torch.int32) + 1).view(torch.float32)
    return torch.where(rounded < scale, up.bfloat16().float(), rounded)


def _values(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Round to nearest (ties to even)."""
    q = torch.round(weight.detach().float() / scale.unsqueeze(-1))
    return q.clamp(-_QMAX, _QMAX).to(torch.int8)


class Int8Matrix:
    """One (out, in) weight as int8 values with a scale per output channel (bfloat16 numbers,
    kept as float32), and its optional float32 bias."""

    __slots__ = ("bias", "in_features", "out_features", "scale", "scale_bf16", "values")

    def __init__(
        self, values: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
    ) -> None:
        # a fresh, aligned copy: the weight-only kernel crashes on a tensor read in place from
        # a safetensors file (its data sits at the file's 8-byte offsets)
        self.values = values.to(torch.int8).clone(memory_format=torch.contiguous_format)
        self.scale = scale.float().contiguous()
        self.scale_bf16 = self.scale.bfloat16()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        self.out_features, self.in_features = (int(n) for n in self.values.shape)

    @property
    def has_bias(self) -> bool:
        return self.bias is not None

    @classmethod
    def quantize(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Matrix:
        scale = _scales(weight)
        return cls(_values(weight, scale), scale, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W^T + b for (..., in) rows of any float dtype, returned in that dtype."""
        if int8_kernel() == "portable":
            flat32 = x.reshape(-1, self.in_features).float()
            y = nn.functional.linear(flat32, self.dequantized(), self.bias)
            return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        flat = x.reshape(-1, self.in_features).to(torch.bfloat16)
        if flat.shape[0] <= FEW_ROWS and self.in_features % PACK_WIDTH == 0:
            y = torch._weight_int8pack_mm(flat, self.values, self.scale_bf16).float()
        else:
            widened = self.values.to(torch.bfloat16)  # exact: |v| <= 127
            y = nn.functional.linear(flat, widened).float() * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def stored(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(int8 values, float32 scales, float32 bias or None): what a weight file holds."""
        return self.values, self.scale, self.bias

    def dequantized(self) -> torch.Tensor:
        return self.values.float() * self.scale[:, None]


class Int8Linear(nn.Module):
    """`nn.Linear` with int8 weights; its state dict holds ``weight`` (int8), ``weight_scale``
    and ``bias`` (float32, if any), plain tensors a safetensors file stores."""

    def __init__(self, matrix: Int8Matrix) -> None:
        super().__init__()
        self.matrix = matrix

    @classmethod
    def quantize(cls, linear: nn.Linear) -> Int8Linear:
        return cls(Int8Matrix.quantize(linear.weight, linear.bias))

    @classmethod
    def shell(cls, linear: nn.Linear) -> Int8Linear:
        """An empty module of `linear`'s shape, to load a stored int8 weight into."""
        out_features, in_features = linear.weight.shape
        zeros = torch.zeros(out_features, in_features, dtype=torch.int8)
        bias = None if linear.bias is None else torch.zeros(out_features)
        return cls(Int8Matrix(zeros, torch.ones(out_features), bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.matrix(x)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        values, scale, bias = self.matrix.stored()
        destination[prefix + "weight"] = values
        destination[prefix + "weight_scale"] = scale
        if bias is not None:
            destination[prefix + "bias"] = bias

    def _load_from_state_dict(
        self,
        state_dict: dict[str, torch.Tensor],
        prefix: str,
        local_metadata: Any,
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        has_bias = self.matrix.has_bias
        wanted = ["weight", "weight_scale"] + (["bias"] if has_bias else [])
        missing = [prefix + k for k in wanted if prefix + k not in state_dict]
        if missing:
            missing_keys.extend(missing)
            return
        self.matrix = Int8Matrix(
            state_dict[prefix + "weight"],
            state_dict[prefix + "weight_scale"],
            state_dict[prefix + "bias"] if has_bias else None,
        )


class Int8Embedding(nn.Module):
    """`nn.Embedding` with int8 rows and a float32 scale per row (looked-up rows are scaled back
    to float32: a lookup reads a few rows, so no int8 kernel is needed)."""

    def __init__(self, weight: torch.Tensor, weight_scale: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.to(torch.int8))
        self.register_buffer("weight_scale", weight_scale.float())

    @classmethod
    def quantize(cls, embedding: nn.Embedding) -> Int8Embedding:
        scale = _scales(embedding.weight)
        return cls(_values(embedding.weight, scale), scale)

    @classmethod
    def shell(cls, embedding: nn.Embedding) -> Int8Embedding:
        rows = embedding.weight.shape[0]
        return cls(torch.zeros(embedding.weight.shape, dtype=torch.int8), torch.ones(rows))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = nn.functional.embedding(ids, self.weight).float()
        return rows * self.weight_scale[ids].unsqueeze(-1)


def _replace(module: nn.Module, make_linear: Any, make_embedding: Any) -> nn.Module:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, make_linear(child))
        elif isinstance(child, nn.Embedding):
            setattr(module, name, make_embedding(child))
        else:
            _replace(child, make_linear, make_embedding)
    return module


def quantize_stack(module: nn.Module) -> nn.Module:
    """`module` with every linear layer and embedding swapped for its int8 form, in place."""
    return _replace(module, Int8Linear.quantize, Int8Embedding.quantize)


def int8_shells(module: nn.Module) -> nn.Module:
    """`module` with every linear layer and embedding swapped for an empty int8 one, in place:
    what a stored int8 stage is loaded into."""
    return _replace(module, Int8Linear.shell, Int8Embedding.shell)
