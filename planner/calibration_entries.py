"""The calibration file's entries: a parameter with its unit, source, date and kind of source,
and the structured values (prices, references, limits) `planner.calibration.Calibration` holds.

A number's source says where it comes from, strongest first: AWS's own page, a paper, someone
else's transcription ("secondary"), computed from other numbers ("derived"), measured by this
project, assumed; `Parameter` checks that its source and its declared kind agree.
"""

from __future__ import annotations

import re
from datetime import date
from itertools import pairwise
from typing import Literal, get_args

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

__all__ = [
    "SOURCE_KINDS",
    "ColdStartReference",
    "DecodeStepTable",
    "Ec2InstancePrice",
    "ExpertComputeReference",
    "IdleReclaim",
    "LambdaPrice",
    "ManagedApiPrice",
    "ManagedInstancesPrice",
    "ManagedInstancesScaling",
    "Parameter",
    "ProvisionedPrice",
    "SnapStartPrice",
    "SourceKind",
    "is_aws_url",
]

# Where a number comes from, strongest first: read on AWS's own page (aws.amazon.com, its docs
# and its blogs); a paper's own setting or measurement; someone else's transcription of a page
# ("secondary"); computed from other numbers ("derived"); measured by this project; assumed.
SourceKind = Literal["aws", "paper", "secondary", "derived", "measured", "assumed"]
SOURCE_KINDS: tuple[str, ...] = get_args(SourceKind)
_PREFIXED = ("measured", "assumed", "derived", "secondary")  # kinds a source may start with
_URL = re.compile(r"https?://([^/\s)'\";,]+)")


def is_aws_url(url_or_host: str) -> bool:
    """Whether a URL (or host) is one of AWS's own pages: aws.amazon.com or a subdomain."""
    match = _URL.match(url_or_host)
    host = (match.group(1) if match else url_or_host).lower()
    return host == "aws.amazon.com" or host.endswith(".aws.amazon.com")


def _leading_kind(source: str) -> str | None:
    """The kind a source names by its first word ("measured: ...", "assumed: ...")."""
    word = re.match(r"[a-z]+", source.strip().lower())
    return word.group(0) if word and word.group(0) in _PREFIXED else None


