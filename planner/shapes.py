"""Real-scale Mixture-of-Experts models described by their architecture alone.

The planner needs stage sizes in bytes and expert counts, not weights. A `ModelShape` holds the
few architecture numbers a model's Hugging Face `config.json` publishes, sizes every stage from
them, and hands the planner a synthetic `Manifest`, so a 47-billion-parameter model can be
planned on a laptop that could never load it. `shape_counts` supplies the missing other half,
token counts per expert, from an assumed popularity (uniform, Zipf, or the skew of a smaller
model's routing trace) and labels them as assumptions.

The stage layout follows the exporter's (`moe._export`):

    head    embeddings, plus any leading dense decoder layers (DeepSeek's first_k_dense_replace)
    layer   one MoE layer's attention block, its two norms, the router and the shared experts
    expert  one routed expert's FFN
    tail    final norm and LM head (a separate copy even when tied, as the exporter writes it)

Every stage is sized at a weight precision (`ground.precision.Weights`, `--weights`): the
stack's for the head, layer and tail stages, the experts' for the expert stages, int8 with a
float32 scale per output channel; by default the precision the model is published in
(`ModelShape.published_weights`). The hidden states and the KV cache follow the stack's.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    model_validator,
)

from ground.errors import UsageError, did_you_mean
from ground.manifest import (
    HEAD_KEY,
    MANIFEST_VERSION,
    TAIL_KEY,
    Manifest,
    StageEntry,
    expert_key,
    layer_key,
)
from ground.precision import ACTIVATION_DTYPE, BYTES, Precision, Weights, scale_bytes
from predictor import RoutingTrace

__all__ = [
    "GQAAttention",
    "MLAAttention",
    "ModelShape",
    "builtin_shapes",
    "load_shape",
    "shape_counts",
    "shape_from_config",
]

# The Hugging Face config classes whose MoE fields `shape_from_config` knows how to read.
FAMILIES = {
    "olmoe": "OlmoeConfig",
    "mixtral": "MixtralConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "deepseek_v2": "DeepseekV2Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "gpt_oss": "GptOssConfig",
}
_EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")


class GQAAttention(_Frozen):
    """Multi-head attention with grouped key/value heads (plain MHA when kv_heads == heads)."""

    kind: Literal["gqa"] = "gqa"
    heads: PositiveInt
    kv_heads: PositiveInt
    head_dim: PositiveInt
    qkv_bias: bool = False  # Qwen2-MoE's and gpt-oss's q/k/v projections carry biases
    o_bias: bool = False  # gpt-oss's output projection carries one too
    qk_norm: bool = False  # OLMoE normalises queries and keys (RMSNorm over all heads)
    qk_norm_per_head: bool = False  # Qwen3 normalises each head's (RMSNorm over head_dim)
    sinks: bool = False  # gpt-oss learns one attention-sink logit per head

    def params(self, hidden: int) -> int:
        """Weights of the q/k/v/o projections, their biases, the q/k norms and the sinks."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        projections = hidden * (q + 2 * kv) + q * hidden
        biases = (q + 2 * kv) * self.qkv_bias + hidden * self.o_bias
        norms = (q + kv) * self.qk_norm + 2 * self.head_dim * self.qk_norm_per_head
        return projections + biases + norms + self.heads * self.sinks

    def kv_width(self) -> int:
        """Elements of one token's keys and values that a KV cache keeps per layer."""
        return 2 * self.kv_heads * self.head_dim

    def rows(self, hidden: int) -> int:
        """Output channels of the q/k/v/o projections (one int8 scale each)."""
        return self.heads * self.head_dim + self.kv_width() + hidden


class MLAAttention(_Frozen):
    """DeepSeek-V2's multi-head latent attention: keys and values pass a low-rank latent."""

    kind: Literal["mla"] = "mla"
    heads: PositiveInt
    q_lora_rank: NonNegativeInt  # 0: a full-rank query projection (V2-Lite)
    kv_lora_rank: PositiveInt
    qk_nope_head_dim: PositiveInt
    qk_rope_head_dim: NonNegativeInt
    v_head_dim: PositiveInt

    def params(self, hidden: int) -> int:
        """Weights of the query, compressed key/value and output projections and latent norms."""
        q_out = self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        rank = self.q_lora_rank
        query = hidden * rank + rank + rank * q_out if rank else hidden * q_out
        latent = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        expand = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return query + latent + expand + self.heads * self.v_head_dim * hidden

    def kv_width(self) -> int:
        """Elements of one token's keys and values that a KV cache keeps per layer: Hugging
        Face's DeepseekV2 attention caches the expanded keys and values, not the latent."""
        return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)

    def rows(self, hidden: int) -> int:
        """Output channels of the query, compressed key/value, expansion and output
        projections (one int8 scale each)."""
        q_out = self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        latent = self.kv_lora_rank + self.qk_rope_head_dim
        expand = self.heads * (self.qk_nope_head_dim + self.v_head_dim)
        return self.q_lora_rank + q_out + latent + expand + hidden


