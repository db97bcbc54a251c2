"""Model core: MoEfication of dense transformers, native MoE models, stage split, weight export,
and the served model's quality against the dense one.

Predictor, functions and pipeline all use the model through this package only.
"""

from __future__ import annotations

from ground.manifest import Manifest, StageEntry, expert_key, layer_key
from moe._batching import ContinuousBatch, Emitted, TextStream
from moe._cache import default_cache_dir, load_exported, load_model
from moe._corpus import (
    TEST_TOKENS,
    VALIDATION_TOKENS,
    Corpus,
    check_fit_text,
    load_corpus,
    make_windows,
    part_sizes,
    partition,
    training_windows,
)
from moe._decode_context import DecodeContext
from moe._experts import (
    ExpertBank,
    Router,
    SharedExpert,
    expert_ffn,
    gather_shards,
    routing_shards,
)
from moe._export import describe_model, export_model
from moe._generate import (
    Generated,
    GenerationConfig,
    Step,
    eos_ids,
    generate_tokens,
    generation_request,
)
from moe._int8 import cpu_bf16
from moe._model import build_model, moefy_options
from moe._moe_model import LayerRouting, MoEModel
from moe._moefy import LayerFit
from moe._options import EXPERT_CHOICES, MoefyOptions, TopK, parse_top_k
from moe._placement import check_device, check_precision, on_host, place, torch_dtype
from moe._precision import at_precision
from moe._quality import (
    QUALITY_TOKENS,
    QUALITY_WINDOW,
    Quality,
    dense_reference,
    measure_quality,
    quality_of,
)
from moe._registry import BUILTIN_MODELS, ModelSource, resolve_model
from moe._stages import (
    ExpertCall,
    ExpertStage,
    LayerOutput,
    LayerStage,
    StageLoader,
    Stages,
    local_experts,
    run_staged,
    run_stages,
)

__all__ = [
    "BUILTIN_MODELS",
    "ContinuousBatch",
    "Corpus",
    "DecodeContext",
    "EXPERT_CHOICES",
    "Emitted",
    "ExpertBank",
    "ExpertCall",
    "ExpertStage",
    "Generated",
    "GenerationConfig",
    "LayerFit",
    "LayerOutput",
    "LayerRouting",
    "LayerStage",
    "Manifest",
    "ModelSource",
    "MoEModel",
    "MoefyOptions",
    "QUALITY_TOKENS",
    "TEST_TOKENS",
    "VALIDATION_TOKENS",
    "QUALITY_WINDOW",
    "Quality",
    "Router",
    "SharedExpert",
    "StageEntry",
    "StageLoader",
    "Stages",
    "Step",
    "TextStream",
    "TopK",
    "at_precision",
    "build_model",
    "check_device",
    "check_precision",
    "cpu_bf16",
    "check_fit_text",
    "default_cache_dir",
    "dense_reference",
    "describe_model",
    "expert_ffn",
    "expert_key",
    "export_model",
    "gather_shards",
    "eos_ids",
    "generate_tokens",
    "generation_request",
    "layer_key",
    "load_corpus",
    "load_exported",
    "load_model",
    "local_experts",
    "make_windows",
    "part_sizes",
    "partition",
    "measure_quality",
    "moefy_options",
    "on_host",
    "place",
    "parse_top_k",
    "quality_of",
    "resolve_model",
    "routing_shards",
    "run_staged",
    "run_stages",
    "torch_dtype",
    "training_windows",
]
