"""Generation through a deployment on moto with the real handlers: the driver's prefill and
KV-cache decode equal the model's own decode token for token, whether its experts are all
local, all remote or mixed, and its metered requests equal the plan's (`ground.generation`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from ground.plan import Plan
from moe import GenerationConfig, load_model
from moelambda.cli import app
from predictor import PredictedCounts
from runtime.generate import generate_locally

runner = CliRunner()
PROMPTS = ["the experts of a driver", "a second prompt, longer than the first one is"]


def _plan(
    tmp: Path,
    model: str,
    experts: int,
    layers: int,
    deployment: str,
    moefy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`plan --counts` of `model`; `moefy` names the MoEfication the counts are of, which the
    command loads (from the cache when the test loaded the same model before)."""
    tmp.mkdir(exist_ok=True)
    counts = tmp / f"counts-{deployment}.json"
    shares = np.random.default_rng(0).dirichlet(np.ones(experts), size=layers)
    PredictedCounts(
        model=model,
        experts=experts,
        top_k=2,
        moefy=moefy,
        tokens=256,
        method="test",
        counts=(shares * 512).round(2).tolist(),
    ).save(counts)
    out = tmp / f"{deployment}.json"
    made = runner.invoke(
        app,
        ["plan", "--counts", str(counts), "--tokens", "256", "--deployment", deployment]
        + ["--out", str(out), "--force"],
    )
    assert made.exit_code == 0, made.output
    return json.loads(out.read_text())


def _remote(doc: dict[str, Any], layer: int, experts: list[int]) -> None:
    """Move `experts` of `layer` out of the driver onto functions of their own (2 replicas
    each: a decode step still invokes one)."""
    local = doc["driver"]["local"][layer]
    tokens = doc["driver"]["local_tokens"][layer]
    hosted = [e["hosts"][0] for e in doc["layers"][layer]["experts"]]
    for i in experts:
        if i in local:
            del tokens[local.index(i)]
            local.remove(i)
            hosted.append(i)
    doc["layers"][layer]["experts"] = [
        {
            "expert": slot,
            "hosts": [i],
            "memory_mb": 1536,
            "replicas": 2,
            "tokens": 10.0,
            "time_s": 0.1,
            "cost_usd": 0.0,
            "max_replicas": 8,
            "max_tokens_per_replica": 100_000,
        }
        for slot, i in enumerate(sorted(hosted))
    ]