class Parameter(BaseModel):
    """One entry of the file: a value with the provenance a reviewer needs to trust it.

    `source` is a URL, or starts with measured, assumed, derived or secondary (then ':' or
    ' by ...'), so that every source is classifiable. `source_kind` says how far the value can
    be trusted: one kind, or, for a value that is an object, a map from each of its keys to the
    kind of the least-sourced number under that key (an instance type whose size AWS lists but
    whose price was transcribed elsewhere is "secondary"). Without it the kind is read off the
    source: its leading word, else "aws" for a URL on AWS's own pages and "secondary" for any
    other URL. A declared kind must agree with the source: "aws" needs an AWS URL in it,
    "paper" and "secondary" a URL elsewhere (or a leading "secondary"), and "measured",
    "assumed" and "derived" that word in the source or the note; a source that leads with a
    kind's word has that kind.

    A measured value (the whole value or any key of it) names in `command` the command that
    measures it, as a user runs it from the repository's root (`moelambda calibrate`,
    `python scripts/runtime-memory.py driver_runtime_mb`): "measured" is then a claim anyone can
    re-check, not a word. Each such command takes `--dry-run`, which names what it would
    measure without measuring (tests/planner/test_measured_commands.py runs every one).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: JsonValue
    unit: str = Field(min_length=1)
    source: str = Field(min_length=1)
    as_of: date
    note: str | None = None
    source_kind: SourceKind | dict[str, SourceKind] | None = None
    command: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _classifiable(self) -> Parameter:
        inferred = self.inferred_kind()
        if inferred is None:
            raise ValueError(
                f"source {self.source[:60]!r} is neither a URL nor starts with measured:, "
                "assumed:, derived: or secondary:, so where the value comes from cannot be "
                "told"
            )
        declared = self.source_kind
        if declared is None:
            return self
        if isinstance(declared, dict):
            if not isinstance(self.value, dict) or set(declared) != set(self.value):
                keys = sorted(self.value) if isinstance(self.value, dict) else []
                raise ValueError(
                    f"source_kind maps {sorted(declared)} but the value's keys are {keys}: "
                    "give one kind per key, or one kind for the whole value"
                )
            kinds = set(declared.values())
        else:
            leading = _leading_kind(self.source)
            if leading is not None and leading != declared:
                raise ValueError(f"source_kind {declared!r}, but the source says {leading!r}")
            kinds = {declared}
        for kind in sorted(kinds):
            self._check_kind(kind)
        return self

    @model_validator(mode="after")
    def _measured_by_a_command(self) -> Parameter:
        if self.command is None and "measured" in self.kinds():
            raise ValueError(
                "source_kind 'measured' needs the command that measures it: add \"command\" "
                '(as run from the repository\'s root, e.g. "moelambda calibrate"), or label '
                "the value by what it is (assumed, derived)"
            )
        return self

    def kinds(self) -> set[SourceKind]:
        """Every kind of this entry: its value's, or each of its keys'."""
        declared = self.source_kind
        if isinstance(declared, dict):
            return set(declared.values())
        return {self.kind()}

    def _check_kind(self, kind: str) -> None:
        urls = [m.group(0) for m in _URL.finditer(self.source)]
        text = f"{self.source} {self.note or ''}".lower()
        if kind == "aws" and not any(is_aws_url(u) for u in urls):
            raise ValueError("source_kind 'aws' needs a URL on aws.amazon.com in the source")
        if kind in ("paper", "secondary") and not (
            any(not is_aws_url(u) for u in urls) or _leading_kind(self.source) == kind
        ):
            raise ValueError(f"source_kind {kind!r} needs the URL it was read at in the source")
        if kind in ("measured", "assumed", "derived") and not re.search(rf"\b{kind}\b", text):
            raise ValueError(f"source_kind {kind!r}, but neither the source nor the note says so")

    def inferred_kind(self) -> SourceKind | None:
        """The kind the source alone gives (None: unclassifiable)."""
        leading = _leading_kind(self.source)
        if leading is not None:
            return leading  # type: ignore[return-value]
        match = _URL.match(self.source.strip())
        if match is None:
            return None
        return "aws" if is_aws_url(match.group(0)) else "secondary"

    def kind(self, key: str | None = None) -> SourceKind:
        """The kind of the value, or of its `key` where the kinds are given per key."""
        declared = self.source_kind
        if isinstance(declared, dict):
            if key is None or key not in declared:  # the whole value: its weakest part
                return max(declared.values(), key=SOURCE_KINDS.index)
            return declared[key]
        kind = declared or self.inferred_kind()
        assert kind is not None  # validated
        return kind


class LambdaPrice(BaseModel):
    """What Lambda charges for one architecture."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gb_second_usd: PositiveFloat
    request_usd: PositiveFloat


class ExpertComputeReference(BaseModel):
    """The expert on which U_j was measured, so the planner can scale U_j to other experts.

    U_j is only meaningful with the size of the expert it was timed on: `flops_per_token` lets
    `planner.compute.expert_compute_s` scale it to another expert, and the machine and torch
    version say whether the numbers still apply after an upgrade.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: PositiveInt
    width: PositiveInt
    flops_per_token: PositiveInt
    threads_efficiency: float = Field(gt=0, le=1)
    t1_s_per_token: PositiveFloat
    batch_tokens: PositiveInt
    torch_version: str = Field(min_length=1)
    cpu_model: str = Field(min_length=1)


class ProvisionedPrice(BaseModel):
    """What provisioned concurrency costs on one architecture: the configured environments
    all the time, and the invocations they serve at a lower duration rate."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocated_gb_second_usd: PositiveFloat
    duration_gb_second_usd: PositiveFloat


