"""Planning generation: a decode step's cost and latency, and the cheapest driver or
one-function plan meeting a time-to-first-token and a time-per-output-token SLO.

What the driver does and is billed for is `ground.generation`'s. For B sequences of P prompt
tokens generating G tokens each (q_{l,e}: a token's probability of picking expert e of layer l;
S_l the driver's local experts of layer l; d its memory, j the remote experts' memory, g their
replicas in the prefill; times in seconds, prices as the calibration file states them):

* prefill = the driver request of `planner.driver` on B x P tokens: TTFT is its latency, its
  bill the driver solver's price of it (`evaluate_driver`).
* one decode step: per layer l the layer stage on B rows, B u_layer(d), then the slower of
  the local experts, u_expert(d) B sum_{e in S_l} q_{l,e} (expected rows, one expert after
  another), and the slowest remote call, max_{e not in S_l, q > 0} RT + r_{l,e} (D / B^f +
  U_j), RT the Invoke round trip (`invoke_round_trip_s`), r the rows of a hit
  (`ground.generation.rows_per_hit`), D the bytes of a row in and out; after the layers the
  tail, B u_tail(d); plus a floor of F per layer (`decode_layer_floor_s`, measured: a step of
  a few rows is bound by a layer's per-operation overhead and weight reads, not by the FLOPs
  that u and U_j, measured on 1,024-token batches, price), times the stack's precision's
  `decode_floor` speed against fp32 (`Calibration.speed_ratio`: int8 weights read a quarter of
  the bytes). TPOT = the sum.
* a step's bill: the driver's GB-s for the whole step (waits included) and Express's
  duration, rho(d) TPOT, plus each remote expert's expected calls, p = 1 - (1 - q)^B, each a
  Lambda request and billed T^str + r (D^o / B^f + U_j) at memory j (so p r = B q rows).
* a generation: TTFT + (G - 1) TPOT in one invocation, within Lambda's timeout; its bill the
  prefill's plus G - 1 steps'. The bill per million input tokens is the prefill's over its
  B x P tokens, the bill per million output tokens the decode steps' over the B x G tokens.
* the driver's memory holds, beside what `planner.driver` counts, the KV cache: B (P + G)
  tokens of keys and values (`ModelShape.kv_bytes_per_token`; for a model known by its
  manifest alone, 2 hidden states per layer at the wire's width, the stack's activation dtype,
  exact for multi-head attention and an upper bound for grouped-query attention).

Left out: the attention's reads of the KV cache in a decode step (4 x context x hidden FLOPs
per layer and token, beside the layer's 2 x its weights), and the floor a step has when its
few rows make a matmul memory-bound (reading an expert's weights once per step, whatever B):
U_j and u were measured on 1,024-token batches, so the TPOT of small batches is optimistic.

The solver of the cheapest plan is `planner.generation_solver`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ground.driver import layer_seconds, overflows, remote_call_s
from ground.errors import UsageError
from ground.generation import (
    decode_steps,
    expected_remote_hits,
    hit_probability,
    rows_per_hit,
)
from planner.build import instance_for
from planner.driver import (
    DriverChoice,
    DriverEvaluation,
    DriverInstance,
    driver_instance,
    evaluate_driver,
    remote_options,
)
from planner.exact import SLO_RTOL
from planner.instance import MB

if TYPE_CHECKING:
    from ground.manifest import Manifest
    from ground.plan import Plan
    from planner.calibration import Calibration

__all__ = [
    "DEFAULT_NEW_TOKENS",
    "DEFAULT_PROMPT_TOKENS",
    "DEFAULT_SEQUENCES",
    "GenerationChoice",
    "GenerationEvaluation",
    "GenerationInstance",
    "GenerationSolution",
    "decode_floor_s",
    "decode_step",
    "evaluate_generation",
    "generation_instance",
    "managed_api_quote",
    "plan_decode",
    "plan_timing",
]

# A request of the Azure LLM conversation trace the traffic planner replays, at its medians
# (planner/traffic/data: ContextTokens 1,020, GeneratedTokens 129), served alone.
DEFAULT_PROMPT_TOKENS = 1020
DEFAULT_NEW_TOKENS = 129
DEFAULT_SEQUENCES = 1
DECODER_FAMILIES = ("decoder", "shape")  # a manifest's family: a decoder, or an MoE shape


@dataclass(frozen=True, eq=False)
class GenerationInstance:
    """One generation-planning problem: the prefill's driver problem and what decoding adds."""

    prefill: DriverInstance  # the driver problem of the B x P prompt tokens
    share: np.ndarray  # (L, E) q: a token's probability of picking each expert
    sequences: int  # B
    prompt_tokens: int  # P
    new_tokens: int  # G
    round_trip_s: float  # RT: one warm synchronous Invoke beside the callee's compute
    layer_floor_s: float  # F: a decode step's least time per layer (`decode_layer_floor_s`)
    kv_bytes_per_token: float  # one token's keys and values, every layer

    @property
    def layers(self) -> int:
        return self.prefill.layers

    @property
    def experts(self) -> int:
        return self.prefill.experts

    @property
    def steps(self) -> int:
        return decode_steps(self.new_tokens)

    @property
    def kv_mb(self) -> float:
        """The KV cache at the end of the generation: B (P + G) tokens."""
        tokens = self.sequences * (self.prompt_tokens + self.new_tokens)
        return tokens * self.kv_bytes_per_token / MB

    @property
    def order(self) -> np.ndarray:
        """(L, E) each layer's experts, most popular first (ties by index)."""
        index = np.arange(self.experts)
        return np.stack([np.lexsort((index, -row)) for row in self.share])

    def local(self, k: int) -> np.ndarray:
        """(L, E) True for each layer's k most popular experts."""
        mask = np.zeros((self.layers, self.experts), dtype=bool)
        np.put_along_axis(mask, self.order[:, :k], True, axis=1)
        return mask

    def rows_inline(self) -> bool:
        """Whether a step's rows for one expert (B at most) fit an inline Invoke event."""
        b = self.prefill.base
        width = int(max(b.token_bytes_in, b.token_bytes_out))
        return not overflows(self.sequences, width, self.prefill.payload_limit)