def _write(tmp: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp / f"{name}-edited.json"
    path.write_text(json.dumps(Plan.model_validate(doc).model_dump(mode="json")))
    return path


@pytest.mark.parametrize(
    ("kind", "placement"),
    [("mixtral", "mixed"), ("olmoe", "remote"), ("llama", "local")],
)
def test_a_deployment_generates_what_the_model_generates_and_bills_what_it_planned(
    kind: str, placement: str, tiny_dirs: dict[str, Path], tmp_path: Path
) -> None:
    path = str(tiny_dirs[kind])
    native = kind != "llama"
    # The MoEfied tiny Llama without its quality measurement (nothing here reads it; measured on
    # the default 16,384 held-out tokens over its 30,522-word vocabulary it took 1-2 minutes on
    # 2 cores). It is cached, and the plan names its MoEfication: `plan` loads the same model
    # from the cache instead of converting the tiny Llama again with the default fit.
    model = (
        load_model(path, experts=None, top_k=None)
        if native
        else load_model(path, experts=4, top_k=2, fit_tokens=256, quality_tokens=0)
    )
    moefy = None if model.options is None else model.options.describe()
    deployment = "monolithic" if placement == "local" else "driver"
    doc = _plan(tmp_path, path, 4, model.num_layers, deployment, moefy)
    if placement == "remote":
        for layer in range(model.num_layers):
            _remote(doc, layer, [0, 1, 2, 3])
    elif placement == "mixed":
        _remote(doc, 0, [1, 3])
    plan = _write(tmp_path, placement, doc)
    settings = GenerationConfig(max_new_tokens=12)
    streamed: dict[int, str] = {}

    def on_text(b: int, text: str) -> None:
        streamed[b] = streamed.get(b, "") + text

    summary = generate_locally(plan, model, PROMPTS, settings, on_text=on_text)
    assert summary["status"] == "SUCCEEDED"
    ids = [model.tokenizer(p, add_special_tokens=False)["input_ids"] for p in PROMPTS]
    expected = model.generate(ids, settings)
    outputs = summary["outputs"]
    assert [o["token_ids"] for o in outputs] == [g.token_ids for g in expected]
    assert [o["text"] for o in outputs] == [g.text for g in expected]
    assert [streamed.get(b, "") for b in range(2)] == [o["text"] for o in outputs]
    metered, planned = summary["requests"]["metered"], summary["requests"]["planned"]
    assert metered == planned
    assert summary["decode_steps"] == 11 and metered["transitions"] == 1
    if placement == "local":
        assert metered["lambda_requests"] == 1  # one function, no Invoke at all
    else:
        # decode steps invoked remote experts: far more requests than the prefill's
        assert metered["lambda_requests"] > 1 + 11
    assert summary["bill_usd"] > 0
    assert all(o["ttft_s"] > 0 and o["tpot_s"] > 0 for o in outputs)


@pytest.fixture(scope="module")
def minilm_plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("encoder")
    return {d: _write(tmp, d, _plan(tmp, "minilm", 4, 6, d)) for d in ("monolithic", "workflow")}


@pytest.mark.parametrize(
    ("plan", "args", "message"),
    [
        ("monolithic", ["--prompt", "hello"], "encoder"),
        ("workflow", ["--prompt", "hello"], "encoder"),
        ("monolithic", ["--prompt", "hello", "--max-new-tokens", "0"], "--max-new-tokens"),
        ("monolithic", [], "no prompt"),
        ("monolithic", ["--prompt", "a", "--prompts", "x.txt"], "both"),
        ("monolithic", ["--prompt", "hi", "--top-p", "0"], "--top-p"),
    ],
)
def test_generate_refuses_what_it_cannot_do(
    plan: str, args: list[str], message: str, minilm_plans: dict[str, Path], tmp_path: Path
) -> None:
    before = set(tmp_path.iterdir())
    result = runner.invoke(app, ["generate", "--plan", str(minilm_plans[plan]), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert set(tmp_path.iterdir()) == before  # nothing written


def test_a_decoder_refuses_an_empty_prompt_a_long_one_and_the_fan_out(
    tiny_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from ground.errors import UsageError
    from runtime.generate import check_generation

    path = str(tiny_dirs["mixtral"])
    model = load_model(path, experts=None, top_k=None)
    driver = Plan.load(_write(tmp_path, "d", _plan(tmp_path, path, 4, 2, "driver")))
    workflow = Plan.load(_write(tmp_path, "w", _plan(tmp_path, path, 4, 2, "workflow")))
    ok = GenerationConfig(max_new_tokens=4)
    assert check_generation(driver, model, ["hello"], ok)
    with pytest.raises(UsageError, match="empty"):
        check_generation(driver, model, ["hello", "  "], ok)
    with pytest.raises(UsageError, match="context of 256"):
        check_generation(driver, model, ["hello"], GenerationConfig(max_new_tokens=256))
    with pytest.raises(UsageError, match="fan-out"):
        check_generation(workflow, model, ["hello"], ok)
    # At a 10 s Invoke round trip every step waits 10 s on layer 0's remote expert (10.006 s
    # with its rows both ways and its compute): 128 tokens would outlast Lambda's 900 s, and
    # the fix names how many fit (1 + 88 steps).
    slow = _plan(tmp_path / "slow", path, 4, 2, "driver")
    slow["calibration"]["invoke_round_trip_s"] = 10.0
    slow["workflow"] = "standard"  # an Express plan is held to 300 s instead (test_bad_inputs)
    slow_plan = Plan.load(_write(tmp_path, "slow", slow))
    assert check_generation(slow_plan, model, ["hello"], GenerationConfig(max_new_tokens=64))
    with pytest.raises(UsageError, match=r"900 s timeout[\s\S]*--max-new-tokens 89 or fewer"):
        check_generation(slow_plan, model, ["hello"], GenerationConfig(max_new_tokens=128))
