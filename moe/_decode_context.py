"""What a decoder block reads beyond the hidden states during generation.

Its own module because the layer stage (`moe._stages`) passes it to the attention block, while
generation (`moe._generate`) builds it and runs the stages: each needs it, and generation needs
the stages, so it cannot live with either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DecodeContext"]


@dataclass
class DecodeContext:
    """What a decoder block needs beyond the hidden states when it runs with a cache.

    `cache` holds every layer's keys and values (`moe._kv_cache.GrowingCache`, a Hugging Face
    `DynamicCache`, indexed by the attention's layer index); `positions` are the new tokens'
    position ids (B, T); `mask` is the additive attention mask (B, 1, T, S) over the S cached
    plus new keys; `rows` marks the (B*T,) new tokens that are real (routed to experts); the
    others are holes.
    """

    cache: Any
    positions: torch.Tensor
    mask: torch.Tensor
    rows: torch.Tensor