def generation_instance(
    manifest: Manifest,
    share: np.ndarray,
    calibration: Calibration,
    *,
    sequences: int = DEFAULT_SEQUENCES,
    prompt_tokens: int = DEFAULT_PROMPT_TOKENS,
    new_tokens: int = DEFAULT_NEW_TOKENS,
    arch: str = "x86_64",
    workflow: str = "express",
    kv_bytes_per_token: float | None = None,
) -> GenerationInstance:
    """The generation problem of `manifest`'s decoder with routing shares `share` (L, E).

    `kv_bytes_per_token` defaults to 2 hidden states per layer (module docstring).

    Raises:
        UsageError: An encoder, or a batch or length below 1.
        CalibrationError: The calibration has no `invoke_round_trip_s` or
            `decode_layer_floor_s`.
    """
    if manifest.family not in DECODER_FAMILIES:
        raise UsageError(
            f"{manifest.model} is an encoder ({manifest.model_type}): it produces no tokens, "
            "so there is no time to first token or per output token to plan for.",
            "plan it per batch with --slo S (or --throughput), without --slo-ttft, --slo-tpot, "
            "--batch-sequences, --prompt-tokens and --new-tokens; or plan a decoder: its "
            "routing traces (`moelambda profile --model smollm2 --out DIR`, then `plan --traces "
            "DIR`), or a decoder's shape (`plan --shape mixtral`).",
        )
    for flag, value in (
        ("--batch-sequences", sequences),
        ("--prompt-tokens", prompt_tokens),
        ("--new-tokens", new_tokens),
    ):
        if value < 1:
            raise UsageError(f"{flag} {value} is not positive.", f"pass {flag} 1 or more.")
    tokens = sequences * prompt_tokens
    share = np.asarray(share, dtype=float)
    base = instance_for(
        manifest, share * tokens, calibration, tokens=tokens, arch=arch, workflow=workflow
    )
    kv = kv_bytes_per_token
    if kv is None:
        kv = 2.0 * manifest.num_layers * manifest.token_bytes_in
    return GenerationInstance(
        prefill=driver_instance(base, manifest, calibration),
        share=share,
        sequences=sequences,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        round_trip_s=float(calibration.required("invoke_round_trip_s", "planning generation")),
        layer_floor_s=decode_floor_s(calibration, manifest, "planning generation"),
        kv_bytes_per_token=float(kv),
    )


def decode_floor_s(calibration: Calibration, manifest: Manifest, needed_for: str) -> float:
    """F: a decode step's least time per layer, at the stack's precision's speed."""
    floor = float(calibration.required("decode_layer_floor_s", needed_for))
    return floor * calibration.speed_ratio(manifest.precision.stack, "decode_floor")


@dataclass(frozen=True)
class GenerationChoice:
    """A decision: the driver's memory option, the local experts per layer (each layer's most
    popular), and every remote expert's memory option and prefill replicas (1..G)."""

    memory: int
    local_per_layer: int
    remote_memory: int
    replicas: int

    def driver_choice(self, ginst: GenerationInstance) -> DriverChoice:
        shape = (ginst.layers, ginst.experts)
        return DriverChoice(
            self.memory,
            ginst.local(self.local_per_layer),
            np.full(shape, self.remote_memory),
            np.full(shape, self.replicas),
        )


