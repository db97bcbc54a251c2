"""Model core: MoEfication of dense transformers, native MoE models, stage split, weight export.

Predictor, functions and pipeline all use the model through this package only.
"""

from __future__ import annotations

from ground.manifest import Manifest, StageEntry, expert_key, layer_key
from moe._cache import default_cache_dir, load_exported, load_model
from moe._experts import ExpertBank, Router, expert_ffn, gather_shards, routing_shards
from moe._export import describe_model, export_model
from moe._model import EXPERT_CHOICES, TOP_K_CHOICES, LayerRouting, MoEModel, build_model
from moe._moefy import LayerFit
from moe._registry import BUILTIN_MODELS, ModelSource, resolve_model
from moe._stages import ExpertStage, LayerOutput, LayerStage, StageLoader, run_staged

__all__ = [
    "BUILTIN_MODELS",
    "EXPERT_CHOICES",
    "TOP_K_CHOICES",
    "ExpertBank",
    "ExpertStage",
    "LayerFit",
    "LayerOutput",
    "LayerRouting",
    "LayerStage",
    "Manifest",
    "ModelSource",
    "MoEModel",
    "Router",
    "StageEntry",
    "StageLoader",
    "build_model",
    "default_cache_dir",
    "expert_ffn",
    "expert_key",
    "describe_model",
    "export_model",
    "gather_shards",
    "layer_key",
    "load_exported",
    "load_model",
    "resolve_model",
    "routing_shards",
    "run_staged",
]
