"""The Plan: the versioned document the planner writes and the CDK app and local runner read.

It says, per MoE layer, the scatter-gather method and pipeline degree, and per expert the Lambda
memory, replicas and the predicted tokens and time; the totals (the paper's objective, the full
bill, the latency against the SLO); the calibration it was computed with; and the model and the
weight layout (S3 keys and sizes) it refers to; the workflow type and the objective it was
solved for. Loading validates what a deployment relies on, by the rules of `ground.semantics`:
memory within Lambda's range, replicas within G and the Map's concurrency, a direct shard's
encoded event within the Invoke limit, an Express workflow within its duration limit.

Version 2 added `workflow`, `objective`, `nonmoe_memory_mb`, and per expert `max_replicas` (the
reserved concurrency the gate may spread a batch's real tokens over) and
`max_tokens_per_replica` (what one replica's memory, and for direct its payload, can take).
An entry of a layer's `experts` is one expert function; `hosts`, when set, packs several of the
layer's experts into it (their weights resident together; one invocation serves a shard of all
their rows). Without `hosts` the entry's function hosts expert `expert` alone, as in plans
written before packing, which stay valid.

`traffic`, when set, is what `moelambda plan --traffic` chose for a request stream: the front
door's batch policy (most tokens per batch, longest wait) and a capacity policy per function
(none, a scheduled warmer, provisioned concurrency, or Lambda Managed Instances: then the
stack's one capacity provider's instance type and count), with the p99 SLO and the simulated
period they were chosen on. Plans without it (every plan before it) stay valid, and mean one
execution per arriving request with no capacity policy.

`generation`, when set, is what `moelambda plan --slo-ttft/--slo-tpot` planned a driver or one
function for (`ground.generation`): B sequences of P prompt tokens generating G tokens each,
with the predicted time to first token and per output token and the bill per million input and
output tokens. The plan's `totals` and its functions are then the prefill's (B x P tokens, the
prompt's SLO), `driver.time_s` is the whole invocation (prefill and decode steps) and
`driver.local` the local set chosen. Plans without it (every plan before it) stay valid.

`candidates` lists the shapes `plan` weighed beside the chosen one. `deployment` says the
plan's shape (`ground.driver`): the fan-out `workflow` (the default, and
every plan made before the other shapes), a `driver` function that runs the non-MoE stack and
its `driver.local` experts and invokes the rest, or one `monolithic` function with every expert.
In the last two, `nonmoe_memory_mb` is the driver's memory, each layer's `experts` are its
remote expert functions only (each hosting one expert; a monolithic plan has none), invoked by
the driver (method `direct`, with rows past the Invoke payload limit through S3).

`concurrency_quota` is the account's Lambda concurrency quota the plan was checked against when
it was made (`plan --concurrency-quota`); `synth` checks the stack's reservations against it
unless told another. Plans without it (every plan before it) are checked against
`DEFAULT_CONCURRENCY_QUOTA`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ground.errors import MoelambdaError
from ground.files import read_document, write_file_atomically
from ground.generation import decode_steps
from ground.kinds import refuse_other_kind
from ground.managed import MB_PER_GIB, MEMORY_GIB_PER_VCPU
from ground.manifest import StageEntry
from ground.semantics import direct_event_bytes
from ground.topology import TOPOLOGIES, Topology, topology

__all__ = [
    "DEFAULT_CONCURRENCY_QUOTA",
    "PLAN_VERSION",
    "ExpertPlan",
    "FunctionCapacity",
    "GenerationPlan",
    "LayerPlan",
    "DriverPlan",
    "ModelRef",
    "Plan",
    "PlanError",
    "StreamPlan",
    "Totals",
    "TrafficPlan",
]

PLAN_VERSION = 2
DEFAULT_CONCURRENCY_QUOTA = 1000  # Lambda's default concurrent executions per account and Region
WORKFLOWS = ("express", "standard")
OBJECTIVES = ("full", "experts")


class PlanError(MoelambdaError):
    """A plan file that cannot be used."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExpertPlan(_Strict):
    """One expert function of a layer: the experts it hosts, its memory and replicas.

    `expert` is the function's slot in the layer (the S3 keys and events name it); unpacked,
    the slot is the expert it hosts.
    """

    expert: int = Field(ge=0)
    hosts: list[int] | None = Field(
        default=None,
        description="The layer's experts this function hosts, ascending (packing); "
        "None: expert `expert` alone.",
    )
    memory_mb: int
    replicas: int = Field(ge=1)
    tokens: float = Field(ge=0, description="Predicted tokens routed to this expert per batch.")
    time_s: float = Field(ge=0, description="Predicted run time of one replica.")
    cost_usd: float = Field(ge=0, description="Predicted cost of all replicas per batch.")
    max_replicas: int = Field(
        ge=1, description="Reserved concurrency: the most replicas the gate may use at run time."
    )
    max_tokens_per_replica: int = Field(
        ge=1, description="Tokens one replica can take (memory; for direct also the payload)."
    )

    @property
    def hosted(self) -> list[int]:
        """The experts whose weights this function holds and whose rows it computes."""
        return [self.expert] if self.hosts is None else list(self.hosts)