class ModelShape(_Frozen):
    """An MoE decoder's architecture: enough to size every stage without its weights.

    `synthetic` is False for shapes recorded from a published model and True for made-up ones;
    counts planned for a synthetic shape are never labelled as measured.
    """

    name: str = Field(min_length=1)
    source: str  # the config.json it was read from (a URL for the built-ins)
    as_of: str | None = None  # when a built-in's values were recorded
    model_type: str  # the Hugging Face model_type whose layout the numbers follow
    moe_layers: PositiveInt
    dense_layers: NonNegativeInt = 0  # leading dense decoder layers, run by the head
    dense_ffn: NonNegativeInt = 0  # their FFN width
    experts: PositiveInt
    top_k: PositiveInt
    hidden: PositiveInt
    expert_ffn: PositiveInt
    gated: bool = True  # SwiGLU: gate, up and down matrices; else up and down
    activation: str = "silu"
    shared_ffn: NonNegativeInt = 0  # total width of the always-on shared experts
    shared_gate: bool = False  # Qwen2-MoE scales the shared expert by a sigmoid gate
    norm_topk_prob: bool = False  # whether the top-k gate weights are renormalised
    expert_bias: bool = False  # gpt-oss's experts add a bias to gate/up and to down
    router_bias: bool = False  # gpt-oss's router adds a bias per expert
    # The format the routed experts are published in when it is not `dtype`: gpt-oss ships
    # them in MXFP4 (4-bit values, one 8-bit scale per 32). No precision here stores 4 bits,
    # so its stages are sized and priced at `dtype` (or `--weights`), as a runtime without
    # MXFP4 kernels dequantises them.
    expert_format: Literal["mxfp4"] | None = None
    attention: Annotated[GQAAttention | MLAAttention, Field(discriminator="kind")]
    vocab: PositiveInt
    tied_embeddings: bool
    dtype: Literal["float32", "bfloat16", "float16"]
    synthetic: bool = False

    @model_validator(mode="after")
    def _consistent(self) -> ModelShape:
        if self.top_k > self.experts:
            raise ValueError(f"top_k {self.top_k} exceeds the {self.experts} experts")
        if (self.dense_layers > 0) != (self.dense_ffn > 0):
            raise ValueError("dense_layers and dense_ffn must both be set or both be 0")
        return self

    def _ffn_params(self, width: int, bias: bool = False) -> int:
        """Weights of an FFN of `width`, plus a bias per output channel where `bias`."""
        return (3 if self.gated else 2) * self.hidden * width + bias * self._ffn_rows(width)

    def _ffn_rows(self, width: int) -> int:
        """Output channels of an FFN of `width`: gate and up give `width` each, down `hidden`."""
        return ((2 if self.gated else 1) * width + self.hidden) if width else 0

    @property
    def expert_params(self) -> int:
        """Weights of one routed expert (and its biases, gpt-oss's)."""
        return self._ffn_params(self.expert_ffn, self.expert_bias)

    @property
    def layer_params(self) -> int:
        """Weights of one MoE layer's non-expert part: attention, two norms, router, shared."""
        block = self.attention.params(self.hidden) + 2 * self.hidden
        shared = self._ffn_params(self.shared_ffn) + self.hidden * self.shared_gate
        router = (self.hidden + self.router_bias) * self.experts
        return block + router + shared

    @property
    def head_params(self) -> int:
        """Embeddings plus the leading dense layers (attention, two norms, dense FFN each)."""
        dense = self.attention.params(self.hidden) + 2 * self.hidden
        dense += self._ffn_params(self.dense_ffn)
        return self.vocab * self.hidden + self.dense_layers * dense

    @property
    def tail_params(self) -> int:
        """Final norm and LM head."""
        return self.hidden + self.vocab * self.hidden

    def stage_rows(self) -> dict[str, int]:
        """Output channels of each stage kind's matrices: what int8 stores a float32 scale for
        (`ground.precision.scale_bytes`). Counted per matrix as its output width (the router's
        E rows, an embedding's one row per token id, the LM head's one per token); the norms'
        and biases' vectors have none. An approximation of the exporter's own layout, within
        a few rows a matrix: the scales are under 1 % of an int8 stage either way."""
        attention = self.attention.rows(self.hidden)
        shared = self._ffn_rows(self.shared_ffn) + self.shared_gate
        dense = attention + self._ffn_rows(self.dense_ffn)
        return {
            "head": self.vocab + self.dense_layers * dense,
            "layer": attention + self.experts + shared,
            "expert": self._ffn_rows(self.expert_ffn),
            "tail": self.vocab,
        }

    def _params(self, experts_per_layer: int) -> int:
        tied = self.vocab * self.hidden * self.tied_embeddings  # the tail's copy is no new weight
        per_layer = self.layer_params + experts_per_layer * self.expert_params
        return self.head_params + self.moe_layers * per_layer + self.tail_params - tied

    def total_params(self) -> int:
        """Every weight of the model, counting tied embeddings once (the published figure)."""
        return self._params(self.experts)

    def active_params(self) -> int:
        """Weights one token touches: every non-expert weight and top_k experts per layer."""
        return self._params(self.top_k)

    @property
    def published_weights(self) -> Weights:
        """The precision the model is published in (its config's dtype): float32 is fp32,
        bfloat16 and float16 are bf16 (2 bytes a value either way), every stage kind alike."""
        precision: Precision = "fp32" if self.dtype == "float32" else "bf16"
        return Weights(stack=precision, experts=precision)

    def kv_bytes_per_token(self, weights: Weights | None = None) -> int:
        """Bytes one token's keys and values take in a driver's KV cache, every decoder layer
        (dense ones included), in the stack's activation dtype (`Weights.kv_bytes`; default
        the published precision)."""
        weights = weights or self.published_weights
        layers = self.moe_layers + self.dense_layers
        return layers * self.attention.kv_width() * weights.kv_bytes()

    def stage_bytes(self, role: str, weights: Weights) -> int:
        """Bytes of one stage of `role` at `weights`: its parameters at the bytes per value of
        its kind (the stack's or the experts'), plus int8's scale per output channel."""
        params = {
            "head": self.head_params,
            "layer": self.layer_params,
            "expert": self.expert_params,
            "tail": self.tail_params,
        }[role]
        precision = weights.of(role)
        return params * BYTES[precision] + scale_bytes(self.stage_rows()[role], precision)

    def manifest(self, weights: Weights | None = None) -> Manifest:
        """A synthetic manifest: the stage sizes an export of this model at `weights` would have
        (default: the published precision, `published_weights`).

        Hidden states travel at the stack's activation width (`Weights.wire_bytes`: bfloat16
        when the stack computes in it, else float32), which `dtype` names too. The fields that
        describe real weights say plainly that there are none (family "shape", no classes).
        """
        weights = weights or self.published_weights
        head, layer, expert, tail = (
            self.stage_bytes(role, weights) for role in ("head", "layer", "expert", "tail")
        )
        stages = [StageEntry(role="head", key=HEAD_KEY, bytes=head)]
        for index in range(self.moe_layers):
            stages.append(StageEntry(role="layer", layer=index, key=layer_key(index), bytes=layer))
            stages.extend(
                StageEntry(
                    role="expert",
                    layer=index,
                    expert=e,
                    key=expert_key(index, e),
                    bytes=expert,
                )
                for e in range(self.experts)
            )
        stages.append(StageEntry(role="tail", key=TAIL_KEY, bytes=tail))
        token_bytes = self.hidden * weights.wire_bytes()
        return Manifest(
            format_version=MANIFEST_VERSION,
            model=self.name,
            model_type=f"shape:{self.model_type}",
            family="shape",
            classes={},
            moefied=False,
            seed=0,
            num_layers=self.moe_layers,
            experts=self.experts,
            top_k=self.top_k,
            weighting="softmax_renorm" if self.norm_topk_prob else "softmax",
            expert_kind="glu" if self.gated else "mlp",
            activation=self.activation,
            hidden_size=self.hidden,
            dtype=ACTIVATION_DTYPE[weights.stack],
            token_bytes_in=token_bytes,
            token_bytes_out=token_bytes,
            stages=stages,
            weights=weights.label(),
        )


