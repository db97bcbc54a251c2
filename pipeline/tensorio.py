"""The binary tensor codec every request intermediate in S3 uses.

Layout: magic b"MLT1", uint8 count, then per tensor: uint8 dtype code, uint8 ndim, ndim x uint32
shape (little endian), raw C-order bytes. A fixed binary header instead of JSON or npy keeps
floats exact, lets several tensors share one object (routing: experts and weights), and is
trivial to parse in any language.

A float32 array whose every value is a bfloat16 (the low 16 bits of each value zero: what a
stage computing in bfloat16 hands on, `ground.precision`) travels as bfloat16, the high half of
each value (code 4), and is decoded back to the same float32 values: half the bytes through S3
and Invoke payloads, exactly. numpy has no bfloat16, so the caller sees float32 either way.
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = ["MAGIC", "TensorIOError", "decode", "encode"]

MAGIC = b"MLT1"
_CODES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("<i8"),
    3: np.dtype("<i4"),
}
_BY_DTYPE = {dtype: code for code, dtype in _CODES.items()}
BFLOAT16 = 4  # float32 values that are bfloat16s, stored as their high 16 bits (`encode`)
_F32 = np.dtype("<f4")


def _as_bfloat16(a: np.ndarray) -> np.ndarray | None:
    """The high halves of a float32 array's values when its low halves are all zero, else None."""
    if a.dtype != _F32 or not a.size:
        return None
    bits = np.ascontiguousarray(a, dtype=_F32).view("<u4")
    if np.any(bits & 0xFFFF):
        return None
    return (bits >> 16).astype("<u2")


class TensorIOError(ValueError):
    """The bytes are not a tensor object of this codec (wrong magic, cut short, bad header)."""


def encode(*arrays: np.ndarray) -> bytes:
    """Pack arrays (float32, float16, int64 or int32) into one object, in order."""
    if len(arrays) > 255:
        raise TensorIOError(f"at most 255 tensors fit in one object, got {len(arrays)}")
    chunks = [MAGIC, struct.pack("<B", len(arrays))]
    for array in arrays:
        a = np.asarray(array)
        dtype = a.dtype.newbyteorder("<")
        if dtype not in _BY_DTYPE:
            raise TensorIOError(
                f"dtype {a.dtype} is not encodable; use float32, float16, int64 or int32"
            )
        if a.ndim > 255:
            raise TensorIOError(f"at most 255 dimensions are encodable, got {a.ndim}")
        halves = _as_bfloat16(a)
        code = _BY_DTYPE[dtype] if halves is None else BFLOAT16
        chunks.append(struct.pack(f"<BB{a.ndim}I", code, a.ndim, *a.shape))
        body = np.ascontiguousarray(a, dtype=dtype) if halves is None else halves
        chunks.append(body.tobytes())
    return b"".join(chunks)


def _take(data: bytes, offset: int, size: int, what: str) -> tuple[bytes, int]:
    end = offset + size
    if end > len(data):
        raise TensorIOError(
            f"tensor object truncated: {what} needs bytes {offset}..{end}, object has {len(data)}"
        )
    return data[offset:end], end


def decode(data: bytes) -> list[np.ndarray]:
    """Unpack an object written by `encode`; arrays are writable copies in native byte order."""
    if data[: len(MAGIC)] != MAGIC:
        raise TensorIOError(f"not a tensor object: magic {data[:4]!r}, expected {MAGIC!r}")
    header, offset = _take(data, len(MAGIC), 1, "the tensor count")
    arrays = []
    for i in range(header[0]):
        head, offset = _take(data, offset, 2, f"the header of tensor {i}")
        code, ndim = head
        if code not in _CODES and code != BFLOAT16:
            raise TensorIOError(f"tensor {i} has unknown dtype code {code}")
        raw_shape, offset = _take(data, offset, 4 * ndim, f"the shape of tensor {i}")
        shape = struct.unpack(f"<{ndim}I", raw_shape)
        dtype = np.dtype("<u2") if code == BFLOAT16 else _CODES[code]
        raw, offset = _take(data, offset, int(np.prod(shape)) * dtype.itemsize, f"tensor {i}")
        values = np.frombuffer(raw, dtype=dtype).reshape(shape)
        if code == BFLOAT16:
            bits = values.astype("<u4")
            bits <<= 16  # in place: a 0-d array stays an array
            values = bits.view(_F32)
        arrays.append(values.astype(values.dtype.newbyteorder("=")))
    if offset != len(data):
        raise TensorIOError(f"{len(data) - offset} unexpected bytes after the last tensor")
    return arrays
