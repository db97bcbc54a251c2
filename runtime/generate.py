"""`moelambda generate` as a call: a driver or monolithic plan's deployment generating text on
moto, the real handlers in this process, its requests metered against the plan's.

The prompts travel in the execution's input (`{"generate": {"prompts": ..., settings}}`); the
one-state workflow hands them to the driver, which prefills, decodes with its KV cache, invokes
its remote experts per step and writes the new ids and their arrival times under the request's
output key. Each step's tokens also go where the driver's routing metrics go (stdout on
Lambda, a local file here), which is what lets this runner print the text as it is generated.
"""

from __future__ import annotations

import json
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from ground.errors import UsageError

if TYPE_CHECKING:
    from moe import GenerationConfig, MoEModel

__all__ = ["check_generation", "check_request", "generate_locally"]

EXACT = ("lambda_requests", "s3_put", "s3_get", "s3_list", "s3_delete", "transitions")
"""The request counts a metered generation must match the plan on, kind by kind."""
POLL_S = 0.05  # how often the streaming reader looks for new tokens (display only)


def check_request(plan: Any, prompts: list[str], settings: GenerationConfig) -> None:
    """Rule out, from the plan and the settings alone, what would fail or be ignored, before
    the model loads (`check_generation` then checks the prompts' real tokens).

    Raises:
        UsageError: --top-p at temperature 0 (greedy decoding ignores it), an empty stop
            string, an encoder's plan, a plan without a driver, or a generation that would
            outlast the driver's limit even for prompts of one token each (`_check_timeout`).
    """
    if settings.temperature == 0 and settings.top_p < 1:
        raise UsageError(
            f"--top-p {settings.top_p:g} applies to sampling, and --temperature 0 decodes "
            "greedily (always the most likely token): it would be ignored.",
            "pass a --temperature above 0 to sample (e.g. --temperature 0.7 --top-p "
            f"{settings.top_p:g}), or drop --top-p.",
        )
    if any(not text for text in settings.stop):
        raise UsageError(
            '--stop "" is empty: there is no text to stop a sequence at, so it would be ignored.',
            "pass the text to stop at (e.g. --stop '###'), or drop --stop.",
        )
    from moe._families import ENCODER_TYPES
    from runtime.serve import refuse_stream

    refuse_stream(plan, "generate")
    if plan.model.model_type in ENCODER_TYPES:
        _refuse_encoder(plan.model.model)
    _check_driver(plan)
    if prompts:
        from planner.traffic.workflow import manifest_of_plan

        _check_timeout(plan, manifest_of_plan(plan), [1] * len(prompts), settings, shortest=True)


def _refuse_encoder(name: str) -> NoReturn:
    raise UsageError(
        f"{name} is an encoder: it embeds text and has no next token to generate.",
        "generate with a decoder model's plan (SmolLM2, Mixtral, OLMoE); run-local serves "
        "an encoder.",
    )


def _check_driver(plan: Any) -> None:
    if not plan.topology.generates:
        raise UsageError(
            "this plan is the fan-out workflow: every token of every sequence would pay a Step "
            "Functions transition and S3 round trips per layer.",
            "plan a driver or one function: `moelambda plan ... --deployment driver` "
            "(or monolithic, or auto).",
        )