class _Builtin(_Frozen):
    """One entry of `data/shapes.json`: the shape and how its numbers were checked."""

    aliases: list[str]
    shape: ModelShape
    derived: dict[str, str]  # shape fields computed from the config rather than copied
    published: dict[str, str]  # the totals the model's authors state, and where
    check: dict[str, int]  # expert/total/active params this module computes (tests hold it)


class _BuiltinFile(_Frozen):
    note: str
    shapes: list[_Builtin]


@cache
def _builtin_file() -> _BuiltinFile:
    text = (resources.files("planner") / "data" / "shapes.json").read_text()
    return _BuiltinFile.model_validate(json.loads(text))


@cache
def _aliases() -> dict[str, ModelShape]:
    return {
        alias.lower(): entry.shape
        for entry in _builtin_file().shapes
        for alias in (entry.shape.name, *entry.aliases)
    }


def builtin_shapes() -> dict[str, ModelShape]:
    """The built-in shapes by their full names."""
    return {entry.shape.name: entry.shape for entry in _builtin_file().shapes}


def load_shape(spec: str) -> ModelShape:
    """A built-in shape by name or alias (any case), or one read from a config.json file.

    Args:
        spec: "olmoe", "mixtral", "qwen-moe", "deepseek-v2-lite", "gpt-oss-20b",
            "qwen3-30b-a3b" (or a full name), or the path of a Hugging Face config.json or of
            the directory holding one.

    Raises:
        UsageError: The name is unknown and no such file exists, or the file cannot be read as
            the config of a supported MoE family.
    """
    shape = _aliases().get(spec.strip().lower())
    if shape is not None:
        return shape
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_config(path)
    names = sorted(_aliases())
    raise UsageError(
        f"'{spec}' is neither a built-in model shape nor a config.json file."
        + did_you_mean(spec.lower(), names),
        f"use one of {', '.join(names)}, or the path of a Hugging Face config.json.",
    )


