"""How each architecture splits into the stages the serverless functions run.

A transformer layer becomes: a *block* (the non-MoE part that ends where the FFN's input is
ready: attention, residual, norm), the MoE part (gate + experts, see `_experts`), and a *combine*
(what follows the FFN: residual add, for BERT also the FFN output bias and LayerNorm). The model
adds a *head* (embeddings) and a *tail* (final norm and task head).

Two families cover the supported models: post-LN encoders (BERT, the MiniLM default) and pre-LN
decoders (Llama/SmolLM2, Mistral, Qwen2, and the native MoE models Mixtral and OLMoE). Modules are
either taken from a loaded Hugging Face model (sharing its tensors) or built empty from the config
and filled from exported weights, which is how a function loads only its own stage.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ground.errors import ModelError
from moe._attention import use_grouped_attention
from moe._experts import ExpertKind

__all__ = [
    "BlockOutput",
    "DenseFFN",
    "Family",
    "family_for",
]

ENCODER_TYPES = ("bert",)
DECODER_TYPES = ("llama", "mistral", "qwen2", "mixtral", "olmoe")
NATIVE_MOE_TYPES = ("mixtral", "olmoe")


@dataclass
class BlockOutput:
    """What a block hands on: the residual stream, the FFN input, and attention weights."""

    residual: torch.Tensor
    ffn_in: torch.Tensor
    attention: torch.Tensor


@dataclass
class DenseFFN:
    """A dense FFN to MoEfy; rows of `w_in` per neuron (two per neuron for a GLU)."""

    w_in: torch.Tensor
    b_in: torch.Tensor | None
    w_out: torch.Tensor
    kind: ExpertKind
    act: str


def _load_class(dotted: str) -> type:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _dotted(obj: object) -> str:
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


# ---------------------------------------------------------------- BERT (post-LN encoder)


class BertHead(nn.Module):
    def __init__(self, embeddings: nn.Module) -> None:
        super().__init__()
        self.embeddings = embeddings

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embeddings(input_ids=input_ids)


class BertBlock(nn.Module):
    def __init__(self, attention: nn.Module) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, hidden: torch.Tensor, context: Any = None) -> BlockOutput:
        if context is not None:
            raise ModelError(
                "an encoder has no generation step: it embeds text, it does not continue it.",
                "generate with a decoder model (SmolLM2, Mixtral, OLMoE).",
            )
        # Windows are full (no padding), so no attention mask is needed.
        out, weights = self.attention(hidden, None)
        return BlockOutput(out, out, weights)


class BertCombine(nn.Module):
    """The FFN output bias, the residual add and the LayerNorm that close a BERT layer."""

    def __init__(self, bias: torch.Tensor, layer_norm: nn.LayerNorm) -> None:
        super().__init__()
        self.bias = nn.Parameter(bias, requires_grad=False)
        self.LayerNorm = layer_norm

    def forward(self, residual: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(y + self.bias + residual)


class BertTail(nn.Module):
    """Mean pooling and L2 normalisation: MiniLM's sentence-embedding head (no parameters)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(hidden.mean(dim=1), dim=-1)


# ---------------------------------------------------------------- pre-LN decoders