@dataclass(frozen=True, eq=False)
class GenerationEvaluation:
    """A generation choice as the model prices it, with every violated constraint named."""

    prefill: DriverEvaluation
    ttft_s: float
    tpot_s: float
    run_s: float  # the driver's invocation: TTFT + (G - 1) TPOT
    prefill_usd: float
    step_usd: float
    total_usd: float
    invokes_per_step: float  # expected remote Invokes of one decode step
    memory_need_mb: float
    violations: list[str]

    @property
    def feasible(self) -> bool:
        return not self.violations


def decode_step(
    ginst: GenerationInstance, memory: int, local: np.ndarray, remote_memory: int
) -> tuple[float, float, float]:
    """(TPOT, $ of the step, expected remote Invokes) of one decode step, layer by layer."""
    dinst, b, B = ginst.prefill, ginst.prefill.base, ginst.sequences
    q = ginst.share
    remote = ~np.asarray(local, dtype=bool)
    rows = rows_per_hit(q, B)
    hit = hit_probability(q, B)
    u_j = float(b.compute_s[remote_memory])
    m_j = float(b.memory_mb[remote_memory])
    width = b.token_bytes_in + b.token_bytes_out
    tpot = B * float(dinst.u_tail[memory]) + ginst.layers * ginst.layer_floor_s
    experts_usd = 0.0
    for layer in range(ginst.layers):
        local_s = float(dinst.u_expert[memory]) * B * float(q[layer][local[layer]].sum())
        called = remote[layer] & (q[layer] > 0)
        finish = np.asarray(
            remote_call_s(
                ginst.round_trip_s, rows[layer], width, b.invoke_bandwidth, rows[layer] * u_j
            )
        )
        remote_s = float(finish[called].max(initial=0.0))
        tpot += B * float(dinst.u_layer[memory, layer]) + float(layer_seconds(local_s, remote_s))
        billed = hit[layer] * b.warm_start_s + B * q[layer] * (
            b.token_bytes_out / b.invoke_bandwidth + u_j
        )
        calls = hit[layer] * b.request_usd + billed * m_j * b.price_mb_s
        experts_usd += float(calls[called].sum())
    invokes = float(expected_remote_hits(q, local, B).sum())
    return tpot, experts_usd + dinst.rho(memory) * tpot, invokes