def shape_from_config(path: str | Path) -> ModelShape:
    """The shape a Hugging Face config.json of a supported MoE family describes.

    Raises:
        UsageError: The file is not JSON, describes a dense model or another family, lacks a
            field, or has dense layers between its MoE layers.
    """
    path = Path(path)
    fix = f"pass the config.json of a model of one of the families {', '.join(FAMILIES)}."
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UsageError(f"cannot read '{path}' as a config.json: {err}.", fix) from err
    if not isinstance(raw, dict):
        raise UsageError(f"'{path}' holds JSON but not a config object.", fix)
    try:
        return _parse_config(
            raw, source=str(path), name=raw.get("_name_or_path") or path.parent.name
        )
    except (KeyError, TypeError, ValidationError) as err:
        raise UsageError(f"'{path}' is not a config this module can read: {err}.", fix) from err


def _parse_config(raw: dict[str, Any], *, source: str, name: str) -> ModelShape:
    """Map one family's config keys onto a shape; KeyError names a missing required key."""
    model_type = raw.get("model_type")
    if not any(raw.get(key) for key in _EXPERT_KEYS):
        raise UsageError(
            f"'{source}' describes a dense model (model_type '{model_type}', none of "
            f"{', '.join(_EXPERT_KEYS)} set): it has no experts to deploy as functions.",
            "moelambda plans Mixture-of-Experts models; pass an MoE config (e.g. Mixtral's), or "
            "MoEfy a dense model with `moelambda` first.",
        )
    if model_type not in FAMILIES:
        raise UsageError(
            f"'{source}' has model_type '{model_type}', whose MoE layout this module does not "
            "know.",
            f"pass a config of one of {', '.join(f'{t} ({c})' for t, c in FAMILIES.items())}, "
            "or a built-in shape name.",
        )
    interleaved = (
        raw.get("moe_layer_freq", 1) != 1
        or raw.get("decoder_sparse_step", 1) != 1
        or bool(raw.get("mlp_only_layers"))
    )
    if interleaved:
        raise UsageError(
            f"'{source}' interleaves dense layers between its MoE layers; a shape holds "
            "leading dense layers only.",
            "use a config with moe_layer_freq / decoder_sparse_step 1 and no mlp_only_layers.",
        )
    experts = next(raw[key] for key in _EXPERT_KEYS if raw.get(key))
    hidden, heads = raw["hidden_size"], raw["num_attention_heads"]
    dense = raw.get("first_k_dense_replace") or 0
    expert_ffn = raw.get("moe_intermediate_size") or raw["intermediate_size"]
    attention: GQAAttention | MLAAttention
    if model_type == "deepseek_v2":
        shared = (raw.get("n_shared_experts") or 0) * expert_ffn
        attention = MLAAttention(
            heads=heads,
            q_lora_rank=raw.get("q_lora_rank") or 0,
            kv_lora_rank=raw["kv_lora_rank"],
            qk_nope_head_dim=raw["qk_nope_head_dim"],
            qk_rope_head_dim=raw["qk_rope_head_dim"],
            v_head_dim=raw["v_head_dim"],
        )
    else:
        shared = raw.get("shared_expert_intermediate_size") or 0
        attention = GQAAttention(
            heads=heads,
            kv_heads=raw.get("num_key_value_heads") or heads,
            head_dim=raw.get("head_dim") or hidden // heads,
            qkv_bias=raw.get("qkv_bias", True)
            if model_type == "qwen2_moe"
            else bool(raw.get("attention_bias", False)),
            o_bias=model_type == "gpt_oss" and bool(raw.get("attention_bias", False)),
            qk_norm=model_type == "olmoe",
            qk_norm_per_head=model_type == "qwen3_moe",
            sinks=model_type == "gpt_oss",
        )
    quantized = (raw.get("quantization_config") or {}).get("quant_method")
    return ModelShape(
        name=name,
        source=source,
        model_type=model_type,
        moe_layers=raw["num_hidden_layers"] - dense,
        dense_layers=dense,
        dense_ffn=raw["intermediate_size"] if dense else 0,
        experts=experts,
        top_k=raw["num_experts_per_tok"],
        hidden=hidden,
        expert_ffn=expert_ffn,
        activation=raw.get("hidden_act", "silu"),
        shared_ffn=shared,
        shared_gate=model_type == "qwen2_moe" and shared > 0,
        norm_topk_prob=model_type in ("mixtral", "gpt_oss") or bool(raw.get("norm_topk_prob")),
        expert_bias=model_type == "gpt_oss",
        router_bias=model_type == "gpt_oss",
        expert_format="mxfp4" if quantized == "mxfp4" else None,
        attention=attention,
        vocab=raw["vocab_size"],
        tied_embeddings=bool(raw.get("tie_word_embeddings", False)),
        # Transformers materialises a config without a dtype in float32; v5 writes "dtype".
        # gpt-oss's config names none: its non-expert tensors are stored in bfloat16.
        dtype=raw.get("torch_dtype")
        or raw.get("dtype")
        or ("bfloat16" if model_type == "gpt_oss" else "float32"),
    )