class SnapStartPrice(BaseModel):
    """SnapStart's two charges (Python and .NET): the cached snapshot, and each restore."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cache_gb_second_usd: PositiveFloat
    restore_gb_usd: PositiveFloat


class IdleReclaim(BaseModel):
    """How long an idle execution environment survives: AWS publishes no number, so this is an
    assumption (`assumed_s`) inside the range measurements have reported (`low_s`, `high_s`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    assumed_s: PositiveFloat
    low_s: PositiveFloat
    high_s: PositiveFloat

    @model_validator(mode="after")
    def _ordered(self) -> IdleReclaim:
        if not self.low_s <= self.assumed_s <= self.high_s:
            raise ValueError("needs low_s <= assumed_s <= high_s")
        return self


class ManagedInstancesPrice(BaseModel):
    """Lambda Managed Instances' own charges; the EC2 instances under them are priced apart."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    request_usd: PositiveFloat
    management_fee_fraction: PositiveFloat
    default_instances: PositiveInt


class ManagedInstancesScaling(BaseModel):
    """How a Lambda Managed Instances capacity provider grows: it scales asynchronously on
    utilisation, not on arriving invocations, so it keeps headroom for traffic that doubles
    within `doubling_window_s` (faster growth may be throttled), at a CPU utilisation target
    for a CPU pool and a GPU one for a GPU pool (fractions of 1); a new instance serves after
    `instance_start_s`. The floor of instances is `ManagedInstancesPrice.default_instances`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    doubling_window_s: PositiveFloat
    cpu_utilization_target: float = Field(gt=0, le=1)
    gpu_utilization_target: float = Field(gt=0, le=1)
    instance_start_s: PositiveFloat


class ManagedApiPrice(BaseModel):
    """A managed serverless API's list price for one open model: what a user would pay per
    token instead of deploying it (`plan --slo-tpot` reports the bill per million tokens beside
    it). `model_id` is the provider's name of the offering (often the instruction-tuned
    variant of the architecture the key names)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    provider: str = Field(min_length=1)
    model_id: str = Field(min_length=1)
    input_per_million_usd: PositiveFloat
    output_per_million_usd: PositiveFloat


class Ec2InstancePrice(BaseModel):
    """One EC2 instance type: its size, its architecture (as Lambda spells it: a plan's
    functions run on one) and its on-demand Linux price per hour, before Lambda Managed
    Instances' management fee. A Managed Instances capacity provider is planned on it unless
    `lambda_managed` is false (a GPU type priced for the GPU-cluster backend only): every GPU
    price lives here, none in the GPU catalogue.

    A GPU instance type also has `gpus` GPUs of `gpu_memory_gib` each, of the GPU type `gpu`
    names (a key of the GPU backend's planner/data/gpu_catalogue.json, whose speeds a GPU-backed
    function's compute is modelled with; that the key exists is checked by the tests, as the
    planner does not import the GPU backend). Lambda takes `AcceleratorConfig` only on x86_64,
    so a GPU type must be x86_64.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    vcpus: PositiveInt
    memory_gib: PositiveFloat
    hourly_usd: PositiveFloat
    arch: Literal["x86_64", "arm64"]
    gpus: int = Field(default=0, ge=0)
    gpu_memory_gib: float = Field(default=0.0, ge=0)  # each GPU's
    gpu: str | None = Field(default=None, min_length=1)
    lambda_managed: bool = True

    @model_validator(mode="after")
    def _gpus_described(self) -> Ec2InstancePrice:
        if self.gpus == 0:
            if self.gpu_memory_gib or self.gpu is not None:
                raise ValueError("gpu_memory_gib and gpu describe GPUs: set gpus too, or neither")
            return self
        if self.gpu_memory_gib <= 0 or self.gpu is None:
            raise ValueError(
                f"{self.gpus} GPUs need their memory (gpu_memory_gib > 0, per GPU) and their "
                "type (gpu: a key of planner/data/gpu_catalogue.json)"
            )
        if self.arch != "x86_64":
            raise ValueError("a GPU instance type must be x86_64: Lambda accelerators are x86_64")
        return self


class ColdStartReference(BaseModel):
    """A handler's INIT on this machine, measured by `moelambda calibrate --cold` in fresh
    processes: the interpreter's start, the import of each role's handler module, and loading a
    stage's weights from (moto) S3 and building it, fitted as fixed + per-byte seconds.

    The weights' download on Lambda runs at B^s, not at a local moto's speed, so the INIT model
    (`ground.coldstart.InitModel`) adds it from the bandwidth; the fitted load time covers
    reading the downloaded file and building the torch module.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    python_start_s: float = Field(ge=0)
    import_s: dict[str, PositiveFloat]
    load_fixed_s: float = Field(ge=0)
    load_s_per_byte: float = Field(ge=0)
    config_objects: int = Field(ge=0)
    config_bytes: int = Field(ge=0)
    # What an expert downloads before its stage: the manifest alone (None, in a reference
    # measured before experts stopped reading config/: they are taken to download it all).
    manifest_bytes: int | None = Field(default=None, ge=0)
    repeats: PositiveInt
    samples: list[dict[str, float | int | str]] = Field(default_factory=list)
    torch_version: str = Field(min_length=1)
    cpu_model: str = Field(min_length=1)

    @field_validator("import_s")
    @classmethod
    def _every_role(cls, import_s: dict[str, float]) -> dict[str, float]:
        missing = {"head", "layer", "expert", "tail"} - set(import_s)
        if missing:
            raise ValueError(f"needs an import time for every role, missing {sorted(missing)}")
        return import_s


class DecodeStepTable(BaseModel):
    """A decoder's decode step measured at several batch sizes (`moelambda calibrate
    --decode-table`): `step_s[i]` seconds for one step of `batches[i]` sequences, on one torch
    thread, i.e. a function of `memory_mb` (one vCPU); `planner.stream` interpolates between
    the batches. A table, not a single floor: a step of a few rows is bound by per-layer
    overhead and weight reads, and a batch shares them (issue 47).

    More vCPUs do not shorten such a step in proportion: much of it is one thread's dispatch
    of small operations. `two_thread_ratio[i]` is the step on two threads over the step on
    one (wall time, measured alike), from which `serial_fraction` gives Amdahl's serial share,
    the part of the step more threads do not shorten; `planner.stream` scales the step to a
    function's vCPUs with it, not with the reference expert's parallel efficiency (a large
    matmul's)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    batches: tuple[PositiveInt, ...] = Field(min_length=1)
    step_s: tuple[PositiveFloat, ...] = Field(min_length=1)
    two_thread_ratio: tuple[PositiveFloat, ...] = Field(min_length=1)
    memory_mb: PositiveFloat
    context_tokens: PositiveInt  # each sequence's context while measured
    repeats: PositiveInt
    torch_version: str = Field(min_length=1)
    cpu_model: str = Field(min_length=1)

    @model_validator(mode="after")
    def _one_time_per_batch(self) -> DecodeStepTable:
        if not len(self.batches) == len(self.step_s) == len(self.two_thread_ratio):
            raise ValueError(
                f"{len(self.batches)} batches, {len(self.step_s)} step times and "
                f"{len(self.two_thread_ratio)} two-thread ratios: one of each per batch"
            )
        if any(a >= b for a, b in pairwise(self.batches)):
            raise ValueError(f"batches must increase, got {list(self.batches)}")
        return self

    @property
    def serial_fraction(self) -> tuple[float, ...]:
        """Amdahl's serial share per batch: a step on n threads takes step x (s + (1 - s) / n),
        so two threads' ratio r = s + (1 - s) / 2 gives s = 2r - 1 (clipped to [0, 1]: a ratio
        above one, two threads slower, is all serial; below one half, all parallel)."""
        return tuple(min(1.0, max(0.0, 2.0 * r - 1.0)) for r in self.two_thread_ratio)
