"""Model shapes: published sizes, config.json parsing, assumed popularity, and planning."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ground.errors import UsageError
from planner.build import instance_for
from planner.calibration import load_calibration
from planner.shapes import (
    GQAAttention,
    ModelShape,
    builtin_shapes,
    load_shape,
    shape_counts,
    shape_from_config,
)
from predictor._trace import RoutingTrace

# Totals the models' authors publish (total, active parameters) and the tolerance on the total.
PUBLISHED = {
    "olmoe": (6.9e9, 1.3e9, 0.05),
    "mixtral": (46.7e9, 12.9e9, 0.05),
    "qwen-moe": (14.3e9, 2.7e9, 0.10),
    "deepseek-v2-lite": (15.7e9, None, 0.10),  # its 2.4B active leaves out the embeddings
}

# The MoE-relevant keys of each family's published config.json, as Hugging Face serves them.
CONFIGS: dict[str, dict[str, Any]] = {
    "olmoe": {
        "architectures": ["OlmoeForCausalLM"],
        "model_type": "olmoe",
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 1024,
        "num_attention_heads": 16,
        "num_experts": 64,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 16,
        "num_key_value_heads": 16,
        "norm_topk_prob": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 50304,
    },
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "model_type": "mixtral",
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "num_local_experts": 8,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 32000,
    },
    "qwen-moe": {
        "architectures": ["Qwen2MoeForCausalLM"],
        "model_type": "qwen2_moe",
        "decoder_sparse_step": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "moe_intermediate_size": 1408,
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts": 60,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_key_value_heads": 16,
        "shared_expert_intermediate_size": 5632,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    },
    "deepseek-v2-lite": {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "first_k_dense_replace": 1,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "kv_lora_rank": 512,
        "moe_intermediate_size": 1408,
        "moe_layer_freq": 1,
        "n_routed_experts": 64,
        "n_shared_experts": 2,
        "norm_topk_prob": False,
        "num_attention_heads": 16,
        "num_experts_per_tok": 6,
        "num_hidden_layers": 27,
        "num_key_value_heads": 16,
        "q_lora_rank": None,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
        "vocab_size": 102400,
    },
}


def _write(tmp_path: Path, config: dict[str, Any]) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


def _tiny(**update: Any) -> ModelShape:
    fields: dict[str, Any] = {
        "name": "tiny",
        "source": "test",
        "model_type": "mixtral",
        "moe_layers": 2,
        "experts": 8,
        "top_k": 2,
        "hidden": 64,
        "expert_ffn": 128,
        "attention": GQAAttention(heads=4, kv_heads=2, head_dim=16),
        "vocab": 100,
        "tied_embeddings": True,
        "dtype": "float32",
    }
    return ModelShape(**(fields | update))


def _routing(chosen: np.ndarray, experts: int) -> RoutingTrace:
    """A trace whose (L, N, k) expert picks are `chosen`; the token features do not matter."""
    layers, n, top_k = chosen.shape
    return RoutingTrace(
        meta={"model": "tiny-trace", "experts": experts},
        token_ids=np.zeros(n, np.int32),
        position_ids=np.zeros(n, np.int16),
        window_ids=np.zeros(n, np.int32),
        attention_ids=np.zeros((layers, n), np.int32),
        experts=chosen.astype(np.uint8),
        probs=np.zeros((layers, n, top_k), np.float16),
    )


def _trace(
    layers: int, experts: int, top_k: int, alpha: float | np.ndarray, seed: int = 1
) -> RoutingTrace:
    """Tokens picking top_k distinct experts with Zipf(alpha) odds (Gumbel top-k sampling);
    an array gives each layer its own alpha."""
    rng = np.random.default_rng(seed)
    alphas = np.broadcast_to(alpha, (layers,))[:, None, None]
    logits = -alphas * np.log(np.arange(1, experts + 1))
    scores = logits + rng.gumbel(size=(layers, 4000, experts))
    return _routing(np.argsort(-scores, axis=2)[:, :, :top_k], experts)


def _skew(rows: np.ndarray) -> np.ndarray:
    return rows.max(axis=1) / rows.mean(axis=1)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_param_totals_match_the_published_ones(name: str) -> None:
    shape = load_shape(name)
    total, active, tolerance = PUBLISHED[name]
    assert shape.total_params() == pytest.approx(total, rel=tolerance)
    if active is not None:
        assert shape.active_params() == pytest.approx(active, rel=0.05)


def test_mixtral_expert_is_three_bf16_matrices() -> None:
    manifest = load_shape("mixtral").manifest()
    sizes = np.array(manifest.expert_bytes())
    assert sizes.shape == (32, 8)
    assert (sizes == 3 * 4096 * 14336 * 2).all()


def test_shapes_json_checks_match_this_module() -> None:
    raw = json.loads((resources.files("planner") / "data" / "shapes.json").read_text())
    assert "no network" in raw["note"]
    for entry in raw["shapes"]:
        shape = load_shape(entry["shape"]["name"])
        assert shape.source.startswith("https://huggingface.co/")
        assert shape.source.endswith("/config.json") and shape.as_of
        assert entry["check"] == {
            "expert_params": shape.expert_params,
            "total_params": shape.total_params(),
            "active_params": shape.active_params(),
        }


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_json_round_trip(name: str, tmp_path: Path) -> None:
    parsed = load_shape(str(_write(tmp_path, CONFIGS[name])))
    ignore = {"name", "source", "as_of"}
    assert parsed.model_dump(exclude=ignore) == load_shape(name).model_dump(exclude=ignore)
    assert parsed.source == str(tmp_path / "config.json") and parsed.name == tmp_path.name
    assert load_shape(str(tmp_path)) == parsed  # the directory holding it works too


def test_aliases_are_case_insensitive() -> None:
    names = builtin_shapes()
    assert set(names) == {
        "OLMoE-1B-7B-0924",
        "Mixtral-8x7B-v0.1",
        "Qwen1.5-MoE-A2.7B",
        "DeepSeek-V2-Lite",
        "gpt-oss-20b",
        "Qwen3-30B-A3B",
    }
    assert load_shape("MIXTRAL") is load_shape("mixtral-8x7b-v0.1") is names["Mixtral-8x7B-v0.1"]
    assert load_shape(" Qwen-MoE ").experts == 60
    deepseek = load_shape("DeepSeek-V2-Lite")
    assert (deepseek.moe_layers, deepseek.dense_layers, deepseek.shared_ffn) == (26, 1, 2816)


def test_unknown_name_lists_the_builtins() -> None:
    with pytest.raises(UsageError) as err:
        load_shape("mixtrall")
    assert "Did you mean 'mixtral'" in str(err.value)
    assert "olmoe" in err.value.fix and "deepseek-v2-lite" in err.value.fix


def test_unreadable_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(UsageError, match="cannot read"):
        shape_from_config(path)
    path.write_text("[1, 2]")
    with pytest.raises(UsageError, match="not a config object"):
        shape_from_config(path)


def test_dense_config_is_refused(tmp_path: Path) -> None:
    llama = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32}
    with pytest.raises(UsageError, match="dense model"):
        load_shape(str(_write(tmp_path, llama)))


def test_unknown_family_missing_key_and_interleaving_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="jamba"):
        shape_from_config(_write(tmp_path, CONFIGS["qwen-moe"] | {"model_type": "jamba"}))
    missing = {k: v for k, v in CONFIGS["mixtral"].items() if k != "hidden_size"}
    with pytest.raises(UsageError, match="hidden_size"):
        shape_from_config(_write(tmp_path, missing))
    with pytest.raises(UsageError, match="interleaves"):
        shape_from_config(_write(tmp_path, CONFIGS["qwen-moe"] | {"decoder_sparse_step": 2}))
    with pytest.raises(UsageError, match="top_k"):
        shape_from_config(_write(tmp_path, CONFIGS["mixtral"] | {"num_experts_per_tok": 9}))


def test_manifest_stages_follow_the_export_layout() -> None:
    shape = load_shape("qwen-moe")
    manifest = shape.manifest()
    assert len(manifest.stages) == 2 + 24 * (1 + 60)
    assert len({stage.key for stage in manifest.stages}) == len(manifest.stages)
    assert manifest.stages[0].key == "head.safetensors"
    assert manifest.stages[-1].key == "tail.safetensors"
    assert (manifest.dtype, manifest.token_bytes_in, manifest.model) == (
        "bfloat16",
        2048 * 2,  # published in bfloat16: its stack computes, and sends hidden states, in it
        "Qwen1.5-MoE-A2.7B",
    )
    assert manifest.weights == "bf16"
    assert manifest.family == "shape" and manifest.model_type == "shape:qwen2_moe"
    total_bytes = sum(stage.bytes for stage in manifest.stages)
    assert total_bytes == 2 * shape.total_params()  # untied: the tail's LM head is its own


@pytest.mark.parametrize("name", sorted(builtin_shapes()))
def test_every_builtin_plans(name: str) -> None:
    shape = load_shape(name)
    counts, label = shape_counts(shape, 10240, "zipf:1.0", seed=3)
    inst = instance_for(shape.manifest(), counts, load_calibration(), tokens=10240)
    assert inst.counts.shape == (shape.moe_layers, shape.experts)
    assert inst.meta["model"] == shape.name and label["synthetic"]


@pytest.mark.parametrize("popularity", ["uniform", "zipf:0.5", "zipf:3"])
def test_rows_sum_to_tokens_times_k_and_no_expert_exceeds_the_batch(popularity: str) -> None:
    shape = load_shape("olmoe")
    counts, label = shape_counts(shape, 1000, popularity)
    assert counts.shape == (16, 64)
    np.testing.assert_allclose(counts.sum(axis=1), 1000 * 8)
    assert counts.max() <= 1000 * (1 + 1e-12)
    assert label["synthetic"] and label["popularity"] == popularity
    assert label["capped"] == (popularity == "zipf:3")


def test_zipf_shares_follow_the_power_law() -> None:
    counts, label = shape_counts(load_shape("qwen-moe"), 4096, "zipf:1.0", seed=7)
    ranked = -np.sort(-counts, axis=1)
    ranks = np.arange(1, 61)
    np.testing.assert_allclose(ranked / ranked[:, :1], np.tile(ranks**-1.0, (24, 1)))
    assert not label["capped"]
    assert len({tuple(np.argsort(row)) for row in counts}) > 1  # each layer its own order


def test_seed_decides_the_order() -> None:
    shape = load_shape("deepseek-v2-lite")
    first, _ = shape_counts(shape, 512, "zipf:1.0", seed=5)
    again, _ = shape_counts(shape, 512, "zipf:1.0", seed=5)
    other, _ = shape_counts(shape, 512, "zipf:1.0", seed=6)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    np.testing.assert_allclose(np.sort(first, axis=1), np.sort(other, axis=1))


def test_trace_mapping_keeps_the_skew_and_cycles_layers() -> None:
    trace = _trace(layers=3, experts=8, top_k=2, alpha=np.array([0.3, 1.0, 1.6]))
    source = trace.popularity().astype(float)
    assert np.ptp(_skew(source)) > 0.5  # the layers differ, so cycling them is visible
    counts, label = shape_counts(load_shape("olmoe"), 2048, "trace", trace=trace, seed=2)
    np.testing.assert_allclose(counts.sum(axis=1), 2048 * 8)
    layer_of = np.arange(16) % 3
    np.testing.assert_allclose(_skew(counts), _skew(source)[layer_of], rtol=0.08)
    ranked = -np.sort(-counts, axis=1)
    np.testing.assert_allclose(ranked[3:6], ranked[0:3])  # layer 3 comes from trace layer 0
    assert not label["capped"]
    assert label["synthetic"] and label["trace_model"] == "tiny-trace"
    again, _ = shape_counts(load_shape("olmoe"), 2048, "trace", trace=trace, seed=2)
    np.testing.assert_array_equal(counts, again)


def test_trace_of_the_same_shape_is_measured() -> None:
    trace = _trace(layers=2, experts=8, top_k=2, alpha=0.5)
    counts, label = shape_counts(_tiny(), 1000, "trace", trace=trace, seed=9)
    np.testing.assert_allclose(counts, trace.popularity() * 1000 / trace.num_tokens)
    assert label["synthetic"] is False
    _, made_up = shape_counts(_tiny(synthetic=True), 1000, "trace", trace=trace)
    assert made_up["synthetic"] is True


def test_popularity_errors() -> None:
    shape, trace = _tiny(), _trace(layers=2, experts=4, top_k=1, alpha=1.0)
    for popularity in ("pareto", "zipf:-1", "zipf:abc", "zipf:", "uniform:2"):
        with pytest.raises(UsageError):
            shape_counts(shape, 100, popularity)
    with pytest.raises(UsageError, match="needs a routing trace"):
        shape_counts(shape, 100, "trace")
    with pytest.raises(UsageError, match="does not use it"):
        shape_counts(shape, 100, "uniform", trace=trace)
    with pytest.raises(UsageError, match="at least 1 token"):
        shape_counts(shape, 0, "uniform")


def test_cap_spreads_the_excess_over_idle_experts() -> None:
    """Every token of a 64-expert top-8 model takes experts 0-7: mapped onto Mixtral's 8
    experts, one expert would get every pair, twice what a top-2 batch can give it."""
    trace = _routing(np.tile(np.arange(8), (2, 100, 1)), experts=64)
    counts, label = shape_counts(load_shape("mixtral"), 700, "trace", trace=trace)
    ranked = -np.sort(-counts, axis=1)
    np.testing.assert_allclose(ranked[:, 0], 700)
    np.testing.assert_allclose(ranked[:, 1:], 700 / 7)
    assert label["capped"]