class LayerPlan(_Strict):
    layer: int = Field(ge=0)
    method: Literal["pipelined", "s3", "direct"]
    beta: int = Field(ge=1, description="Pipeline degree: tokens per minibatch (pipelined).")
    latency_s: float = Field(ge=0, description="MoE-E2E latency of the layer.")
    cost_usd: float = Field(ge=0)
    experts: list[ExpertPlan]


def _check_hosting(layer: LayerPlan, experts: int, local: list[int] | None = None) -> None:
    """A layer's functions sit in slots 0, 1, ... and, with the driver's `local` experts, host
    each of the model's experts once."""
    slots = [e.expert for e in layer.experts]
    if slots != list(range(len(slots))):
        raise ValueError(f"layer {layer.layer}: functions must be in slots 0..n-1, got {slots}")
    hosted = [e.hosted for e in layer.experts]
    if any(h != sorted(set(h)) or not h for h in hosted):
        raise ValueError(f"layer {layer.layer}: each function's hosts must be ascending, unique")
    own = list(local or [])
    if own != sorted(set(own)):
        raise ValueError(f"layer {layer.layer}: the driver's local experts must be ascending")
    if sorted([x for h in hosted for x in h] + own) != list(range(experts)):
        beside = "" if local is None else f" with the driver's local experts {own}"
        raise ValueError(
            f"layer {layer.layer}: its functions must host each of the {experts} experts once"
            f"{beside}, got {hosted}"
        )


class DriverPlan(_Strict):
    """The driver of a driver or monolithic plan: what it runs itself (`ground.driver`).

    Its memory is the plan's `nonmoe_memory_mb`; `local[l]` lists the experts of layer l it
    runs in process, ascending (all of them in a monolithic plan), and `local_tokens[l]` the
    tokens predicted for each (the remote experts' are in their `ExpertPlan.tokens`).
    """

    local: list[list[int]]
    local_tokens: list[list[float]]
    time_s: float = Field(ge=0, description="Predicted run of one request, waits included.")
    weights_mb: float = Field(ge=0, description="Non-MoE stages and local experts it holds.")
    activations_mb: float = Field(ge=0, description="A batch's tensors at their peak.")