def shape_counts(
    shape: ModelShape,
    tokens: int,
    popularity: str,
    trace: RoutingTrace | None = None,
    seed: int = 0,
) -> tuple[np.ndarray, dict[str, Any]]:
    """(L, E) expected token-expert pairs in a batch of `tokens` tokens, and what they assume.

    A model without weights has no routing to measure, so popularity is an assumption:

        uniform   every expert gets tokens * top_k / E
        zipf:S    per layer, the r-th most popular expert gets a share proportional to r^-S
        trace     per layer, the sorted expert shares of `trace` (a smaller model's routing)
                  interpolated onto E experts (quantile mapping); layers cycle through the trace's

    Each row sums to tokens * top_k. Which expert is the popular one is unknown, so the order is
    a per-layer permutation drawn from `seed`. A token takes k distinct experts, so no expert can
    see more than `tokens`: shares above 1/top_k are clipped and the excess is spread over the
    other experts in proportion (`label["capped"]` says whether that happened). Only a trace of
    this very shape (same layers, experts and top_k) is taken as it is, unpermuted, and labelled
    `synthetic: False`.

    Raises:
        UsageError: tokens < 1, an unknown popularity or exponent, or a trace missing for
            "trace" or given for another popularity.
    """
    if tokens < 1:
        raise UsageError(f"the batch has {tokens} tokens.", "plan a batch of at least 1 token.")
    kind, _, arg = popularity.partition(":")
    if trace is not None and kind != "trace":
        raise UsageError(
            f"a routing trace was given with popularity '{popularity}', which does not use it.",
            "use popularity 'trace' with a trace, or drop the trace.",
        )
    layers, experts = shape.moe_layers, shape.experts
    rng = np.random.default_rng(seed)
    label: dict[str, Any] = {
        "popularity": popularity,
        "synthetic": True,
        "shape": shape.name,
        "tokens": tokens,
        "seed": seed,
    }
    if kind == "uniform" and not arg:
        shares = np.full((layers, experts), 1.0 / experts)
        label["source"] = f"assumed uniform over {experts} experts"
    elif kind == "zipf":
        exponent = _zipf_exponent(arg)
        curve = np.arange(1, experts + 1, dtype=float) ** -exponent
        shares = _permuted(np.tile(curve / curve.sum(), (layers, 1)), rng)
        label["source"] = f"assumed Zipf shares, exponent {exponent:g}, order drawn by the seed"
    elif kind == "trace" and not arg:
        if trace is None:
            raise UsageError(
                "popularity 'trace' needs a routing trace.",
                "pass the trace directory of a profiled model (`moelambda profile --out DIR`).",
            )
        if trace.num_tokens == 0:
            raise UsageError("the routing trace holds no tokens.", "profile on some text first.")
        popular = trace.popularity().astype(float)
        model = trace.meta.get("model", "unknown model")
        label["trace_model"] = model
        if (trace.num_layers, trace.num_experts, trace.top_k) == (layers, experts, shape.top_k):
            shares = popular / popular.sum(axis=1, keepdims=True)
            label["synthetic"] = shape.synthetic
            label["source"] = f"measured routing of {model}"
        else:
            cycled = popular[np.arange(layers) % trace.num_layers]
            shares = _permuted(_quantile_map(cycled, experts), rng)
            label["source"] = (
                f"skew of {model}'s routing ({trace.num_layers} layers x {trace.num_experts} "
                f"experts, top-{trace.top_k}) mapped onto {layers} x {experts}"
            )
    else:
        raise UsageError(
            f"unknown popularity '{popularity}'.",
            "use uniform, zipf:S (S > 0, e.g. zipf:1.0) or trace.",
        )
    capped = _cap(shares, 1.0 / shape.top_k)
    label["capped"] = bool((capped != shares).any())
    return capped * (tokens * shape.top_k), label


