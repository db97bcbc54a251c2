"""Grouped-query attention without copying the KV cache: the decoders' attention function.

Hugging Face's eager attention (`eager_attention_forward`) repeats each key and value head
for every query head that shares it (`repeat_kv`) before its two matmuls: a copy of the whole
KV cache, per layer, per decode step. On SmolLM2 (9 query heads over 3 KV heads) with 8
sequences of 512 tokens that copy was 28 % of a CPU decode step (cProfile of
`moelambda calibrate --decode-table`'s loop). Here each group of query heads (one per KV head)
is multiplied with the cache as it lies, one matmul per group member.

It is eager's computation, bit for bit: every (sequence, head) product has eager's shape, the
same additive mask, a float32 softmax, and the attention weights come back in eager's
(batch, heads, queries, keys) layout, which the expert predictor reads (`moe._moe_model`'s
most-attended token). Folding the groups into one matmul (queries x groups rows) would be one
call fewer per group but rounds differently with the batch's composition, and a sequence in a
continuous batch must decode token for token as it does alone (`tests/moe/test_batching.py`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

GROUPED_ATTENTION = "moelambda_grouped"


def grouped_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eager attention's result for query (B, H, T, D) over key and value (B, Hkv, S, D).

    Returns:
        The output (B, T, H, D) and the attention weights (B, H, T, S), as eager's.
    """
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    # Query head h reads KV head h // groups (repeat_kv's order). One matmul per group: each
    # (row, KV head) product has eager's shape, (T, D) x (D, S), so it rounds as eager's does
    # whatever the batch (a batch of sequences decodes token for token as each alone), while
    # the cache is read where it lies.
    by_group = query.unflatten(1, (kv_heads, groups))
    keys_t = key.transpose(2, 3)
    weights, outs = [], []
    for g in range(groups):
        scores = torch.matmul(by_group[:, :, g], keys_t) * scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        w = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
        w = nn.functional.dropout(w, p=dropout, training=module.training)
        weights.append(w)
        outs.append(torch.matmul(w, value))
    out = torch.stack(outs, dim=2).flatten(1, 2)  # (B, H, T, D)
    return out.transpose(1, 2).contiguous(), torch.stack(weights, dim=2).flatten(1, 2)


def use_grouped_attention(config: Any) -> None:
    """Make the decoder built from `config` attend with `grouped_attention_forward` (registered
    with transformers, with eager's mask builder for a whole model's forward)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(GROUPED_ATTENTION, grouped_attention_forward)
    AttentionMaskInterface.register(GROUPED_ATTENTION, eager_mask)
    config._attn_implementation = GROUPED_ATTENTION