class GenerationPlan(_Strict):
    """What a generating driver was planned for, and what the model predicts of it (see the
    module docstring; formulas in `planner.generation`)."""

    batch_sequences: int = Field(ge=1, description="Sequences decoded together (B).")
    prompt_tokens: int = Field(ge=1, description="Prompt tokens of each sequence (P).")
    new_tokens: int = Field(ge=1, description="Tokens each sequence generates (G).")
    slo_ttft_s: float | None = Field(default=None, gt=0)
    slo_tpot_s: float | None = Field(default=None, gt=0)
    ttft_s: float = Field(ge=0, description="Time to first token: the prefill's latency.")
    tpot_s: float = Field(ge=0, description="Time per output token: one decode step.")
    bill_per_million_input_usd: float = Field(
        ge=0, description="The prefill's bill over its B x P prompt tokens, per million."
    )
    bill_per_million_output_usd: float = Field(
        ge=0, description="The G - 1 decode steps' bill over the B x G new tokens, per million."
    )
    invokes_per_step: float = Field(ge=0, description="Expected remote Invokes of one step.")
    kv_cache_mb: float = Field(ge=0, description="The driver's KV cache at the last token.")

    @property
    def run_s(self) -> float:
        """The driver's invocation: the prefill, then one step per token after the first."""
        return self.ttft_s + decode_steps(self.new_tokens) * self.tpot_s


class ModelRef(_Strict):
    """Which model the plan deploys, and where each function finds its weights."""

    model: str
    model_type: str
    moefied: bool
    seed: int
    num_layers: int
    experts: int
    top_k: int
    hidden_size: int
    token_bytes_in: int
    token_bytes_out: int
    stages: list[StageEntry]
    # The MoEfication (`moe.MoefyOptions.describe()`) and the served model's quality against the
    # dense one (`moe.Quality`); None for native MoE models and plans made before them.
    moefy: dict[str, Any] | None = None
    quality: dict[str, Any] | None = None
    # The weights' precision per stage kind (`ground.precision.Weights.label`, as the manifest
    # names it); None in plans made before precisions, whose functions served float32.
    weights: str | None = None


class Totals(_Strict):
    tokens: int = Field(ge=1, description="Tokens per batch the plan is sized for.")
    moe_cost_usd: float = Field(ge=0, description="The paper's objective: expert functions.")
    bill_usd: dict[str, float] = Field(description="The full bill per batch, by item.")
    latency_s: float = Field(ge=0)
    slo_s: float | None = Field(default=None, gt=0)


