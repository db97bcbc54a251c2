"""A KV cache that grows in place: Hugging Face's `DynamicCache` without a copy per step.

`DynamicCache` appends each step's keys and values with `torch.cat`, which copies the whole
cache, every layer, every decode step: 25 % of a CPU decode step of SmolLM2 with 8 sequences
of 512 tokens once the attention no longer copied it too (`moe._attention`). This cache keeps
each layer's keys and values in a buffer with room for `SPARE_TOKENS` more columns, writes a
step's columns into it, and hands out views of the filled part; it copies only when the buffer
is full or something replaced the layer's tensors (a crop keeps the buffer, a row selection
does not).

The values are the same as `DynamicCache`'s; only where they live differs. Up to
`SPARE_TOKENS` columns per sequence are held beyond the filled part, a few percent of the KV
cache the planner prices for a stream's longest request.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

SPARE_TOKENS = 128


class GrowingLayer(DynamicLayer):
    """One layer's keys and values, (B, H, S, D) views of buffers with spare columns."""

    key_buffer: torch.Tensor | None = None
    value_buffer: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append `key_states` and `value_states` (B, H, T, D) along the sequence axis."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length = self.keys.shape[-2] if self.keys.numel() else 0
        filled = length + key_states.shape[-2]
        if not self._fits(self.keys, self.key_buffer, key_states, filled):
            self.key_buffer = _regrown(self.keys, key_states, length, filled)
        if not self._fits(self.values, self.value_buffer, value_states, filled):
            self.value_buffer = _regrown(self.values, value_states, length, filled)
        assert self.key_buffer is not None and self.value_buffer is not None
        self.key_buffer[:, :, length:filled] = key_states
        self.value_buffer[:, :, length:filled] = value_states
        self.keys = self.key_buffer[:, :, :filled]
        self.values = self.value_buffer[:, :, :filled]
        return self.keys, self.values

    @staticmethod
    def _fits(
        held: torch.Tensor, buffer: torch.Tensor | None, new: torch.Tensor, filled: int
    ) -> bool:
        """Whether `held` is still the front of `buffer` (nothing replaced it) with room up to
        `filled` columns for rows and heads like `new`'s."""
        if buffer is None or buffer.shape[-2] < filled:
            return False
        if buffer.shape[:2] != new.shape[:2] or buffer.shape[-1] != new.shape[-1]:
            return False
        if held.numel() == 0:
            return True
        return held.data_ptr() == buffer.data_ptr() and held.stride() == buffer.stride()


def _regrown(held: torch.Tensor, new: torch.Tensor, length: int, filled: int) -> torch.Tensor:
    """A buffer for `filled` + `SPARE_TOKENS` columns holding `held`'s `length` columns."""
    batch, heads, _, dim = new.shape
    buffer = new.new_empty(batch, heads, filled + SPARE_TOKENS, dim)
    if length:
        buffer[:, :, :length] = held
    return buffer


class GrowingCache(DynamicCache):
    """A `DynamicCache` whose layers are `GrowingLayer`s (created as layers are first updated)."""

    def __init__(self) -> None:
        Cache.__init__(self, layer_class_to_replicate=GrowingLayer)
