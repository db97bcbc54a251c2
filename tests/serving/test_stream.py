"""A stream plan served on moto with the real handlers, behind `moelambda serve`'s endpoint:
requests arriving at different times and batched together by the workers get what each gets
decoded alone, token for token; streamed text equals the final text; the requests billed per
answer equal the plan's (`ground.stream.request_usage`); a worker that dies loses no request
and answers none twice; a bad request gets OpenAI's error and the others go on."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest
from botocore.exceptions import ClientError
from typer.testing import CliRunner

from functions import config
from ground import stream
from ground.plan import Plan, StreamPlan
from moe import ContinuousBatch, GenerationConfig, MoEModel, load_model
from moelambda.cli import app
from predictor import PredictedCounts
from runtime.serve import LocalServer

runner = CliRunner()
FLUSH = 4


@pytest.fixture(scope="module")
def tiny(tiny_dirs: dict[str, Path]) -> MoEModel:
    return load_model(str(tiny_dirs["mixtral"]), experts=None, top_k=None)


def _stream_plan(tmp: Path, model: MoEModel, slots: int, workers: int) -> Path:
    """A monolithic generating plan of `model` (`plan --counts`) with a stream block written
    by hand: what the stack and its handlers need, not what the planner would choose."""
    counts = tmp / "counts.json"
    shares = np.random.default_rng(0).dirichlet(np.ones(model.experts), size=model.num_layers)
    PredictedCounts(
        model=model.name,
        experts=model.experts,
        top_k=model.top_k,
        tokens=256,
        method="test",
        counts=(shares * 512).round(2).tolist(),
    ).save(counts)
    out = tmp / "plan.json"
    made = runner.invoke(
        app,
        ["plan", "--counts", str(counts), "--tokens", "256", "--deployment", "monolithic"]
        + ["--slo-ttft", "100", "--slo-tpot", "5", "--out", str(out), "--force"],
    )
    assert made.exit_code == 0, made.output
    plan = Plan.load(out)
    block = StreamPlan(
        traffic={"spec": "test"},
        slots=slots,
        workers=workers,
        idle_exit_s=0.5,
        prefill_chunk_tokens=8,
        flush_tokens=FLUSH,
        poll_s=0.02,
        max_prompt_tokens=64,
        max_new_tokens=24,
        visibility_timeout_s=900,
        step_s=[0.01] * slots,
        prefill_token_s=0.001,
        slo_ttft_s=10,
        slo_tpot_s=1,
        simulated={},
    )
    return plan.model_copy(update={"stream": block}).save(out, force=True)


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _events(raw: bytes) -> list[dict[str, Any]]:
    data = [line[6:] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def _final(server: LocalServer, answer_id: str) -> dict[str, Any]:
    assert server.stack is not None
    key = stream.final_key(answer_id.split("-", 1)[1])
    s3 = boto3.client("s3", region_name="us-east-1")
    return json.loads(s3.get_object(Bucket=server.stack.bucket, Key=key)["Body"].read())


def _prompts(count: int) -> list[list[int]]:
    g = np.random.default_rng(5)
    return [g.integers(1000, 9000, int(n)).tolist() for n in g.integers(2, 30, count)]


def test_sixteen_requests_batched_by_the_workers_get_what_each_gets_alone(
    tiny: MoEModel, tmp_path: Path
) -> None:
    prompts = _prompts(16)
    new = [int(n) for n in np.random.default_rng(6).integers(1, 24, 16)]
    alone = [
        tiny.generate([p], GenerationConfig(max_new_tokens=n))[0]
        for p, n in zip(prompts, new, strict=True)
    ]
    plan = _stream_plan(tmp_path, tiny, slots=6, workers=2)
    answers: dict[int, tuple[int, bytes]] = {}
    peak = [0]
    original = ContinuousBatch.step

    def watched(batch: ContinuousBatch) -> Any:
        peak[0] = max(peak[0], batch.decoding)
        return original(batch)

    with pytest.MonkeyPatch.context() as patch, LocalServer(plan, tiny, port=0) as server:
        patch.setattr(ContinuousBatch, "step", watched)

        def send(k: int) -> None:
            body = {"prompt": prompts[k], "max_tokens": new[k], "temperature": 0}
            answers[k] = _post(server.url + "/v1/completions", body | {"stream": k % 2 == 0})

        threads = [threading.Thread(target=send, args=(k,)) for k in range(16)]
        for k, thread in enumerate(threads):
            thread.start()
            if k % 4 == 3:
                time.sleep(0.3)  # four waves: later ones join running batches
        for thread in threads:
            thread.join()
        assert server.stack is not None and server.stack.idle(60)
        finals = {}
        for k in range(16):
            status, raw = answers[k]
            assert status == 200, raw
            if k % 2 == 0:
                events = _events(raw)
                text = "".join(e["choices"][0]["text"] for e in events)
                answer_id = events[0]["id"]
                assert events[-1]["choices"][0]["finish_reason"] in ("stop", "length")
            else:
                body = json.loads(raw)
                text, answer_id = body["choices"][0]["text"], body["id"]
                assert body["usage"]["completion_tokens"] == len(alone[k].token_ids)
            finals[k] = _final(server, answer_id)
            assert finals[k]["token_ids"] == alone[k].token_ids, k
            assert text == finals[k]["text"] == alone[k].text, k
        metered = server.stack.meter.snapshot()
        invocations = list(server.stack.invocations)
        policies = server.stack.lambdas.policies
        assert policies is not None and policies.denied == []  # least privilege was enough
    assert peak[0] >= 3  # requests really shared decode steps
    planned = stream.request_usage([len(f["token_ids"]) for f in finals.values()], FLUSH)
    assert metered["sqs_SendMessage"] == planned["sqs_send"]
    assert metered["sqs_DeleteMessage"] == planned["sqs_delete"]
    assert metered["s3_PutObject"] == planned["s3_put"]
    assert metered["s3_HeadObject_missing"] == planned["s3_head"]
    assert all(i["ok"] for i in invocations) and len(invocations) <= 16
    assert sum(i["answer"]["served"] for i in invocations) == 16


def test_a_worker_that_dies_mid_generation_loses_no_request_and_answers_none_twice(
    tiny: MoEModel, tmp_path: Path
) -> None:
    prompts = _prompts(6)
    alone = [tiny.generate([p], GenerationConfig(max_new_tokens=20))[0] for p in prompts]
    plan = _stream_plan(tmp_path, tiny, slots=4, workers=2)
    steps = [0]
    original = ContinuousBatch.step

    def dies_once(batch: ContinuousBatch) -> Any:
        steps[0] += 1
        if steps[0] == 12:  # mid-generation, with sequences held and chunks written
            raise RuntimeError("the worker's process died")
        return original(batch)

    answers: dict[int, tuple[int, bytes]] = {}
    with (
        pytest.MonkeyPatch.context() as patch,
        LocalServer(plan, tiny, port=0, visibility_timeout_s=2) as server,
    ):
        patch.setattr(ContinuousBatch, "step", dies_once)

        def send(k: int) -> None:
            body = {"prompt": prompts[k], "max_tokens": 20, "temperature": 0, "stream": True}
            answers[k] = _post(server.url + "/v1/completions", body)

        threads = [threading.Thread(target=send, args=(k,)) for k in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert server.stack is not None and server.stack.idle(60)
        invocations = list(server.stack.invocations)
        finals = [_final(server, _events(answers[k][1])[0]["id"]) for k in range(6)]
        texts = [
            "".join(e["choices"][0]["text"] for e in _events(answers[k][1])) for k in range(6)
        ]
    assert [i["ok"] for i in invocations].count(False) == 1  # the one that died
    assert "died" in next(i["error"] for i in invocations if not i["ok"])
    assert [f["token_ids"] for f in finals] == [a.token_ids for a in alone]
    assert texts == [a.text for a in alone]  # each streamed once, whole, despite the retry
    assert sum(i["answer"]["served"] for i in invocations if i["ok"]) == 6


def test_bad_requests_get_openai_errors_and_the_others_go_on(
    tiny: MoEModel, tmp_path: Path
) -> None:
    plan = _stream_plan(tmp_path, tiny, slots=2, workers=2)
    with LocalServer(plan, tiny, port=0) as server:
        url = server.url + "/v1/completions"
        good: dict[str, tuple[int, bytes]] = {}
        thread = threading.Thread(
            target=lambda: good.update(ok=_post(url, {"prompt": [5, 6, 7], "max_tokens": 20}))
        )
        thread.start()
        cases = {
            "context_length_exceeded": {"prompt": list(range(100, 200)), "max_tokens": 4},
            "max_tokens_too_large": {"prompt": "hello", "max_tokens": 25},
            "model_not_found": {"prompt": "hello", "model": "gpt-4"},
            "n": {"prompt": "hello", "n": 2},
            "logprobs": {"prompt": "hello", "logprobs": 2},
        }
        for expected, body in cases.items():
            status, raw = _post(url, body)
            error = json.loads(raw)["error"]
            assert status in (400, 404) and error["type"] == "invalid_request_error"
            assert expected in (error["code"], error["param"]), error
            assert error["message"]
        status, raw = _post(
            server.url + "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
        )
        assert status == 400 and json.loads(raw)["error"]["code"] == "chat_template_missing"
        status, raw = _post(url.replace("completions", "embeddings"), {"input": "x"})
        assert status == 404
        with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as response:
            models = json.loads(response.read())
        assert server.stack is not None
        with config.local(server.stack.endpoint_env):  # the endpoint may send, not receive
            sqs = boto3.client(
                "sqs",
                region_name="us-east-1",
                aws_access_key_id=config.current().local_identity,
                aws_secret_access_key="local",
            )
            with pytest.raises(ClientError, match="AccessDenied"):
                sqs.receive_message(QueueUrl=server.stack.queue_url)
        thread.join()
    assert models["data"][0]["id"] == tiny.name
    assert good["ok"][0] == 200 and json.loads(good["ok"][1])["choices"][0]["text"] is not None


def test_the_openai_client_streams_a_completion(tiny: MoEModel, tmp_path: Path) -> None:
    import openai  # pinned in the dev extras, which `make setup` installs

    plan = _stream_plan(tmp_path, tiny, slots=2, workers=2)
    expected = tiny.generate([[5, 6, 7, 8]], GenerationConfig(max_new_tokens=12))[0]
    with LocalServer(plan, tiny, port=0) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="local", max_retries=0)
        pieces = [
            chunk.choices[0].text
            for chunk in client.completions.create(
                model=tiny.name, prompt=[5, 6, 7, 8], max_tokens=12, temperature=0, stream=True
            )
            if chunk.choices
        ]
        whole = client.completions.create(
            model=tiny.name, prompt=[5, 6, 7, 8], max_tokens=12, temperature=0
        )
    assert len(pieces) >= 2 and "".join(pieces) == expected.text == whole.choices[0].text


def test_serve_and_bench_stream_refuse_a_plan_without_workers(
    tiny: MoEModel, tmp_path: Path
) -> None:
    plan = _stream_plan(tmp_path, tiny, slots=2, workers=2)
    bare = Plan.load(plan).model_copy(update={"stream": None}).save(tmp_path / "bare.json")
    for command in (["serve"], ["bench", "stream"]):
        result = runner.invoke(app, [*command, "--plan", str(bare)])
        assert result.exit_code == 2, result.output
        assert "no workers" in result.output and "--slo-tpot" in result.output
    result = runner.invoke(app, ["serve", "--plan", str(plan), "--port", "70000"])
    assert result.exit_code == 2 and "--port 70000" in result.output


def test_commands_of_a_workflow_refuse_a_stream_plan_and_traffic_simulates_its_workers(
    tiny: MoEModel, tmp_path: Path
) -> None:
    plan = str(_stream_plan(tmp_path, tiny, slots=2, workers=2))
    for command in (["run-local", "--text", "hello"], ["generate", "--prompt", "hello"]):
        result = runner.invoke(app, [*command, "--plan", plan])
        assert result.exit_code == 2, result.output
        assert "serves a stream" in result.output and "moelambda serve" in result.output
    result = runner.invoke(
        app, ["traffic", "--plan", plan, "--traffic", "poisson:0.2", "--minutes", "5", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["workers"], summary["slots"]) == (2, 2) and summary["requests"] > 0
    # this hand-made plan admits prompts of 64 tokens at most: the trace's longer ones refused
    assert summary["served"] + summary["refused"] == summary["requests"]
