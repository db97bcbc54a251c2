"""The two MoE shapes people serve in 2026, gpt-oss-20b and Qwen3-30B-A3B: their published
sizes, their config.json files parsed to the built-ins, and `plan --shape NAME` on each.

The parameter totals pinned here equal those of transformers 5.23's GptOssForCausalLM and
Qwen3MoeForCausalLM built on the meta device from the same configs (checked when the shapes
were recorded; planner/data/shapes.json's note)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ground.precision import parse_weights
from moelambda.cli import app
from planner.shapes import load_shape

# The published config.json files' keys (Hugging Face, as transcribed: shapes.json's `derived`).
GPT_OSS_20B: dict[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "attention_bias": True,
    "experts_per_token": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "model_type": "gpt_oss",
    "num_attention_heads": 64,
    "num_experts_per_tok": 4,
    "num_hidden_layers": 24,
    "num_key_value_heads": 8,
    "num_local_experts": 32,
    "quantization_config": {
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
        "quant_method": "mxfp4",
    },
    "sliding_window": 128,
    "swiglu_limit": 7.0,
    "tie_word_embeddings": False,
    "vocab_size": 201088,
}
QWEN3_30B_A3B: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "decoder_sparse_step": 1,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "vocab_size": 151936,
}


def test_gpt_oss_20b_matches_its_model_card() -> None:
    shape = load_shape("gpt-oss-20b")
    assert (shape.moe_layers, shape.experts, shape.top_k) == (24, 32, 4)
    # model card table 1: 20.91B in all; 3.61B active without the 0.58B embedding table
    assert shape.total_params() == 20_914_757_184
    embedding = shape.vocab * shape.hidden
    assert (shape.active_params() - embedding) / 1e9 == pytest.approx(3.61, abs=0.005)
    # MLP 19.12B: 24 layers x 32 experts of gate/up, down and their biases
    assert shape.moe_layers * shape.experts * shape.expert_params / 1e9 == pytest.approx(
        19.12, abs=0.005
    )
    # its experts are published in MXFP4, which no precision here stores: priced at bf16
    assert shape.expert_format == "mxfp4" and shape.published_weights.label() == "bf16"
    assert shape.manifest().expert_bytes()[0][0] == 2 * shape.expert_params
    int8 = shape.manifest(parse_weights("experts=int8"))
    assert int8.expert_bytes()[0][0] < shape.manifest().expert_bytes()[0][0] * 0.51


def test_qwen3_30b_a3b_matches_its_model_card() -> None:
    shape = load_shape("Qwen/Qwen3-30B-A3B")
    assert (shape.moe_layers, shape.experts, shape.top_k, shape.expert_ffn) == (48, 128, 8, 768)
    assert shape.total_params() == 30_532_122_624  # 30.5B
    assert shape.active_params() / 1e9 == pytest.approx(3.3, rel=0.02)  # 3.3B activated
    non_embedding = shape.total_params() - 2 * shape.vocab * shape.hidden
    assert non_embedding / 1e9 == pytest.approx(29.9, abs=0.05)
    # grouped-query attention: 4 key/value heads of 128 in bf16, 48 layers
    assert shape.kv_bytes_per_token() == 48 * 2 * 4 * 128 * 2


@pytest.mark.parametrize(
    ("name", "config"), [("gpt-oss-20b", GPT_OSS_20B), ("qwen3-30b-a3b", QWEN3_30B_A3B)]
)
def test_their_config_json_parses_to_the_builtin(
    name: str, config: dict[str, Any], tmp_path: Path
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    ignore = {"name", "source", "as_of"}
    parsed = load_shape(str(path))
    assert parsed.model_dump(exclude=ignore) == load_shape(name).model_dump(exclude=ignore)


@pytest.mark.parametrize("name", ["gpt-oss-20b", "qwen3-30b-a3b"])
def test_plan_shape_generates(name: str, tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["plan", "--shape", name, "--concurrency-quota", "100000"]
    args += ["--slo-ttft", "300", "--slo-tpot", "5", "--json", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["model"] == load_shape(name).name
    plan = json.loads(out.read_text())
    assert plan["generation"]["tpot_s"] <= 5