class FunctionCapacity(_Strict):
    """What keeps one function's environments warm: what the CDK app emits for it.

    provisioned: `provisioned_concurrency` environments on a published version (an alias);
    warmer: a schedule invoking the function every `warmer_interval_s` with
    `warmer_concurrency` concurrent pings (events {"warmer": true}, answered at once);
    managed: `managed_environments` environments of `managed_memory_mb` on the stack's Lambda
    Managed Instances (`ground.managed`: whole vCPUs at 2 GiB each, one request at a time);
    with `accelerator_memory_gib`, a GPU-backed function: each environment also holds that much
    memory of one GPU of the provider's (GPU) instance type, its `AcceleratorConfig`.
    """

    function: str = Field(description="head, layerNN, layerNN/expertMM or tail.")
    policy: Literal["none", "warmer", "provisioned", "managed"]
    provisioned_concurrency: int = Field(default=0, ge=0)
    warmer_interval_s: float | None = Field(default=None, gt=0)
    warmer_concurrency: int = Field(default=0, ge=0)
    managed_environments: int = Field(default=0, ge=0)
    managed_memory_mb: int | None = Field(default=None, gt=0)
    accelerator_memory_gib: int | None = Field(
        default=None, gt=0, description="GPU memory per environment (AcceleratorMemorySize)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> FunctionCapacity:
        step = MEMORY_GIB_PER_VCPU * MB_PER_GIB
        if self.policy == "managed" and (
            self.managed_environments < 1
            or self.managed_memory_mb is None
            or self.managed_memory_mb % step
        ):
            raise ValueError(
                f"{self.function}: managed needs managed_environments >= 1 and "
                f"managed_memory_mb a multiple of {step} (whole vCPUs at "
                f"{MEMORY_GIB_PER_VCPU} GiB each)"
            )
        if self.policy != "managed" and (
            self.managed_environments or self.managed_memory_mb or self.accelerator_memory_gib
        ):
            raise ValueError(
                f"{self.function}: managed_* or accelerator_memory_gib set without the policy "
                "managed (a GPU-backed function runs on Managed Instances only)"
            )
        if self.policy == "provisioned" and self.provisioned_concurrency < 1:
            raise ValueError(f"{self.function}: provisioned needs provisioned_concurrency >= 1")
        if self.policy == "warmer" and (
            self.warmer_interval_s is None or self.warmer_concurrency < 1
        ):
            raise ValueError(f"{self.function}: a warmer needs an interval and a concurrency")
        if self.warmer_interval_s is not None and self.warmer_interval_s % 60:
            raise ValueError(
                f"{self.function}: a warmer's interval {self.warmer_interval_s:g} s is not whole "
                "minutes (an EventBridge Scheduler rate)"
            )
        if self.policy != "provisioned" and self.provisioned_concurrency:
            raise ValueError(f"{self.function}: provisioned_concurrency set without the policy")
        return self


class TrafficPlan(_Strict):
    """The batch and capacity policies chosen for a request stream (see the module docstring)."""

    traffic: dict[str, Any] = Field(description="The stream it was planned on: spec, scale, ...")
    slo_p99_s: float = Field(gt=0)
    max_batch_tokens: int = Field(ge=1)
    max_wait_s: float = Field(ge=0)
    idle_reclaim_s: float = Field(gt=0, description="The idle-time assumption planned under.")
    capacity: list[FunctionCapacity]
    simulated: dict[str, Any] = Field(description="p99, attainment and bill over the period.")
    managed_instance_type: str | None = Field(
        default=None, description="The capacity provider's EC2 instance type (managed only)."
    )
    managed_instances: int = Field(default=0, ge=0, description="Instances it runs.")
    managed_target_utilisation: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="The utilisation the provider scales its instances to (a GPU pool's "
        "scaling target: its GPUs' computing share of the period, not their wall-clock busy "
        "share); None: the fixed pool of `managed_instances`.",
    )

    @model_validator(mode="after")
    def _one_provider(self) -> TrafficPlan:
        managed = any(c.policy == "managed" for c in self.capacity)
        provider = self.managed_instance_type is not None and self.managed_instances >= 1
        if managed and not provider:
            raise ValueError(
                "managed capacity needs managed_instance_type and managed_instances >= 1 "
                "(the stack's capacity provider)"
            )
        if not managed and self.managed_target_utilisation is not None:
            raise ValueError("managed_target_utilisation set, no managed function")
        if not managed and (self.managed_instance_type is not None or self.managed_instances):
            raise ValueError("managed_instance_type or managed_instances set, no managed function")
        accelerated = {
            c.accelerator_memory_gib is not None for c in self.capacity if c.policy == "managed"
        }
        if len(accelerated) > 1:
            raise ValueError(
                "the stack's one capacity provider runs either GPU instances or CPU ones: every "
                "managed function has an accelerator_memory_gib, or none has"
            )
        return self

    @property
    def accelerated(self) -> bool:
        """Whether the capacity provider runs GPU instances (its functions have accelerators)."""
        return any(c.accelerator_memory_gib is not None for c in self.capacity)


class StreamPlan(_Strict):
    """How a decoder serves a request stream with continuously batching workers
    (`ground.stream`): the workers' batch, admission, results and scale, chosen by
    `plan --traffic SPEC --slo-ttft S --slo-tpot S`. The worker is the plan's driver (or its one
    function): its memory, hardware and remote experts are the plan's."""

    traffic: dict[str, Any] = Field(description="The stream it was planned on: spec, scale, ...")
    slots: int = Field(ge=1, description="Sequences one worker decodes together, at most.")
    workers: int = Field(
        ge=1, description="Workers at most: the event source mapping's maximum concurrency."
    )
    idle_exit_s: float = Field(gt=0, description="A worker returns after this long idle.")
    prefill_chunk_tokens: int = Field(ge=1, description="Prompt tokens per prefill pass.")
    flush_tokens: int = Field(ge=1, description="Tokens per result chunk after the first.")
    poll_s: float = Field(gt=0, description="ReceiveMessage interval while decoding.")
    max_prompt_tokens: int = Field(ge=1, description="Longest prompt admitted.")
    max_new_tokens: int = Field(ge=1, description="Longest generation admitted.")
    visibility_timeout_s: int = Field(
        ge=1, description="The queue's: a dead worker's requests reappear after it."
    )
    step_s: list[float] = Field(
        min_length=1, description="Planned decode step seconds at 1..slots sequences."
    )
    prefill_token_s: float = Field(gt=0, description="Planned prefill seconds per prompt token.")
    slo_ttft_s: float = Field(gt=0)
    slo_tpot_s: float = Field(gt=0)
    simulated: dict[str, Any] = Field(
        description="TTFT/TPOT quantiles, tokens per second, workers and bill over the period."
    )

    @model_validator(mode="after")
    def _table_covers_slots(self) -> StreamPlan:
        if len(self.step_s) != self.slots:
            raise ValueError(f"step_s has {len(self.step_s)} entries for {self.slots} slots")
        return self


