"""The growing KV cache (`moe._kv_cache`) holds what Hugging Face's `DynamicCache` holds, and
copies only when its buffer is full or its tensors were replaced."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from moe._kv_cache import SPARE_TOKENS, GrowingCache


def _steps(widths: list[int], batch: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(len(widths))
    return [
        (torch.randn(batch, 2, w, 4, generator=g), torch.randn(batch, 2, w, 4, generator=g))
        for w in widths
    ]


def test_it_holds_what_a_dynamic_cache_holds() -> None:
    # a prompt, decode steps past one buffer's room, then a prefill-sized chunk
    widths = [7] + [1] * (SPARE_TOKENS + 5) + [40, 1]
    growing, dynamic = GrowingCache(), DynamicCache()
    for keys, values in _steps(widths):
        got = growing.update(keys, values, 0)
        want = dynamic.update(keys, values, 0)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert growing.get_seq_length() == dynamic.get_seq_length() == sum(widths)


def test_steps_write_in_place_until_the_buffer_is_full() -> None:
    cache = GrowingCache()
    steps = _steps([5] + [1] * (SPARE_TOKENS + 1))
    cache.update(*steps[0], 0)
    layer = cache.layers[0]
    buffer = layer.key_buffer
    for keys, values in steps[1 : SPARE_TOKENS + 1]:
        cache.update(keys, values, 0)
        assert layer.key_buffer is buffer and layer.keys.data_ptr() == buffer.data_ptr()
    cache.update(*steps[-1], 0)  # one column more than the room: a new, larger buffer
    assert layer.key_buffer is not buffer
    assert layer.key_buffer.shape[2] == 5 + SPARE_TOKENS + 1 + SPARE_TOKENS


def test_replaced_or_cropped_tensors_are_respected() -> None:
    cache, reference = GrowingCache(), DynamicCache()
    steps = _steps([6, 1, 1, 1])
    for keys, values in steps[:2]:
        cache.update(keys, values, 0)
        reference.update(keys, values, 0)
    # rows selected (a new tensor, not the buffer's front): the next step copies it over
    cache.batch_select_indices(torch.tensor([0, 2]))
    reference.batch_select_indices(torch.tensor([0, 2]))
    rows = [(k[[0, 2]], v[[0, 2]]) for k, v in steps[2:]]
    cache.update(*rows[0], 0)
    reference.update(*rows[0], 0)
    assert torch.equal(cache.layers[0].keys, reference.layers[0].keys)
    # a crop keeps the buffer's front: the next step overwrites the cropped column
    cache.crop(-1)
    reference.crop(-1)
    got = cache.update(*rows[1], 0)
    want = reference.update(*rows[1], 0)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
