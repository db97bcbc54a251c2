"""The decoders' attention (`moe._attention`) is Hugging Face's eager attention bit for bit,
without copying the KV cache per query head, and every decoder path uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers.models.llama.modeling_llama import eager_attention_forward

from moe import StageLoader, export_model, load_model
from moe._attention import GROUPED_ATTENTION, grouped_attention_forward


class _Heads(nn.Module):
    def __init__(self, groups: int) -> None:
        super().__init__()
        self.num_key_value_groups = groups


@pytest.mark.parametrize(
    ("groups", "kv_heads", "dim", "batch", "queries", "keys"),
    [
        (3, 3, 64, 8, 1, 512),  # SmolLM2's heads, a decode step of 8 sequences
        (2, 2, 8, 5, 1, 37),
        (2, 2, 8, 2, 7, 20),  # a prefill chunk over a cache
        (1, 4, 16, 1, 30, 30),  # no grouping (multi-head attention)
        (4, 2, 16, 3, 4, 9),
    ],
)
def test_grouped_attention_is_eager_attention_bit_for_bit(
    groups: int, kv_heads: int, dim: int, batch: int, queries: int, keys: int
) -> None:
    g = torch.Generator().manual_seed(queries * keys)
    heads = groups * kv_heads
    # The query as the attention modules make it (a transposed view); the cache as
    # `moe._kv_cache` holds it (the front of a longer buffer).
    query = torch.randn(batch, queries, heads, dim, generator=g).transpose(1, 2)
    key = torch.randn(batch, kv_heads, keys + 5, dim, generator=g)[:, :, :keys]
    value = torch.randn(batch, kv_heads, keys + 5, dim, generator=g)[:, :, :keys]
    mask = torch.zeros(batch, 1, queries, keys)
    mask[0, 0, :, :3] = torch.finfo(torch.float32).min  # holes of a left-padded row
    module = _Heads(groups).eval()
    want, want_weights = eager_attention_forward(module, query, key, value, mask, 0.125)
    got, got_weights = grouped_attention_forward(module, query, key, value, mask, 0.125)
    assert torch.equal(got, want)
    assert torch.equal(got_weights, want_weights)


def test_every_decoder_path_attends_with_it(tiny_dirs: dict[str, Path], tmp_path: Path) -> None:
    model = load_model(str(tiny_dirs["olmoe"]), experts=None, top_k=None)  # in process
    assert model.blocks[0].self_attn.config._attn_implementation == GROUPED_ATTENTION
    export_model(model, tmp_path / "w")  # a deployed function's layer stage
    block = StageLoader(tmp_path / "w").layer(0).block
    assert block.self_attn.config._attn_implementation == GROUPED_ATTENTION