def evaluate_generation(
    ginst: GenerationInstance,
    choice: GenerationChoice,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> GenerationEvaluation:
    """TTFT, TPOT and the bill of `choice`, with every violated constraint named."""
    dinst, b = ginst.prefill, ginst.prefill.base
    d, j, g = choice.memory, choice.remote_memory, choice.replicas
    driver = choice.driver_choice(ginst)
    prefill = evaluate_driver(dinst, driver)
    tpot, step_usd, invokes = decode_step(ginst, d, driver.local, j)
    run_s = prefill.latency + ginst.steps * tpot
    need = prefill.memory_need_mb + ginst.kv_mb
    width = b.token_bytes_in + b.token_bytes_out
    decode_mb = dinst.experts_mb + b.runtime_mb + ginst.sequences * width / MB
    violations = []
    for layer in range(ginst.layers):
        feasible = remote_options(dinst, layer).feasible[:, j, g - 1]
        remote = ~driver.local[layer]
        for e in np.flatnonzero(remote & ~feasible):
            violations.append(f"layer {layer} expert {e}: memory or timeout limit (prefill)")
        for e in np.flatnonzero(remote & (decode_mb[layer] > b.memory_mb[j])):
            violations.append(f"layer {layer} expert {e}: a step's rows over its memory")
    if not driver.monolithic and not ginst.rows_inline():
        violations.append(f"a step's {ginst.sequences} rows for one expert exceed an Invoke")
    if need > float(dinst.memory_mb[d]) + 1e-9:
        violations.append(
            f"the driver needs {need:,.0f} MB with a {ginst.kv_mb:,.0f} MB KV cache, over its "
            f"{dinst.memory_mb[d]:,.0f} MB"
        )
    if run_s > b.max_timeout_s:
        violations.append(f"the driver runs {run_s:,.1f} s, over Lambda's {b.max_timeout_s:g} s")
    slos = (("TTFT", prefill.latency, slo_ttft_s), ("TPOT", tpot, slo_tpot_s))
    for name, value, slo in slos[: 1 + (ginst.steps > 0)]:  # one new token: no decode step
        if slo is not None and value > slo * (1 + SLO_RTOL):
            violations.append(f"{name} {value:.4f} s exceeds the SLO {slo:.4f} s")
    return GenerationEvaluation(
        prefill=prefill,
        ttft_s=prefill.latency,
        tpot_s=tpot,
        run_s=run_s,
        prefill_usd=prefill.cost,
        step_usd=step_usd,
        total_usd=prefill.cost + ginst.steps * step_usd,
        invokes_per_step=invokes,
        memory_need_mb=need,
        violations=violations,
    )


@dataclass(frozen=True, eq=False)
class GenerationSolution:
    """The solver's answer, and the fastest TPOT any plan within the TTFT SLO has."""

    deployment: str  # "driver" or "monolithic"
    choice: GenerationChoice
    evaluation: GenerationEvaluation
    smallest_tpot_s: float
    slo_ttft_s: float | None
    slo_tpot_s: float | None
    seconds: float


def plan_timing(
    plan: Plan, manifest: Manifest, prompt_lengths: list[int], new_tokens: int
) -> tuple[float, float]:
    """(TTFT, TPOT) the model predicts for a driver or monolithic `plan` generating
    `new_tokens` for prompts of these lengths, at the plan's own memories and local experts:
    what `moelambda generate` holds a request to before it starts (the driver's invocation must
    end within Lambda's timeout). Routing shares are the plan's predicted tokens.

    Raises:
        UsageError: The plan has no driver.
    """
    ginst, choice, slowest = _plan_instance(
        plan, manifest, len(prompt_lengths), max(prompt_lengths), new_tokens
    )
    tpot, _, _ = decode_step(ginst, choice.memory, choice.local, slowest)
    return evaluate_driver(ginst.prefill, choice).latency, tpot


def plan_decode(plan: Plan, manifest: Manifest, sequences: int = 1) -> tuple[float, float, float]:
    """(TPOT, $ of one decode step, expected remote Invokes of a step) of a driver or
    monolithic `plan` decoding `sequences` sequences together, at its own memories and local
    experts (`decode_step`): what the traffic simulator charges each further token of a
    request. A step's model does not depend on the context's length (module docstring).

    Raises:
        UsageError: The plan has no driver.
    """
    ginst, choice, slowest = _plan_instance(plan, manifest, sequences, 1, 1)
    return decode_step(ginst, choice.memory, choice.local, slowest)


def _plan_instance(
    plan: Plan, manifest: Manifest, sequences: int, prompt_tokens: int, new_tokens: int
) -> tuple[GenerationInstance, DriverChoice, int]:
    """The generation problem of `plan`'s driver for B sequences of P prompt tokens, its
    decisions, and the remote experts' memory option a step waits on (the smallest)."""
    from planner.replay import calibration_of, driver_of

    if not plan.topology.generates:
        raise UsageError(
            f"{plan.topology.what} does not generate.", "plan a driver or one function."
        )
    counts = np.zeros((manifest.num_layers, manifest.experts))
    for layer in plan.layers:
        for e in layer.experts:
            counts[layer.layer, e.hosted[0]] = e.tokens
    for layer, (own, tokens) in enumerate(
        zip(plan.driver.local, plan.driver.local_tokens, strict=True)
    ):
        counts[layer, own] = tokens
    share = counts / max(float(plan.totals.tokens), 1.0)
    batch = sequences * prompt_tokens
    dinst, choice = driver_of(plan, manifest, share * batch, batch)
    cal = calibration_of(plan)
    ginst = GenerationInstance(
        prefill=dinst,
        share=share,
        sequences=sequences,
        prompt_tokens=prompt_tokens,
        new_tokens=new_tokens,
        round_trip_s=float(cal.required("invoke_round_trip_s", "pricing generation")),
        layer_floor_s=decode_floor_s(cal, manifest, "pricing generation"),
        kv_bytes_per_token=2.0 * manifest.num_layers * manifest.token_bytes_in,
    )
    remote = ~choice.local
    slowest = int(choice.remote_memory[remote].min()) if remote.any() else 0
    return ginst, choice, slowest


def managed_api_quote(calibration: Calibration, model: str) -> dict[str, Any]:
    """A managed serverless API's list price for `model` (a shape's name, as its manifest
    says it), from the calibration's `managed_api_prices`, with its source and date: what a
    user would pay per token instead of deploying the model. `list_price` False (and the
    prices None) where the file has none for it ("no list price")."""
    price = (calibration.managed_api_prices or {}).get(model)
    entry = calibration.provenance.get("managed_api_prices")
    if price is None:
        return {
            "model": model,
            "list_price": False,
            "provider": None,
            "model_id": None,
            "per_million_input_usd": None,
            "per_million_output_usd": None,
            "source": "no list price",
        }
    return {
        "model": model,
        "list_price": True,
        "provider": price.provider,
        "model_id": price.model_id,
        "per_million_input_usd": price.input_per_million_usd,
        "per_million_output_usd": price.output_per_million_usd,
        "source": None if entry is None else f"{entry.source} (as of {entry.as_of})",
    }