def causal_mask(
    length: int,
    sliding_window: int | None,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Additive (1, 1, T, T) mask for eager attention: causal, optionally windowed, on the
    hidden states' device."""
    pos = torch.arange(length, device=device)
    allowed = pos[None, :] <= pos[:, None]
    if sliding_window is not None:
        allowed &= (pos[:, None] - pos[None, :]) < sliding_window
    mask = torch.zeros(length, length, dtype=dtype, device=device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


class DecoderHead(nn.Module):
    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)


class DecoderBlock(nn.Module):
    def __init__(
        self,
        input_layernorm: nn.Module,
        self_attn: nn.Module,
        post_attention_layernorm: nn.Module,
        rotary: nn.Module,
        sliding_window: int | None,
    ) -> None:
        super().__init__()
        self.input_layernorm = input_layernorm
        self.self_attn = self_attn
        self.post_attention_layernorm = post_attention_layernorm
        self.rotary = rotary
        self.sliding_window = sliding_window

    def forward(self, hidden: torch.Tensor, context: Any = None) -> BlockOutput:
        """Full windows (`context` None: causal mask, positions from 0), or one generation step
        (`moe._decode_context.DecodeContext`: its positions, mask and KV cache)."""
        if context is None:
            length = hidden.shape[1]
            positions = torch.arange(length, device=hidden.device)[None]
            mask = causal_mask(length, self.sliding_window, hidden.dtype, hidden.device)
            cache = None
        else:
            positions, mask, cache = context.positions, context.mask, context.cache
        attn_out, weights = self.self_attn(
            hidden_states=self.input_layernorm(hidden),
            position_embeddings=self.rotary(hidden, positions),
            attention_mask=mask,
            past_key_values=cache,
        )
        residual = hidden + attn_out
        return BlockOutput(residual, self.post_attention_layernorm(residual), weights)


class DecoderCombine(nn.Module):
    def forward(self, residual: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return residual + y


class DecoderTail(nn.Module):
    """Final RMSNorm and the language-model head: next-token logits."""

    def __init__(self, norm: nn.Module, lm_head: nn.Linear) -> None:
        super().__init__()
        self.norm = norm
        self.lm_head = lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(hidden))


# ---------------------------------------------------------------- the family interface


class Family:
    """Builds and extracts the stage modules of one architecture.

    `classes` records the dotted Hugging Face class names of the attention and norm modules, so a
    function can rebuild its stage from the exported config without the whole model.
    """

    def __init__(self, name: str, config: Any, classes: dict[str, str]) -> None:
        self.name = name
        self.config = config
        self.classes = classes
        if name == "decoder":  # every decoder path attends alike (moe._attention)
            use_grouped_attention(config)

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return int(self.config.num_hidden_layers)

    # -- taking modules out of a loaded model (they share its tensors)

    def parts_from_hf(self, hf: nn.Module) -> dict[str, Any]:
        """Head, blocks, combines, tail and the per-layer FFN modules of a loaded model."""
        if self.name == "bert":
            layers = hf.encoder.layer
            return {
                "head": BertHead(hf.embeddings),
                "blocks": [BertBlock(layer.attention) for layer in layers],
                "combines": [
                    BertCombine(layer.output.dense.bias.detach(), layer.output.LayerNorm)
                    for layer in layers
                ],
                "tail": BertTail(),
                "ffns": [layer for layer in layers],
            }
        body = hf.model
        window = getattr(self.config, "sliding_window", None)
        return {
            "head": DecoderHead(body.embed_tokens),
            "blocks": [
                DecoderBlock(
                    layer.input_layernorm,
                    layer.self_attn,
                    layer.post_attention_layernorm,
                    body.rotary_emb,
                    window,
                )
                for layer in body.layers
            ],
            "combines": [DecoderCombine() for _ in body.layers],
            "tail": DecoderTail(body.norm, hf.lm_head),
            "ffns": [layer.mlp for layer in body.layers],
        }

    def dense_ffn(self, ffn_module: nn.Module) -> DenseFFN:
        """The dense FFN of one layer as plain tensors, ready to partition."""
        act = str(self.config.hidden_act)
        if self.name == "bert":
            return DenseFFN(
                ffn_module.intermediate.dense.weight.detach(),
                ffn_module.intermediate.dense.bias.detach(),
                ffn_module.output.dense.weight.detach(),
                "mlp",
                act,
            )
        w_in = torch.cat([ffn_module.gate_proj.weight, ffn_module.up_proj.weight]).detach()
        return DenseFFN(w_in, None, ffn_module.down_proj.weight.detach(), "glu", act)

    # -- building empty modules from the config (a function loading its own stage)

    def new_head(self) -> nn.Module:
        if self.name == "bert":
            return BertHead(_load_class(self.classes["embeddings"])(self.config))
        cfg = self.config
        return DecoderHead(nn.Embedding(cfg.vocab_size, cfg.hidden_size))

    def new_block(self, layer: int) -> nn.Module:
        if self.name == "bert":
            return BertBlock(_load_class(self.classes["attention"])(self.config, layer_idx=layer))
        cfg = self.config
        norm = _load_class(self.classes["norm"])
        return DecoderBlock(
            norm(cfg.hidden_size, eps=cfg.rms_norm_eps),
            _load_class(self.classes["attention"])(cfg, layer),
            norm(cfg.hidden_size, eps=cfg.rms_norm_eps),
            _load_class(self.classes["rotary"])(config=cfg),
            getattr(cfg, "sliding_window", None),
        )

    def new_combine(self) -> nn.Module:
        if self.name == "bert":
            h = self.hidden_size
            return BertCombine(torch.zeros(h), nn.LayerNorm(h, eps=self.config.layer_norm_eps))
        return DecoderCombine()

    def new_tail(self) -> nn.Module:
        if self.name == "bert":
            return BertTail()
        cfg = self.config
        norm = _load_class(self.classes["norm"])(cfg.hidden_size, eps=cfg.rms_norm_eps)
        return DecoderTail(norm, nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False))


def family_for(hf: nn.Module) -> Family:
    """The family of a loaded Hugging Face model, with the classes needed to rebuild stages."""
    config = hf.config
    model_type = config.model_type
    if model_type in ENCODER_TYPES:
        layer = hf.encoder.layer[0]
        classes = {"embeddings": _dotted(hf.embeddings), "attention": _dotted(layer.attention)}
        return Family("bert", config, classes)
    if model_type in DECODER_TYPES:
        layer = hf.model.layers[0]
        classes = {
            "attention": _dotted(layer.self_attn),
            "norm": _dotted(layer.input_layernorm),
            "rotary": _dotted(hf.model.rotary_emb),
        }
        return Family("decoder", config, classes)
    raise ModelError(
        f"model type '{model_type}' is not supported.",
        f"use a model of type {', '.join(ENCODER_TYPES + DECODER_TYPES)}.",
    )
