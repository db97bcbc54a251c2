"""The one-layer tiny Mixtral the process-replay tests plan and run: real Hugging Face weights
(seeded) small enough that a function's INIT and a window's compute take a fraction of a second,
with MiniLM's tokenizer so the embedded text's windows fit its vocabulary."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

from moe import resolve_model


def save_one_layer_mixtral(path: Path) -> Path:
    """Save the model (4 experts, 2 per token, hidden 32) and its tokenizer to `path`."""
    config = transformers.MixtralConfig(
        vocab_size=30522,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=None,
    )
    torch.manual_seed(0)
    transformers.MixtralForCausalLM(config).save_pretrained(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(resolve_model("minilm").path)
    tokenizer.save_pretrained(path)
    return path
