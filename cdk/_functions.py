"""One container-image Lambda function per stage of the Plan, each with least-privilege access.

Roles (handler strings select them in the one image built from Dockerfile.expert):
head, one gate function per layer, one function per expert of every layer, tail, cleanup.
Every function reads only its own weights (plus `manifest.json`, and `config/*` but for an
expert, which builds its stage from the manifest alone) and only the keys of its own layer and
expert (`ground.access`, which `run-local` enforces); only the tail writes `outputs/`; only the
tail and cleanup delete.

Memory, reserved concurrency and limits come from the Plan alone (head, gates and tail get its
`nonmoe_memory_mb`; an expert reserves its `max_replicas`, the most replicas its gate may use);
every function runs torch on the vCPUs its memory buys (`ground.semantics.threads_for`).

A plan made for traffic (`plan.traffic`) also says how each function is kept warm, and the
stack emits it: provisioned concurrency k as a published version with an alias `live` that
holds k provisioned environments, which the workflow and the gates then invoke (invoking the
unqualified function would never use them); a warmer as EventBridge Scheduler schedules, one
per concurrent ping, invoking the function (or its alias) every N minutes with
`{"warmer": true}` (`functions.warm`), through one role per stack allowed to invoke exactly
the warmed functions; managed as the function attached to the stack's one capacity provider
(`cdk._managed`), with the memory of its managed environment and no reserved concurrency
(its fixed pool of environments is its limit), and, where the plan gives it
`accelerator_memory_gib`, that much GPU memory per environment on the provider's GPU
instances (its `AcceleratorConfig`). A plan without managed capacity has no VPC.

A stream plan (`plan.stream`, `cdk._stream`) has no workflow: the driver's construction
(its memory, image, weights, local experts and remote expert functions) makes the stream's
worker instead (`add_worker`, `functions.worker`), beside the endpoint (`add_endpoint`), and
there is no cleanup function (nothing would invoke it: the worker deletes what it wrote).

A GPU-backed function runs the same handlers from the same Dockerfile built with CUDA torch
(build argument `DEVICE=cuda`: its own image asset) and places its stages on the device at the
precision the GPU model prices (`ground.placement.GPU`, through MOELAMBDA_DEVICE and
MOELAMBDA_DTYPE); every other function's image is the CPU-only one.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import CfnParameter, Duration, IgnoreMode, NestedStack, RemovalPolicy, Size
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_scheduler as scheduler
from constructs import Construct

from cdk._managed import ManagedInstances
from ground import access
from ground.access import Access
from ground.errors import UsageError
from ground.frontdoor import BATCHER_MEMORY_MB
from ground.placement import CPU, GPU
from ground.plan import FunctionCapacity, Plan
from ground.semantics import threads_for

__all__ = [
    "DEFAULT_BASE_IMAGE",
    "DEFAULT_WEIGHTS_PREFIX",
    "DOCKERFILE",
    "FunctionOptions",
    "ServingFunctions",
    "handler",
    "image_build_args",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = "Dockerfile.expert"
DEFAULT_WEIGHTS_PREFIX = "weights/"
DEFAULT_BASE_IMAGE = "public.ecr.aws/lambda/python:3.12"  # Dockerfile.expert's BASE_IMAGE
TIMEOUT_MARGIN = 2.0  # a function's timeout over its predicted run: cold starts, noisy hosts
_TMP_SLACK_MB = 64  # /tmp beside the weights: the manifest, config files, Python's own
# Template bytes of one expert function with its role, as CDK writes them: measured 4.7 KB
# hosting 2 experts and 11.3 KB hosting 30 (each hosted expert adds its weights' key to the
# role's GetObject and ListBucket statements). Expert functions whose estimate passes
# _EXPERT_BYTES_PER_STACK go into nested stacks, leaving room for the parent's gates and
# workflow under CloudFormation's 1 MB per template.
_FUNCTION_BYTES, _HOSTED_BYTES = 4_200, 240
_EXPERT_BYTES_PER_STACK = 400_000
_DIGEST = re.compile(r"[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}")
# Only what Dockerfile.expert copies goes into the asset (the repo root has .venv, caches, out/).
_ASSET_EXCLUDE = [
    "*",
    "!Dockerfile.expert",
    "!requirements-image.txt",
    "!moelambda",
    "!moe",
    "!functions",
    "!ground",
    "!pipeline",
    "**/__pycache__",
    "**/*.pyc",
]


def _instance_vcpus(plan: Plan, instance_type: str) -> int | None:
    """The vCPUs of an EC2 instance type as the plan's calibration lists it
    (`ec2_instance_prices`), or None where it does not."""
    listed = (plan.calibration.get("ec2_instance_prices") or {}).get(instance_type)
    return None if listed is None else int(listed["vcpus"])


def handler(role: str) -> str:
    """The handler string of a role (the contract's `functions.<role>.handler`)."""
    return f"functions.{role}.handler"


def image_build_args(base_image: str | None, device: str) -> dict[str, str] | None:
    """Dockerfile.expert's build arguments: its base image when pinned, and `DEVICE=cuda` for
    a GPU-backed function's image (CUDA torch); None for the default CPU image."""
    args = {"BASE_IMAGE": base_image} if base_image else {}
    if device != CPU.device:
        args["DEVICE"] = device
    return args or None


@dataclass(frozen=True, kw_only=True)
class FunctionOptions:
    """Deployment knobs that are not in the Plan.

    Args:
        expert_timeout_s: Timeout of the expert functions. Defaults to 300 s.
        stage_timeout_s: Timeout of head, gates, tail and cleanup (a direct gate waits for
            its experts). Defaults to 600 s.
        reserve_concurrency: Reserve each expert function's `max_replicas` of concurrency.
            Defaults to True; turn it off on accounts with a small concurrency quota.
        cleanup_memory_mb: Memory of the cleanup function. Defaults to 256 MB.
        weights_prefix: Key prefix of the exported weights. Defaults to "weights/".
        log_retention: How long each function's log group keeps its logs. Defaults to 30 days.
        tracing: X-Ray active tracing on every function (and the workflow). Defaults to off.
        base_image: The image's base pinned by digest (`repository@sha256:<64 hex>`).
            Defaults to None: Dockerfile.expert's tag, which moves as AWS patches it.
        concurrency_quota: The account's Lambda concurrency quota a stream plan's worker
            reservation is checked against (`cdk._stream`). Defaults to None: the quota the plan
            was made under, else `ground.plan.DEFAULT_CONCURRENCY_QUOTA`.
        experts_per_stack: With more expert functions than this (or more estimated template
            bytes than 400 KB: a function hosting many experts has a long policy), they go into
            nested stacks of whole layers, at most this many each (a layer with more gets one
            of its own). Defaults to 64: with a role each and two outputs each (name and ARN,
            which the gates and the workflow read), a nested template stays far within
            CloudFormation's 500 resources, 200 outputs and 1 MB.
    """

    expert_timeout_s: int = 300
    stage_timeout_s: int = 600
    reserve_concurrency: bool = True
    cleanup_memory_mb: int = 256
    weights_prefix: str = DEFAULT_WEIGHTS_PREFIX
    log_retention: logs.RetentionDays = logs.RetentionDays.ONE_MONTH
    tracing: bool = False
    base_image: str | None = None
    experts_per_stack: int = 64
    concurrency_quota: int | None = None

    def __post_init__(self) -> None:
        if self.experts_per_stack < 1:
            raise UsageError(
                f"{self.experts_per_stack} expert functions per stack is not positive.",
                "pass 1 or more (default 64).",
            )
        if self.base_image is not None and not _DIGEST.fullmatch(self.base_image):
            raise UsageError(
                f"base image '{self.base_image}' is not pinned by digest.",
                "pass REPOSITORY@sha256:<64 hex digits>; `docker buildx imagetools inspect "
                "public.ecr.aws/lambda/python:3.12` prints the current digest.",
            )


class ServingFunctions(Construct):
    """The functions of one Plan, by role; `experts[layer][expert]`, `layers[layer]`."""

    def __init__(
        self,
        scope: Construct,
        id_: str,
        *,
        plan: Plan,
        bucket: s3.IBucket,
        options: FunctionOptions,
    ) -> None:
        super().__init__(scope, id_)
        self._plan, self._bucket, self._options = plan, bucket, options
        self._buckets: dict[str, s3.IBucket] = {}  # by nested stack id: the bucket imported
        self.nested: list[NestedStack] = []  # the expert functions' nested stacks, if any
        self._mb_per_vcpu = float(plan.calibration["mb_per_vcpu"])
        self._log_groups: dict[str, logs.LogGroup] = {}
        self._capacity: dict[str, FunctionCapacity] = (
            {c.function: c for c in plan.traffic.capacity} if plan.traffic is not None else {}
        )
        self._aliases: dict[str, lambda_.Alias] = {}  # by function construct path
        self._warmed: list[tuple[Construct, str, lambda_.IFunction, FunctionCapacity]] = []
        self.access: dict[str, Access] = {}  # by construct id: what each function may touch
        self.environments: dict[str, dict[str, str]] = {}  # by construct id, as given
        self.batcher: lambda_.DockerImageFunction | None = None  # the front door's, if any
        self.worker: lambda_.DockerImageFunction | None = None  # a stream plan's (cdk._stream)
        self.endpoint: lambda_.DockerImageFunction | None = None  # a stream plan's
        self._architecture = (
            lambda_.Architecture.ARM_64 if plan.arch == "arm64" else lambda_.Architecture.X86_64
        )
        self._platform = (
            ecr_assets.Platform.LINUX_ARM64
            if plan.arch == "arm64"
            else ecr_assets.Platform.LINUX_AMD64
        )
        self.managed = (
            ManagedInstances(
                self,
                "Managed",
                traffic=plan.traffic,
                architecture=self._architecture,
                instance_vcpus=_instance_vcpus(plan, plan.traffic.managed_instance_type),
            )
            if plan.traffic is not None and plan.traffic.managed_instance_type is not None
            else None
        )
        keys = {(s.role, s.layer, s.expert): s.key for s in plan.model.stages}
        self._stage_bytes = {s.key: s.bytes for s in plan.model.stages}
        stage_timeout = Duration.seconds(options.stage_timeout_s)
        self.topology = plan.topology
        self.head: lambda_.DockerImageFunction | None = None
        self.tail: lambda_.DockerImageFunction | None = None
        self.driver: lambda_.DockerImageFunction | None = None
        self.experts: list[list[lambda_.DockerImageFunction]] = []
        self.layers: list[lambda_.DockerImageFunction] = []
        if self.topology.driven:
            self._driver(plan, keys, options)
        else:
            self._workflow(plan, keys, options, stage_timeout)
        # Only the workflow invokes the cleanup: a stream plan has none.
        self.cleanup: lambda_.DockerImageFunction | None = (
            None
            if plan.stream is not None
            else self._function(
                "Cleanup",
                role="cleanup",
                memory_mb=options.cleanup_memory_mb,
                timeout=stage_timeout,
                access=access.cleanup(),
                weights=None,
            )
        )
        self._warmers()

    def _workflow(
        self,
        plan: Plan,
        keys: dict[tuple[str, int | None, int | None], str],
        options: FunctionOptions,
        stage_timeout: Duration,
    ) -> None:
        """The fan-out workflow's functions: head, a gate per layer, every expert, tail."""
        self.head = self._function(
            "Head",
            role="head",
            memory_mb=plan.nonmoe_memory_mb,
            timeout=stage_timeout,
            access=access.head(),
            weights=[keys[("head", None, None)]],
            capacity="head",
        )
        scopes = self._expert_scopes(plan, options.experts_per_stack)
        for layer, where in zip(plan.layers, scopes, strict=True):
            ll = f"{layer.layer:02d}"
            experts = []
            # A direct expert's response must fit the same limit as its event.
            payload_limit = (
                {"MOELAMBDA_PAYLOAD_LIMIT": str(plan.direct_payload_bytes)}
                if layer.method == "direct"
                else {}
            )
            for e in layer.experts:
                # A function hosting several experts is named after its slot, not an expert.
                hosts = {"MOELAMBDA_HOSTS": ",".join(map(str, e.hosts))} if e.hosts else {}
                fn = self._function(
                    f"Layer{ll}{'Function' if e.hosts else 'Expert'}{e.expert:02d}",
                    scope=where,
                    role="expert",
                    log_group=f"Layer{ll}Experts",
                    memory_mb=e.memory_mb,
                    timeout=self._timeout(options.expert_timeout_s, e.time_s),
                    access=access.expert(layer.layer, e.expert, layer.method),
                    weights=[keys[("expert", layer.layer, m)] for m in e.hosted],
                    environment={
                        "MOELAMBDA_LAYER": str(layer.layer),
                        "MOELAMBDA_EXPERT": str(e.expert),
                        "MOELAMBDA_METHOD": layer.method,
                        "MOELAMBDA_BETA": str(layer.beta),
                        **hosts,
                        **payload_limit,
                    },
                    reserved=e.max_replicas if options.reserve_concurrency else None,
                    capacity=f"layer{ll}/expert{e.expert:02d}",
                )
                experts.append(fn)
            layer_plan = {
                "method": layer.method,
                "beta": layer.beta,
                "replicas": [e.replicas for e in layer.experts],
                "max_replicas": [e.max_replicas for e in layer.experts],
                "max_tokens": [e.max_tokens_per_replica for e in layer.experts],
                "payload_limit": plan.direct_payload_bytes,
                "expert_functions": [self.target(fn).function_name for fn in experts],
            }
            if any(e.hosts for e in layer.experts):
                layer_plan["hosts"] = [e.hosted for e in layer.experts]
            gate = self._function(
                f"Layer{ll}",
                role="layer",
                memory_mb=plan.nonmoe_memory_mb,
                # A direct gate waits for its slowest expert: the layer's latency.
                timeout=self._timeout(options.stage_timeout_s, layer.latency_s)
                if layer.method == "direct"
                else stage_timeout,
                access=access.gate(layer.layer, layer.method),
                weights=[keys[("layer", layer.layer, None)]],
                environment={
                    "MOELAMBDA_LAYER": str(layer.layer),
                    # Function names are tokens; they resolve inside the JSON (an Fn::Join).
                    "MOELAMBDA_LAYER_PLAN": json.dumps(layer_plan, separators=(",", ":")),
                },
                # A direct gate invokes its own experts, and only those.
                invokes=[self.target(fn) for fn in experts] if layer.method == "direct" else None,
                capacity=f"layer{ll}",
            )
            self.experts.append(experts)
            self.layers.append(gate)
        self.tail = self._function(
            "Tail",
            role="tail",
            memory_mb=plan.nonmoe_memory_mb,
            timeout=stage_timeout,
            access=access.tail(plan.layers[-1].layer, front_door=plan.traffic is not None),
            weights=[keys[("tail", None, None)]],
            capacity="tail",
        )

    def _driver(
        self,
        plan: Plan,
        keys: dict[tuple[str, int | None, int | None], str],
        options: FunctionOptions,
    ) -> None:
        """A driver or monolithic plan's functions: the driver, and each remote expert's own
        function, which only the driver invokes (`ground.driver`). A stream plan's driver is
        its worker, which `add_worker` makes from what this keeps (`_driven`)."""
        from ground.driver import encode_local

        assert plan.driver is not None
        scopes = self._expert_scopes(plan, options.experts_per_stack)
        limit = {"MOELAMBDA_PAYLOAD_LIMIT": str(plan.direct_payload_bytes)}
        for layer, where in zip(plan.layers, scopes, strict=True):
            ll = f"{layer.layer:02d}"
            self.experts.append(
                [
                    self._function(
                        f"Layer{ll}Expert{e.hosted[0]:02d}",
                        scope=where,
                        role="expert",
                        log_group=f"Layer{ll}Experts",
                        memory_mb=e.memory_mb,
                        timeout=self._timeout(options.expert_timeout_s, e.time_s),
                        access=access.driver_expert(layer.layer, e.expert),
                        weights=[keys[("expert", layer.layer, e.hosted[0])]],
                        environment={
                            "MOELAMBDA_LAYER": str(layer.layer),
                            "MOELAMBDA_EXPERT": str(e.expert),
                            "MOELAMBDA_HOSTS": str(e.hosted[0]),
                            "MOELAMBDA_METHOD": "direct",
                            "MOELAMBDA_DRIVER": "1",
                            **limit,
                        },
                        reserved=e.max_replicas if options.reserve_concurrency else None,
                        capacity=f"layer{ll}/expert{e.expert:02d}",
                    )
                    for e in layer.experts
                ]
            )
        stages = [keys[("head", None, None)], keys[("tail", None, None)]]
        for layer, local in zip(plan.layers, plan.driver.local, strict=True):
            stages.append(keys[("layer", layer.layer, None)])
            stages.extend(keys[("expert", layer.layer, i)] for i in local)
        remote = [layer.layer for layer in plan.layers if layer.experts]
        environment = {"MOELAMBDA_DRIVER_LOCAL": encode_local(plan.driver.local), **limit}
        self._driven = (stages, remote, environment)
        if plan.stream is not None:
            return  # its worker serves the queue (add_worker): no driver, no workflow
        self.driver = self._function(
            "Driver",
            role="driver",
            memory_mb=plan.nonmoe_memory_mb,
            timeout=self._timeout(options.stage_timeout_s, plan.driver.time_s),
            access=access.driver(remote, front_door=plan.traffic is not None),
            weights=stages,
            environment=environment,
            invokes=[self.target(fn) for experts in self.experts for fn in experts],
            capacity="driver",
            one_stage_at_a_time=True,
        )

    def tasks(self) -> list[lambda_.DockerImageFunction]:
        """The functions the state machine invokes as Tasks (its role may invoke them)."""
        assert self.cleanup is not None  # a plan with a workflow
        if self.topology.driven:
            assert self.driver is not None
            return [self.driver, self.cleanup]
        assert self.head is not None and self.tail is not None
        return [self.head, *self.layers, self.tail, self.cleanup]

    def target(self, fn: lambda_.IFunction) -> lambda_.IFunction:
        """What the workflow and the gates invoke for `fn`: its `live` alias when the plan
        provisions concurrency for it, else the function itself."""
        return self._aliases.get(fn.node.path, fn)

    def _keep_warm(
        self, scope: Construct, id_: str, fn: lambda_.DockerImageFunction, name: str
    ) -> None:
        """The plan's capacity policy of the function the plan calls `name`."""
        cap = self._capacity.get(name)
        if cap is None or cap.policy == "none":
            return
        if cap.policy == "provisioned":
            self._aliases[fn.node.path] = lambda_.Alias(
                scope,
                f"{id_}Live",
                alias_name="live",
                version=fn.current_version,
                provisioned_concurrent_executions=cap.provisioned_concurrency,
            )
            return
        self._warmed.append((scope, id_, self.target(fn), cap))

    def _warmers(self) -> None:
        """One schedule per concurrent ping of each warmed function, and per stack one role
        that may invoke exactly the warmed functions of that stack."""
        by_scope: dict[str, list[tuple[Construct, str, lambda_.IFunction, FunctionCapacity]]]
        by_scope = {}
        for entry in self._warmed:
            by_scope.setdefault(entry[0].node.path, []).append(entry)
        for entries in by_scope.values():
            scope = entries[0][0]
            role = iam.Role(
                scope,
                "WarmerRole",
                assumed_by=iam.ServicePrincipal("scheduler.amazonaws.com"),
                inline_policies={
                    "Invoke": iam.PolicyDocument(
                        statements=[
                            iam.PolicyStatement(
                                actions=["lambda:InvokeFunction"],
                                resources=[target.function_arn for _, _, target, _ in entries],
                            )
                        ]
                    )
                },
            )
            for _, id_, target, cap in entries:
                assert cap.warmer_interval_s is not None
                minutes = int(cap.warmer_interval_s // 60)
                for k in range(cap.warmer_concurrency):
                    scheduler.CfnSchedule(
                        scope,
                        f"{id_}Warmer{k}",
                        description=f"moelambda warmer of {id_} ({k + 1}/"
                        f"{cap.warmer_concurrency})",
                        flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(
                            mode="OFF"
                        ),
                        schedule_expression=f"rate({minutes} minute{'s' if minutes > 1 else ''})",
                        target=scheduler.CfnSchedule.TargetProperty(
                            arn=target.function_arn,
                            role_arn=role.role_arn,
                            input=json.dumps({"warmer": True}),
                            retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                                maximum_retry_attempts=0
                            ),
                        ),
                    )

    def _expert_scopes(self, plan: Plan, per_stack: int) -> list[Construct]:
        """Where each layer's expert functions go: this stack, or, once the plan has more than
        `per_stack` of them or more than _EXPERT_BYTES_PER_STACK of their estimated template,
        nested stacks of whole layers within both."""
        counts = [len(layer.experts) for layer in plan.layers]
        sizes = [
            sum(_FUNCTION_BYTES + _HOSTED_BYTES * len(e.hosted) for e in layer.experts)
            for layer in plan.layers
        ]
        if sum(counts) <= per_stack and sum(sizes) <= _EXPERT_BYTES_PER_STACK:
            return [self] * len(plan.layers)
        scopes: list[Construct] = []
        held = size = 0
        for layer, count, layer_size in zip(plan.layers, counts, sizes, strict=True):
            full = held + count > per_stack or size + layer_size > _EXPERT_BYTES_PER_STACK
            if not self.nested or full:
                self.nested.append(self._nested(f"ExpertsFromLayer{layer.layer:02d}"))
                held = size = 0
            scopes.append(self.nested[-1])
            held += count
            size += layer_size
        return scopes

    def _nested(self, id_: str) -> NestedStack:
        """A nested stack that sees the bucket through its own parameters, BucketArn and
        BucketName, so its policies name `<BucketArn>/...` whatever the parent calls it."""
        nested = NestedStack(
            self,
            id_,
            parameters={
                "BucketArn": self._bucket.bucket_arn,
                "BucketName": self._bucket.bucket_name,
            },
        )
        arn, name = (CfnParameter(nested, key) for key in ("BucketArn", "BucketName"))
        self._buckets[nested.node.id] = s3.Bucket.from_bucket_attributes(
            nested, "Bucket", bucket_arn=arn.value_as_string, bucket_name=name.value_as_string
        )
        return nested

    def bucket_in(self, scope: Construct) -> s3.IBucket:
        """The bucket as the stack holding `scope` refers to it."""
        for nested in self.nested:
            if scope is nested or nested in scope.node.scopes:
                return self._buckets[nested.node.id]
        return self._bucket

    def all(self) -> list[lambda_.DockerImageFunction]:
        """Every function of the stack (the front door's batcher, a stream's worker and
        endpoint too, once added)."""
        experts = [fn for layer in self.experts for fn in layer]
        first = [self.driver] if self.topology.driven else [self.head, *self.layers]
        last = [self.tail, self.cleanup, self.batcher, self.worker, self.endpoint]
        return [fn for fn in [*first, *experts, *last] if fn is not None]

    def add_worker(
        self,
        *,
        timeout: Duration,
        reserved: int,
        environment: dict[str, str],
        statements: list[iam.PolicyStatement],
    ) -> lambda_.DockerImageFunction:
        """A stream plan's generation worker (`functions.worker`): the driver as `_driver`
        would make it (memory, image, weights, local experts, payload limit, Invoke on its
        remote experts only), with the worker's access (`ground.access.worker`), `timeout`,
        `reserved` concurrency, and `environment` and `statements` (its queue) added."""
        stages, remote, driven = self._driven
        self.worker = self._function(
            "Worker",
            role="worker",
            memory_mb=self._plan.nonmoe_memory_mb,
            timeout=timeout,
            access=access.worker(remote),
            weights=stages,
            environment=driven | environment,
            invokes=[self.target(fn) for experts in self.experts for fn in experts],
            statements=statements,
            reserved=reserved,
            capacity="driver",
            one_stage_at_a_time=True,
        )
        return self.worker

    def add_endpoint(
        self,
        *,
        memory_mb: int,
        timeout: Duration,
        environment: dict[str, str],
        statements: list[iam.PolicyStatement],
    ) -> lambda_.DockerImageFunction:
        """A stream plan's endpoint (`functions.endpoint`, behind its Function URL), from the
        same image: it reads the results and the tokenizer (`ground.access.endpoint`), no
        weights, plus `statements` (sending to its queue)."""
        self.endpoint = self._function(
            "Endpoint",
            role="endpoint",
            memory_mb=memory_mb,
            timeout=timeout,
            access=access.endpoint(self._options.weights_prefix),
            weights=None,
            environment=environment,
            statements=statements,
        )
        return self.endpoint

    def add_batcher(
        self, *, environment: dict[str, str], statements: list[iam.PolicyStatement]
    ) -> lambda_.DockerImageFunction:
        """The front door's batching function (`functions.batcher`), from the same image: it
        writes only its executions' inputs (`ground.access.batcher`), plus `statements` (its
        queue and its state machine, which the front door names)."""
        self.batcher = self._function(
            "Batcher",
            role="batcher",
            memory_mb=BATCHER_MEMORY_MB,
            timeout=Duration.seconds(self._options.stage_timeout_s),
            access=access.batcher(),
            weights=None,
            environment=environment,
            statements=statements,
        )
        return self.batcher

    def _timeout(self, default_s: int, predicted_s: float) -> Duration:
        """The default timeout, or TIMEOUT_MARGIN times the plan's prediction if that is longer,
        never over Lambda's limit (the planner keeps every prediction within it)."""
        limit = int(self._plan.calibration["max_timeout_s"])
        wanted = max(default_s, math.ceil(TIMEOUT_MARGIN * predicted_s))
        return Duration.seconds(min(limit, wanted))

    def _function(
        self,
        id_: str,
        *,
        role: str,
        memory_mb: int,
        timeout: Duration,
        access: Access,
        weights: list[str] | None,
        environment: dict[str, str] | None = None,
        invokes: list[lambda_.IFunction] | None = None,
        statements: list[iam.PolicyStatement] | None = None,
        reserved: int | None = None,
        log_group: str = "Stages",
        scope: Construct | None = None,
        capacity: str | None = None,
        one_stage_at_a_time: bool = False,
    ) -> lambda_.DockerImageFunction:
        scope = scope or self
        prefix = self._options.weights_prefix
        managed = self._capacity.get(capacity) if capacity is not None else None
        if managed is None or managed.policy != "managed":
            managed = None
        else:
            reserved = None  # the managed pool is the limit
        placement = GPU if managed and managed.accelerator_memory_gib is not None else CPU
        if weights is not None:
            access = access.with_weights(prefix, weights, config=role != "expert")
        self.access[id_] = access
        extra = statements or []
        statements = self._statements(access, self.bucket_in(scope)) + extra
        if invokes:
            arns = [fn.function_arn for fn in invokes]
            statements.append(
                iam.PolicyStatement(
                    actions=["lambda:InvokeFunction"],
                    resources=arns,  # each expert's alias where it has one, else unqualified
                )
            )
        # A layer's experts share a log group, the other functions another: a group per
        # function would be a third resource per function and put a 12 x 16 plan over
        # CloudFormation's 500. Each function may write only to its group, which the stack
        # owns and expires (no AWS managed policy granting logs on every group).
        group = self._log_group(log_group, scope)
        statements.append(
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                resources=[f"{group.log_group_arn}:*"],
            )
        )
        # One role per function with its policy inline: two resources per function, not three
        # (a role plus a separate policy), which keeps large plans under the 500-resource quota.
        execution_role = iam.Role(
            scope,
            f"{id_}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            inline_policies={"Access": iam.PolicyDocument(statements=statements)},
        )
        variables = {
            "MOELAMBDA_BUCKET": self.bucket_in(scope).bucket_name,
            "MOELAMBDA_WEIGHTS_PREFIX": prefix,
            "MOELAMBDA_THREADS": str(threads_for(memory_mb, self._mb_per_vcpu)),
            **placement.environment(),
            **(environment or {}),
        }
        self.environments[id_] = variables  # references as tokens (cdk._stream sizes them)
        fn = lambda_.DockerImageFunction(
            scope,
            id_,
            code=lambda_.DockerImageCode.from_image_asset(
                str(REPO_ROOT),
                file=DOCKERFILE,
                cmd=[handler(role)],
                build_args=image_build_args(self._options.base_image, placement.device),
                platform=self._platform,
                exclude=_ASSET_EXCLUDE,
                ignore_mode=IgnoreMode.DOCKER,
            ),
            role=execution_role,
            log_group=group,
            ephemeral_storage_size=self._storage(weights or [], one_stage_at_a_time),
            tracing=lambda_.Tracing.ACTIVE if self._options.tracing else None,
            architecture=self._architecture,
            memory_size=memory_mb if managed is None else managed.managed_memory_mb,
            timeout=timeout,
            reserved_concurrent_executions=reserved,
            environment=variables,
            description=f"moelambda {role} {id_}",
        )
        if managed is not None:
            assert self.managed is not None  # TrafficPlan names the provider
            self.managed.attach(fn, managed)
        elif capacity is not None:
            cap = self._capacity.get(capacity)
            if cap is not None and reserved is not None and cap.provisioned_concurrency > reserved:
                raise UsageError(
                    f"{capacity}: provisioned concurrency {cap.provisioned_concurrency} exceeds "
                    f"the {reserved} the function reserves (Lambda refuses it).",
                    "plan again with --traffic, or synth with --no-reserve-concurrency.",
                )
            self._keep_warm(scope, id_, fn, capacity)
        return fn

    def _storage(self, weights: list[str], one_at_a_time: bool = False) -> Size | None:
        """/tmp for the weights a function downloads (`functions.weights`), with room for the
        runtime's own files: the free default unless they need more (a packed function).

        `functions.weights` deletes a stage's file once it is built; a driver, which builds
        its stages one after another, needs room for the largest alone (`one_at_a_time`)."""
        cal = self._plan.calibration
        default, most = cal["ephemeral_storage_default_mb"], cal["ephemeral_storage_max_mb"]
        sizes = [self._stage_bytes[key] for key in weights]
        held = max(sizes, default=0) if one_at_a_time else sum(sizes)
        needed = math.ceil(held / 2**20) + _TMP_SLACK_MB
        return None if needed <= default else Size.mebibytes(min(needed, most))

    @property
    def weights_prefix(self) -> str:
        return self._options.weights_prefix

    def log_groups(self) -> list[logs.LogGroup]:
        """The functions' log groups: one for head, gates, tail and cleanup, one per layer."""
        return list(self._log_groups.values())

    def _log_group(self, name: str, scope: Construct) -> logs.LogGroup:
        """The log group `name` ("Stages" or "LayerNNExperts"), created on first use in
        `scope` (a layer's experts' group in the stack that holds them)."""
        if name not in self._log_groups:
            self._log_groups[name] = logs.LogGroup(
                scope,
                f"{name}Logs",
                retention=self._options.log_retention,
                removal_policy=RemovalPolicy.DESTROY,
            )
        return self._log_groups[name]

    def _statements(self, access: Access, bucket: s3.IBucket) -> list[iam.PolicyStatement]:
        """The S3 statements of `access`: one per action, listing only what it may read."""
        statements = []
        for action, patterns in (
            ("s3:GetObject", access.read),
            ("s3:PutObject", access.write),
            ("s3:DeleteObject", access.delete),
        ):
            if patterns:
                resources = [bucket.arn_for_objects(p) for p in patterns]
                statements.append(iam.PolicyStatement(actions=[action], resources=resources))
        if access.listed:
            statements.append(
                iam.PolicyStatement(
                    actions=["s3:ListBucket"],
                    resources=[bucket.bucket_arn],
                    conditions={"StringLike": {"s3:prefix": list(access.listed)}},
                )
            )
        return statements