class Plan(_Strict):
    """A deployment plan; see the module docstring."""

    format_version: Literal[2] = PLAN_VERSION
    solver: str
    workflow: Literal["express", "standard"]
    objective: Literal["full", "experts"]
    nonmoe_memory_mb: int = Field(description="Memory of the head, gate and tail functions.")
    optimal: bool | None
    arch: Literal["x86_64", "arm64"]
    direct_payload_bytes: int = Field(gt=0)
    counts_source: dict[str, Any]
    model: ModelRef
    calibration: dict[str, Any]
    layers: list[LayerPlan]
    totals: Totals
    traffic: TrafficPlan | None = None
    deployment: str = Field(
        default="workflow",
        description="How a request runs: a name in `ground.topology.TOPOLOGIES` (workflow, "
        "driver, monolithic).",
    )
    driver: DriverPlan | None = None
    generation: GenerationPlan | None = None
    stream: StreamPlan | None = Field(
        default=None, description="Continuously batching workers over a queue (generation)."
    )
    candidates: list[dict[str, Any]] | None = Field(
        default=None,
        description="Every shape `plan` weighed for this batch: its bill and latency, or why "
        "it was infeasible (`planner.deployments.Candidate.describe`).",
    )
    concurrency_quota: int | None = Field(
        default=None,
        gt=0,
        description="The account's Lambda concurrency quota the plan was checked against "
        "(`plan --concurrency-quota`): what `synth` checks its reservations against unless "
        "given another. None: none recorded (plans before it), `DEFAULT_CONCURRENCY_QUOTA`.",
    )

    @field_validator("deployment")
    @classmethod
    def _known_deployment(cls, name: str) -> str:
        if name not in TOPOLOGIES:
            raise ValueError(f"unknown deployment '{name}': one of {', '.join(TOPOLOGIES)}")
        return name

    @property
    def topology(self) -> Topology:
        """What this plan's deployment runs (`ground.topology`): ask it, never the name."""
        return topology(self.deployment)

    def _check_driver(self) -> None:
        """A driver or monolithic plan's driver: present, within Lambda's memory and timeout,
        its local experts and the layers' functions holding every expert once."""
        topology = self.topology
        if topology.driven != (self.driver is not None):
            raise ValueError(f"a {self.deployment} plan needs a driver exactly when driven")
        if self.driver is None:  # the fan-out workflow: no driver to check
            return
        cal = self.calibration
        low, high = cal["lambda_min_memory_mb"], cal["lambda_max_memory_mb"]
        if not low <= self.nonmoe_memory_mb <= high:
            raise ValueError(f"driver memory {self.nonmoe_memory_mb} MB outside {low}-{high} MB")
        if self.driver.time_s > cal["max_timeout_s"]:
            raise ValueError(
                f"the driver runs {self.driver.time_s:.1f} s, over Lambda's "
                f"{cal['max_timeout_s']} s timeout"
            )
        if len(self.driver.local) != len(self.layers) or [len(x) for x in self.driver.local] != [
            len(x) for x in self.driver.local_tokens
        ]:
            raise ValueError("driver.local and local_tokens need one list per layer, alike")
        topology.check_expert_functions(sum(len(layer.experts) for layer in self.layers))
        for layer in self.layers:
            if layer.method != "direct" or any(len(e.hosted) != 1 for e in layer.experts):
                raise ValueError(
                    f"layer {layer.layer}: the driver invokes its experts directly, one each"
                )

    @model_validator(mode="after")
    def _deployable(self) -> Plan:
        cal = self.calibration
        low, high = cal["lambda_min_memory_mb"], cal["lambda_max_memory_mb"]
        if len(self.layers) != self.model.num_layers:
            raise ValueError(
                f"has {len(self.layers)} layers but the model has {self.model.num_layers}"
            )
        self._check_driver()
        for layer in self.layers:
            local = None if self.driver is None else self.driver.local[layer.layer]
            _check_hosting(layer, self.model.experts, local)
        sizes = {len(e.hosted) for layer in self.layers for e in layer.experts}
        if len(sizes) > 1:
            raise ValueError(
                f"its functions host {sorted(sizes)} experts: the cost model prices one "
                "group size per plan"
            )
        for layer in self.layers:
            for e in layer.experts:
                where = f"layer {layer.layer} expert {e.expert}"
                if not low <= e.memory_mb <= high:
                    raise ValueError(f"{where}: memory {e.memory_mb} MB outside {low}-{high} MB")
                if e.time_s > cal["max_timeout_s"]:
                    raise ValueError(
                        f"{where}: a replica runs {e.time_s:.1f} s, over Lambda's "
                        f"{cal['max_timeout_s']} s timeout"
                    )
                if not e.replicas <= e.max_replicas <= cal["max_replicas"]:
                    raise ValueError(
                        f"{where}: needs replicas <= max_replicas <= G = {cal['max_replicas']}"
                    )
                if layer.method != "direct" and e.max_replicas > cal["map_max_concurrency"]:
                    raise ValueError(
                        f"{where}: {e.max_replicas} replicas exceed an inline Map's "
                        f"{cal['map_max_concurrency']} concurrent iterations"
                    )
                if layer.method == "direct" and not self.topology.driven:  # a driver overflows
                    token_bytes = max(self.model.token_bytes_in, self.model.token_bytes_out)
                    shard = -(-math.ceil(e.tokens) // e.replicas)
                    for what, rows in (
                        ("a planned shard", shard),
                        ("max_tokens_per_replica", e.max_tokens_per_replica),
                    ):
                        payload = direct_event_bytes(rows, token_bytes, len(e.hosted))
                        if payload > self.direct_payload_bytes:
                            raise ValueError(
                                f"{where}: {what} of {rows:,} tokens makes a direct event of "
                                f"{payload:,} bytes (rows base64 in JSON), over the "
                                f"{self.direct_payload_bytes:,}-byte limit"
                            )
            if layer.method != "direct" and len(layer.experts) > cal["map_max_concurrency"]:
                raise ValueError(
                    f"layer {layer.layer}: {len(layer.experts)} experts exceed an inline Map's "
                    f"{cal['map_max_concurrency']} concurrent iterations; use direct"
                )
        if self.traffic is not None and self.traffic.accelerated:
            self._check_accelerators(self.traffic)
        if self.traffic is not None:
            named = [c.function for c in self.traffic.capacity]
            if named != self.topology.function_names(self.layers):
                raise ValueError(
                    f"traffic.capacity names {named}, not the plan's functions in order"
                )
        if self.generation is not None and not self.topology.generates:
            raise ValueError(f"a {self.deployment} plan does not generate")
        if self.stream is not None and (self.generation is None or self.traffic is not None):
            raise ValueError(
                "a stream plan generates (it has `generation`) and its workers are its front "
                "door (it has no `traffic` batch policy)"
            )
        limit = cal["express_max_duration_s"]
        run_s = self.totals.latency_s if self.generation is None else self.generation.run_s
        if self.workflow == "express" and run_s > limit:
            raise ValueError(
                f"latency {run_s:.1f} s exceeds an Express workflow's {limit} s; "
                "use --workflow standard"
            )
        return self

    def _check_accelerators(self, traffic: TrafficPlan) -> None:
        """GPU-backed functions: an Image package (every function is) on x86_64, with an
        accelerator size Lambda offers (the plan's calibration lists them)."""
        if self.arch != "x86_64":
            raise ValueError(f"GPU-backed functions run on x86_64 only, the plan is {self.arch}")
        sizes = self.calibration.get("lambda_accelerator_memory_gib")
        for c in traffic.capacity:
            if c.accelerator_memory_gib is None:
                continue
            if sizes is None or c.accelerator_memory_gib not in sizes:
                raise ValueError(
                    f"{c.function}: accelerator_memory_gib {c.accelerator_memory_gib} is not one "
                    f"of Lambda's AcceleratorMemorySize values {sizes} (calibration "
                    "lambda_accelerator_memory_gib)"
                )

    @property
    def packed(self) -> bool:
        """Whether some function hosts more than one expert."""
        return any(len(e.hosted) > 1 for layer in self.layers for e in layer.experts)

    def reserved_concurrency(self) -> int:
        """Concurrency the stack reserves: each expert function's `max_replicas`."""
        return sum(e.max_replicas for layer in self.layers for e in layer.experts)

    def check_concurrency_quota(
        self, quota: int | None = None, *, synthesising: bool = False
    ) -> None:
        """Refuse a stack whose reservations leave less than Lambda's unreserved minimum of the
        account's concurrency `quota`: CloudFormation would fail midway through the deploy.

        `quota` None checks against the quota the plan recorded when it was made
        (`concurrency_quota`), else `DEFAULT_CONCURRENCY_QUOTA`. `synthesising` says the caller
        can also drop the reservations (synth's --no-reserve-concurrency); planning cannot, so
        its advice does not offer that.

        Raises:
            PlanError: The reservations do not fit, naming the numbers and the ways out.
        """
        recorded = quota is None and self.concurrency_quota is not None
        if quota is None:
            quota = self.concurrency_quota or DEFAULT_CONCURRENCY_QUOTA
        floor = int(self.calibration.get("lambda_unreserved_concurrency_min", 100))
        reserved = self.reserved_concurrency()
        if reserved + floor > quota:
            raise PlanError(
                f"the stack reserves {reserved:,} concurrent executions (every expert's "
                f"max_replicas), and Lambda keeps {floor} unreserved: {reserved + floor:,} is "
                f"over the account's concurrency quota of {quota:,}"
                + (" (the one the plan was made under)." if recorded else "."),
                "ask AWS for a higher quota and pass it as --concurrency-quota"
                + (
                    ", pass --no-reserve-concurrency (experts then share the unreserved pool)"
                    if synthesising
                    else ""
                )
                + ", or plan with a lower max_replicas (G) in a calibration file (--calibration).",
            )

    def within_concurrency_quota(self, quota: int) -> Plan:
        """This plan, checked against the account's concurrency `quota`
        (`check_concurrency_quota`) and recording it, so that `synth` checks against the same
        quota without being told it again.

        Raises:
            PlanError: The reservations do not fit the quota.
        """
        self.check_concurrency_quota(quota)
        return self.model_copy(update={"concurrency_quota": quota})

    def save(self, path: str | Path, *, force: bool = False) -> Path:
        path = Path(path)
        write_file_atomically(
            path, lambda tmp: tmp.write_text(self.model_dump_json(indent=1)), force=force
        )
        return path

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """Read and validate a plan.

        Raises:
            PlanError: Missing, unreadable, or failing a deployment check (named).
            UsageError: The file is another kind of document (a GPU plan, counts, ...).
        """
        refuse_other_kind(path, "plan", "--plan")
        return read_document(
            cls, path, PlanError, "plan", "make the plan again with `moelambda plan --out FILE`."
        )