def _zipf_exponent(text: str) -> float:
    try:
        exponent = float(text)
    except ValueError:
        exponent = float("nan")
    if not exponent > 0 or not np.isfinite(exponent):
        raise UsageError(
            f"the Zipf exponent '{text}' is not a positive number.", "write e.g. zipf:1.0."
        )
    return exponent


def _permuted(sorted_shares: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Give each layer's r-th share to a different expert: an independent order per layer."""
    layers, experts = sorted_shares.shape
    order = rng.permuted(np.tile(np.arange(experts), (layers, 1)), axis=1)
    shares = np.empty_like(sorted_shares)
    np.put_along_axis(shares, order, sorted_shares, axis=1)
    return shares


def _quantile_map(popular: np.ndarray, experts: int) -> np.ndarray:
    """Each row's descending share curve sampled at E evenly spaced quantiles, renormalised.

    The source's m experts sit at quantiles (j + 0.5) / m and the target's at (i + 0.5) / E;
    values between are interpolated linearly and held flat beyond the ends, so the most popular
    expert keeps its share relative to the mean (the skew) when E > m.
    """
    curve = -np.sort(-popular, axis=1)
    curve /= curve.sum(axis=1, keepdims=True)
    m = curve.shape[1]
    at = np.interp((np.arange(experts) + 0.5) / experts, (np.arange(m) + 0.5) / m, np.arange(m))
    low = np.floor(at).astype(int)
    high = np.minimum(low + 1, m - 1)
    weight = at - low
    mapped = curve[:, low] * (1.0 - weight) + curve[:, high] * weight
    return mapped / mapped.sum(axis=1, keepdims=True)


def _cap(shares: np.ndarray, cap: float) -> np.ndarray:
    """Clip shares at `cap` and pour the excess into the unclipped experts, in proportion.

    Each pass pins at least one more expert at the cap and the rows keep their sums, so it ends
    within E passes; E * cap >= 1 (top_k <= E) guarantees room. Experts with no share take
    an equal part only when every unpinned expert has none.
    """
    out = shares.copy()
    for _ in range(out.shape[1]):
        over = out > cap
        if not over.any():
            break
        excess = np.where(over, out - cap, 0.0).sum(axis=1, keepdims=True)
        out = np.minimum(out, cap)
        free = out < cap
        room = np.where(free, out, 0.0)
        total = room.sum(axis=1, keepdims=True)
        even = free / np.maximum(free.sum(axis=1, keepdims=True), 1)
        weights = np.divide(room, total, out=even, where=total > 0)
        out += excess * weights
    return out