def check_generation(
    plan: Any, model: MoEModel, prompts: list[str], settings: GenerationConfig
) -> list[list[int]]:
    """The prompts' token ids, once everything that would fail the request is ruled out.

    Raises:
        UsageError: An encoder, a plan without a driver, an empty prompt, a prompt plus
            `max_new_tokens` past the model's context, or a generation that would outlast
            Lambda's timeout, or an Express plan's duration limit, at the plan's predicted
            TTFT and TPOT (`planner.plan_timing`, `_run_limit`).
    """
    if model.family.name != "decoder":
        _refuse_encoder(model.name)
    _check_driver(plan)
    if not prompts:
        raise UsageError("no prompt was given.", "pass --prompt TEXT or --prompts FILE.")
    ids = [model.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    context = int(getattr(model.family.config, "max_position_embeddings", 0) or 0)
    for i, (text, prompt) in enumerate(zip(prompts, ids, strict=True)):
        if not text.strip() or not prompt:
            raise UsageError(f"prompt {i + 1} is empty.", "give every prompt some text.")
        if context and len(prompt) + settings.max_new_tokens > context:
            raise UsageError(
                f"prompt {i + 1} has {len(prompt):,} tokens; with --max-new-tokens "
                f"{settings.max_new_tokens:,} it passes the model's context of {context:,}.",
                f"shorten the prompt or pass --max-new-tokens "
                f"{max(context - len(prompt), 0):,} or fewer.",
            )
    from moe import describe_model

    _check_timeout(plan, describe_model(model), [len(p) for p in ids], settings)
    return ids


def _run_limit(plan: Any) -> tuple[float, str]:
    """The longest one driver invocation of `plan` may run, seconds, and what sets it: Lambda's
    timeout, or, for a plan priced for an Express workflow, that workflow's duration limit
    (the calibration's `express_max_duration_s`)."""
    from planner.replay import calibration_of

    cal = calibration_of(plan)
    timeout = float(cal.max_timeout_s)
    express = float(cal.express_max_duration_s)
    if plan.workflow == "express" and express < timeout:
        return express, f"the plan's Express workflow's {express:g} s duration limit"
    return timeout, f"Lambda's {timeout:g} s timeout"


def _check_timeout(
    plan: Any,
    manifest: Any,
    lengths: list[int],
    settings: GenerationConfig,
    *,
    shortest: bool = False,
) -> None:
    """Refuse a generation whose one driver invocation the plan predicts past its limit
    (`_run_limit`): it would be killed with every token lost (a long generation is not
    continued by a second invocation; docs/generation.md). `shortest` says `lengths` are a
    lower bound on the prompts' (one token each: the model is not loaded yet)."""
    from planner.generation import plan_timing

    new_tokens = settings.max_new_tokens
    ttft, tpot = plan_timing(plan, manifest, lengths, new_tokens)
    limit, what = _run_limit(plan)
    run_s = ttft + (new_tokens - 1) * tpot
    if run_s > limit:
        fits = int((limit - ttft) // tpot) + 1 if tpot > 0 and ttft < limit else 0
        prompts = (
            f"even {len(lengths)} one-token prompt(s)" if shortest else f"{len(lengths)} prompt(s)"
        )
        standard = (
            ", or re-plan with `moelambda plan --workflow standard` (up to Lambda's timeout)"
            if plan.workflow == "express"
            else ""
        )
        raise UsageError(
            f"{prompts} with --max-new-tokens {new_tokens} would run {run_s:,.0f} s "
            f"in the driver (the plan's TTFT {ttft:.2f} s, TPOT {tpot:.3f} s), past {what}.",
            f"pass --max-new-tokens {max(fits, 1)} or fewer"
            + (" (longer prompts fit fewer)" if shortest else ", or fewer or shorter prompts")
            + f"{standard}."
            if fits
            else f"send fewer or shorter prompts per request, or plan a larger driver{standard}.",
        )


def generate_locally(
    plan: Path,
    model: MoEModel,
    prompts: list[str],
    settings: GenerationConfig,
    *,
    on_text: Callable[[int, str], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Generate for `prompts` through the plan's deployment on moto, handlers in-process.

    One metered execution (functions warm, as the plan prices them): its billed requests are
    set against the plan's for the routing the request took (the prefill as a driver request,
    then one Invoke per remote expert hit per layer per decode step), and priced.

    Args:
        plan: A driver or monolithic plan of a decoder (`moelambda plan`).
        model: The plan's model, loaded.
        prompts: The prompts' text, decoded together.
        settings: Sampling and stopping.
        on_text: Called with (prompt index, new text) as tokens arrive (streaming).
        progress: Called with a message as each step starts.

    Returns:
        What `moelambda generate --json` prints: `outputs` (text, token ids, TTFT, TPOT,
        finish reason), `requests` {metered, planned}, `bill_usd`, `status`.
    """
    from cdk.app import DEFAULT_STACK, build_app
    from functions.local import run_workflow
    from ground.plan import Plan
    from moe import export_model
    from pipeline.stacks import flat_template
    from planner import price_usage

    say = progress or (lambda _: None)
    document = Plan.load(plan)
    ids = check_generation(document, model, prompts, settings)
    request = {"generate": {"prompts": ids, **settings.model_dump(mode="json")}}
    with tempfile.TemporaryDirectory(prefix="moelambda-generate-") as tmp:
        root = Path(tmp)
        say("exporting weights and synthesising the stack")
        manifest = export_model(model, root / "weights")
        build_app(plan, root / "cdk.out", stack_name=DEFAULT_STACK)
        template = flat_template(root / "cdk.out", DEFAULT_STACK)
        records = root / "records.jsonl"
        records.touch()
        say(f"generating for {len(ids)} prompt(s) on moto")
        stream = _Stream(records, model.tokenizer, len(ids), on_text)
        stream.start()
        try:
            result = run_workflow(
                template, root / "weights", [request], metered=True, metrics_file=records
            )
        finally:
            stream.stop()
        (run,) = result["requests"]
        lines = records.read_text(encoding="utf-8").splitlines()
    if run["status"] != "SUCCEEDED":
        return {
            "status": run["status"],
            "error": run.get("error"),
            "cause": run.get("cause"),
            "outputs": [],
        }
    new_ids, times = run["outputs"]
    outputs = [_output(model, new_ids[b], times[b], settings) for b in range(new_ids.shape[0])]
    counts = _routing(lines, manifest.num_layers, manifest.experts)
    planned = planned_requests(document, manifest, counts, sum(len(p) for p in ids))
    usage = result["usage"]
    bill = price_usage(document, usage, run.get("seconds", 0.0))
    return {
        "status": "SUCCEEDED",
        "deployment": document.deployment,
        "outputs": outputs,
        "new_tokens": int(sum(len(o["token_ids"]) for o in outputs)),
        "decode_steps": int(counts.shape[0] - 1),
        "requests": {
            "metered": {k: int(usage[k]) for k in EXACT},
            "planned": planned,
        },
        "bill_usd": round(float(bill["total_usd"]), 9),
        "bill": bill,
    }


def planned_requests(
    document: Any, manifest: Any, counts: np.ndarray, prompt_tokens: int
) -> dict[str, int]:
    """The requests the plan's semantics give for a generation whose routing was `counts`.

    The prefill (`counts[0]`) is a driver request (`planner.evaluate_plan`) whose ids came
    inline, so without its input GET; each decode step adds one Invoke per remote expert hit
    per layer (`ground.generation.decode_invokes`).
    """
    from ground.generation import decode_invokes
    from planner import evaluate_plan

    prefill = evaluate_plan(document, manifest, counts[0], prompt_tokens).usage
    planned = {k: int(round(prefill[k])) for k in EXACT}
    planned["s3_get"] -= 1  # the prompts travel in the execution input
    local = np.zeros((manifest.num_layers, manifest.experts), dtype=bool)
    for layer, experts in enumerate(document.driver.local):
        local[layer, experts] = True
    planned["lambda_requests"] += decode_invokes(counts[1:], local)
    return planned


def _routing(lines: list[str], layers: int, experts: int) -> np.ndarray:
    """(steps, layers, experts) rows routed to each expert, from the driver's EMF records in
    the order it wrote them (one per layer per step; the prefill first)."""
    from ground.routing_metrics import metric_name, metric_value

    rows = []
    for line in lines:
        record = json.loads(line)
        if "_aws" in record and "Layer" in record:
            rows.append([metric_value(record, metric_name(e)) for e in range(experts)])
    if not rows or len(rows) % layers:
        raise RuntimeError(f"the driver wrote {len(rows)} routing records for {layers} layers")
    return np.asarray(rows, dtype=np.int64).reshape(-1, layers, experts)


def _output(
    model: MoEModel, ids: np.ndarray, times: np.ndarray, settings: GenerationConfig
) -> dict[str, Any]:
    from moe import eos_ids
    from moe._generate import finish

    token_ids = [int(t) for t in ids if t >= 0]
    arrived = [float(t) for t in times[: len(token_ids)]]
    text, reason = finish(token_ids, model.tokenizer, settings, eos_ids(model.family.config))
    return {
        "text": text,
        "token_ids": token_ids,
        "finish_reason": reason,
        "ttft_s": round(arrived[0], 6),
        "tpot_s": (
            round((arrived[-1] - arrived[0]) / (len(arrived) - 1), 6) if len(arrived) > 1 else None
        ),
    }


class _Stream:
    """Reads the driver's token records as they are written and hands on each prompt's new
    text (the decoded ids so far, less what was already shown)."""

    def __init__(
        self, path: Path, tokenizer: Any, prompts: int, on_text: Callable[[int, str], None] | None
    ) -> None:
        self.path, self.tokenizer, self.on_text = path, tokenizer, on_text
        self.ids: list[list[int]] = [[] for _ in range(prompts)]
        self.shown = [""] * prompts
        self.offset = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        if self.on_text is not None:
            self.thread.start()

    def stop(self) -> None:
        if self.on_text is not None:
            self.done.set()
            self.thread.join()
            self._read()  # whatever arrived after the last look

    def _run(self) -> None:
        while not self.done.wait(POLL_S):
            self._read()

    def _read(self) -> None:
        with open(self.path, "rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            record = json.loads(line)
            if record.get("kind") != "generated_tokens":
                continue
            for b, token in enumerate(record["tokens"]):
                if token < 0:
                    continue
                self.ids[b].append(token)
                text = self.tokenizer.decode(self.ids[b], skip_special_tokens=True)
                if text.startswith(self.shown[b]) and len(text) > len(self.shown[b]):
                    assert self.on_text is not None
                    self.on_text(b, text[len(self.shown[b]) :])
                    self.shown[b] = text
