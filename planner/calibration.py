"""Platform calibration: the Lambda limits, prices and timings every planner computation uses.

All of them live in one versioned file, `planner/data/calibration.json`, each with a unit, a
source and an as-of date, so that no algorithm hard-codes a price or a limit and a reader can
check where every number came from. This module validates that file on load and turns it into a
frozen `Calibration` whose attribute names carry their units.
"""

from __future__ import annotations

import json
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from ground.errors import CalibrationError, did_you_mean
from ground.kinds import refuse_other_kind
from ground.precision import PRECISIONS, Precision
from planner.calibration_entries import (
    SOURCE_KINDS,
    ColdStartReference,
    DecodeStepTable,
    Ec2InstancePrice,
    ExpertComputeReference,
    IdleReclaim,
    LambdaPrice,
    ManagedApiPrice,
    ManagedInstancesPrice,
    ManagedInstancesScaling,
    Parameter,
    ProvisionedPrice,
    SnapStartPrice,
    SourceKind,
    is_aws_url,
)

__all__ = [
    "SCHEMA_VERSION",
    "SOURCE_KINDS",
    "Calibration",
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
    "WeightsSpeed",
    "default_calibration_path",
    "is_aws_url",
    "load_calibration",
]

SCHEMA_VERSION = 1  # the only version this module reads; bump it when a field changes meaning


class _File(BaseModel):
    """The file as written: metadata plus a flat map from attribute name to `Parameter`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int
    region: str = Field(min_length=1)
    about: str | None = None
    parameters: dict[str, Parameter]


class WeightsSpeed(BaseModel):
    """How fast a CPU computes at one weight precision, as seconds there over seconds at fp32
    (fp32 is 1 by definition and not stored): `compute` scales the per-token compute U_j of a
    stage of that precision, `decode_floor` a decode step's floor per layer
    (`decode_layer_floor_s`) when the stack is of that precision."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    compute: PositiveFloat
    decode_floor: PositiveFloat


class Calibration(BaseModel):
    """Validated platform parameters, as plain numbers whose names carry their units.

    Symbols of the design note: `memory_options_mb` is M, `max_replicas` is G,
    `warm_start_s` is T^str, `s3_access_delay_s` is T^dl, `s3_bandwidth_bytes_per_s` is B^s,
    `invoke_bandwidth_bytes_per_s` is B^f, `invoke_payload_bytes` and
    `step_functions_payload_bytes` are D^p, and `expert_token_compute_s` is U_j (one entry per
    memory option; None until `moelambda calibrate` has measured it) on the expert that
    `expert_compute_reference` describes.

    Example:
        >>> calibration = load_calibration()
        >>> calibration.price("arm64").gb_second_usd
        1.33334e-05
        >>> calibration.max_replicas
        8
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    region: str
    lambda_min_memory_mb: PositiveInt
    lambda_max_memory_mb: PositiveInt
    memory_options_mb: tuple[PositiveInt, ...] = Field(min_length=1)
    runtime_overhead_mb: PositiveInt
    max_replicas: PositiveInt
    mb_per_vcpu: PositiveFloat
    max_vcpus: PositiveFloat
    max_timeout_s: PositiveFloat
    ephemeral_storage_default_mb: PositiveInt
    ephemeral_storage_max_mb: PositiveInt
    billing_mb_per_gb: PositiveFloat
    billing_granularity_s: PositiveFloat
    warm_start_s: PositiveFloat
    s3_access_delay_s: PositiveFloat
    s3_bandwidth_bytes_per_s: PositiveFloat
    invoke_bandwidth_bytes_per_s: PositiveFloat
    invoke_payload_bytes: PositiveInt
    step_functions_payload_bytes: PositiveInt
    lambda_prices: dict[str, LambdaPrice] = Field(min_length=1)
    s3_put_request_usd: PositiveFloat
    s3_get_request_usd: PositiveFloat
    step_functions_transition_usd: PositiveFloat
    map_max_concurrency: PositiveInt
    lambda_unreserved_concurrency_min: PositiveInt
    express_max_duration_s: PositiveFloat
    express_request_usd: PositiveFloat
    express_gb_second_usd: PositiveFloat
    express_memory_mb: PositiveInt
    express_duration_step_s: PositiveFloat
    s3_list_request_usd: PositiveFloat
    s3_delete_request_usd: PositiveFloat
    expert_token_compute_s: tuple[PositiveFloat, ...] | None
    expert_compute_reference: ExpertComputeReference | None = None
    # Traffic (cold starts, warm pools, capacity): optional, so that the calibration a plan
    # recorded before they existed still validates; `planner.traffic` says which is missing.
    init_image_start_s: PositiveFloat | None = None
    init_limit_s: PositiveFloat | None = None
    init_billed: bool | None = None
    idle_reclaim_s: IdleReclaim | None = None
    provisioned_concurrency_prices: dict[str, ProvisionedPrice] | None = None
    snapstart_prices: SnapStartPrice | None = None
    scheduler_invocation_usd: PositiveFloat | None = None
    managed_instances_prices: ManagedInstancesPrice | None = None
    managed_instances_scaling: ManagedInstancesScaling | None = None
    ec2_instance_prices: dict[str, Ec2InstancePrice] | None = None  # instance type -> price
    # GPU-backed functions on Managed Instances: the AcceleratorMemorySize values Lambda takes.
    lambda_accelerator_memory_gib: tuple[PositiveInt, ...] | None = Field(
        default=None, min_length=1
    )
    # What a GPU-backed environment's accelerator memory holds beside weights and tensors.
    gpu_runtime_gib: PositiveFloat | None = None
    # What a GPU-backed environment's host memory holds beside the weight it streams to the GPU.
    gpu_host_runtime_mb: PositiveFloat | None = None
    cold_start_reference: ColdStartReference | None = None
    # The batching front door (SQS, its event source mapping, the batcher): optional too, for
    # the calibration of plans made before it; `planner.traffic.platform` fills them.
    sqs_request_usd: PositiveFloat | None = None
    sqs_request_chunk_bytes: PositiveInt | None = None
    sqs_message_max_bytes: PositiveInt | None = None
    sqs_receive_max_messages: PositiveInt | None = None
    sqs_long_poll_s: PositiveFloat | None = None
    sqs_idle_pollers: int | None = Field(default=None, ge=0)
    esm_batching_window_max_s: PositiveFloat | None = None
    esm_batch_size_max: PositiveInt | None = None
    esm_batch_size_max_without_window: PositiveInt | None = None
    start_execution_s: PositiveFloat | None = None
    batcher_import_s: PositiveFloat | None = None
    # Driver and monolithic deployments (`planner.driver`): optional, for the calibration of
    # plans made before them.
    driver_runtime_mb: PositiveInt | None = None
    driver_activation_states: PositiveFloat | None = None
    # Generation (`planner.generation`): optional, for the calibration of plans made before it.
    invoke_round_trip_s: PositiveFloat | None = None
    decode_layer_floor_s: PositiveFloat | None = None
    # A decoder's measured decode step per batch size, by `planner.stream.decode_table_key`
    # (`moelambda calibrate --decode-table`); a model without one has the step modelled.
    decode_step_table: dict[str, DecodeStepTable] | None = None
    managed_api_prices: dict[str, ManagedApiPrice] | None = None  # model name -> list price
    # Weight precisions (`ground.precision`): optional, for the calibration of plans made
    # before them (which served fp32 only). Precision -> its speed on CPUs against fp32's.
    weights_speed: dict[str, WeightsSpeed] | None = None
    # Architecture -> whether CPU Lambda computes bfloat16 (AVX512-BF16, AMX or Arm's BF16).
    lambda_cpu_bf16: dict[str, bool] | None = None
    provenance: dict[str, Parameter] = Field(default_factory=dict, repr=False)
    source_path: Path | None = None

    @field_validator("memory_options_mb")
    @classmethod
    def _increasing_in_range(
        cls, options: tuple[int, ...], info: ValidationInfo
    ) -> tuple[int, ...]:
        """Solvers index options by position and assume a larger index buys more memory."""
        if any(a >= b for a, b in pairwise(options)):
            raise ValueError(f"must be strictly increasing, got {list(options)}")
        low = info.data.get("lambda_min_memory_mb")
        high = info.data.get("lambda_max_memory_mb")
        if low is not None and high is not None:
            outside = [m for m in options if not low <= m <= high]
            if outside:
                raise ValueError(f"{outside} MB outside Lambda's allowed range {low}-{high} MB")
        return options

    @field_validator("expert_token_compute_s")
    @classmethod
    def _one_time_per_option(
        cls, times: tuple[float, ...] | None, info: ValidationInfo
    ) -> tuple[float, ...] | None:
        """U_j is read by memory-option index, so a length mismatch would shift every time."""
        options = info.data.get("memory_options_mb")
        if times is not None and options is not None and len(times) != len(options):
            raise ValueError(
                f"has {len(times)} entries but memory_options_mb has {len(options)}; "
                "give one time per memory option"
            )
        return times

    @field_validator("weights_speed")
    @classmethod
    def _precisions(cls, speeds: dict[str, WeightsSpeed] | None) -> dict[str, WeightsSpeed] | None:
        """Keys are precisions other than fp32, whose speed is the unit the others are in."""
        others = [p for p in PRECISIONS if p != "fp32"]
        unknown = sorted(set(speeds or {}) - set(others))
        if unknown:
            raise ValueError(
                f"{unknown} are not precisions measured against fp32; use {', '.join(others)}"
            )
        return speeds

    @field_validator("lambda_accelerator_memory_gib")
    @classmethod
    def _increasing_sizes(cls, sizes: tuple[int, ...] | None) -> tuple[int, ...] | None:
        """A planner picks the smallest size that holds a function's GPU memory."""
        if sizes is not None and any(a >= b for a, b in pairwise(sizes)):
            raise ValueError(f"must be strictly increasing, got {list(sizes)}")
        return sizes

    def price(self, arch: str) -> LambdaPrice:
        """Lambda prices of one architecture.

        Args:
            arch: Lambda architecture name as CloudFormation spells it, "x86_64" or "arm64".

        Returns:
            The price per GB-second and per request.

        Raises:
            CalibrationError: If the file has no prices for `arch`; suggests a close name.
        """
        if arch not in self.lambda_prices:
            known = sorted(self.lambda_prices)
            raise CalibrationError(
                f"No lambda_prices for architecture '{arch}'.{did_you_mean(arch, known)}",
                f"use one of {', '.join(known)}, or add '{arch}' under "
                f"parameters.lambda_prices in {self.source_path or 'the calibration file'}.",
            )
        return self.lambda_prices[arch]

    def required(self, name: str, needed_for: str) -> Any:
        """The entry `name`, which `needed_for` cannot do without.

        Entries added after the first schema are optional in the file (a plan carries the
        calibration it was made with), but no model may make one up: this is the one place a
        missing entry is refused.

        Raises:
            CalibrationError: The calibration has no `name`; names the entry and the fix.
        """
        value = getattr(self, name)
        if value is None:
            raise CalibrationError(
                f"{self.source_path or 'the calibration'} lacks {name}, which {needed_for} needs.",
                f"copy {name} from the packaged calibration file (planner/data/calibration.json)"
                " into it, or make the plan again with the current moelambda.",
            )
        return value

    def speed_ratio(self, precision: Precision, part: str = "compute") -> float:
        """Seconds at `precision` over seconds at fp32 on CPUs, for the per-token `compute`
        or a decode step's `decode_floor` (`WeightsSpeed`); 1 for fp32.

        Raises:
            CalibrationError: The calibration has no speed for `precision`; names the command
                that measures it.
        """
        if precision == "fp32":
            return 1.0
        speed = (self.weights_speed or {}).get(precision)
        if speed is None:
            raise CalibrationError(
                f"{self.source_path or 'the calibration'} has no weights_speed for "
                f"{precision}, which planning {precision} weights on CPUs needs.",
                "measure it with `moelambda calibrate --weights` (it times each precision "
                "against fp32), copy weights_speed from the packaged calibration file "
                "(planner/data/calibration.json), or make the plan again with the current "
                "moelambda.",
            )
        return float(getattr(speed, part))

    def cpu_refuses(self, precision: Precision, arch: str) -> str | None:
        """Why a CPU Lambda function on `arch` cannot compute at `precision` (None: it can).
        Only bfloat16 needs an instruction set Lambda may lack (`lambda_cpu_bf16`).

        Raises:
            CalibrationError: bf16 asked of a calibration without `lambda_cpu_bf16`.
        """
        if precision != "bf16":
            return None
        computes = self.required("lambda_cpu_bf16", "planning bf16 weights on CPU Lambda")
        if computes.get(arch, False):
            return None
        return (
            f"CPU Lambda ({arch}) is not known to compute bfloat16 (calibration lambda_cpu_bf16 "
            f"{arch}: false), and the handlers refuse bf16 weights on a CPU without it"
        )

    def vcpus_at(self, memory_mb: float) -> float:
        """The CPU share, in vCPUs, that Lambda grants a function of `memory_mb`.

        Lambda allocates CPU in proportion to memory (one vCPU at `mb_per_vcpu` = 1,769 MB), so
        compute times measured on one core scale by this share. The share is capped at
        `max_vcpus`; inside Lambda's range the cap does not bind (10,240 MB gives 5.79), because
        AWS's "6 vCPUs" counts visible cores, not credit.

        Args:
            memory_mb: Configured function memory in MB.

        Returns:
            vCPU-seconds of CPU time per wall-clock second, fractional below 1,769 MB.
        """
        return min(memory_mb / self.mb_per_vcpu, self.max_vcpus)

    def source_kind(self, name: str, key: str | None = None) -> SourceKind | None:
        """The kind of source of parameter `name` (of its `key`, for a value given per key);
        None where this calibration carries no provenance for it (a plan's own calibration)."""
        entry = self.provenance.get(name)
        return None if entry is None else entry.kind(key)

    def describe(self) -> list[tuple[str, JsonValue, str, str]]:
        """Rows (name, value, unit, source) in file order, for a provenance table."""
        return [(name, p.value, p.unit, p.source) for name, p in self.provenance.items()]


def default_calibration_path() -> Path:
    """Path of the calibration file shipped inside the `planner` package."""
    return Path(str(resources.files("planner") / "data" / "calibration.json"))


def load_calibration(path: str | Path | None = None) -> Calibration:
    """Read and validate a calibration file.

    Args:
        path: The JSON file to read. Defaults to None, meaning the packaged default
            (`default_calibration_path()`).

    Returns:
        The validated, frozen calibration.

    Raises:
        CalibrationError: If the file is unreadable, not JSON, of another `schema_version`, or
            misses, misnames or holds an out-of-range value; names each field and the file.
    """
    file_path = default_calibration_path() if path is None else Path(path)
    if path is not None:
        refuse_other_kind(file_path, "calibration", "--calibration")
    try:
        raw = json.loads(file_path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CalibrationError(
            f"Cannot read calibration file {file_path}: {exc.strerror}.",
            "pass an existing calibration JSON file, or none to use the packaged default.",
        ) from None
    except UnicodeDecodeError as exc:
        raise CalibrationError(
            f"Calibration file {file_path} is not UTF-8 text (byte {exc.object[exc.start]:#04x} "
            f"at offset {exc.start}).",
            "pass a calibration JSON file (`moelambda calibrate --out FILE` writes one), or "
            "none to use the packaged default.",
        ) from None
    except json.JSONDecodeError as exc:
        raise CalibrationError(
            f"Calibration file {file_path} is not valid JSON: {exc.msg} "
            f"(line {exc.lineno}, column {exc.colno}).",
            f"correct the JSON syntax at line {exc.lineno} of {file_path}.",
        ) from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if version != SCHEMA_VERSION:
        raise CalibrationError(
            f"Calibration file {file_path} has schema_version {version!r}; "
            f"this moelambda reads schema_version {SCHEMA_VERSION}.",
            f"set schema_version to {SCHEMA_VERSION} in {file_path} after converting its "
            "parameters, or use the packaged default file.",
        )
    try:
        file = _File.model_validate(raw)
    except ValidationError as exc:
        raise _invalid(file_path, exc, within_parameters=False) from None
    values = {name: parameter.value for name, parameter in file.parameters.items()}
    try:
        return Calibration.model_validate(
            values
            | {"region": file.region, "provenance": file.parameters, "source_path": file_path}
        )
    except ValidationError as exc:
        raise _invalid(file_path, exc, within_parameters=True) from None


def _invalid(
    file_path: Path, exc: ValidationError, *, within_parameters: bool
) -> CalibrationError:
    """One CalibrationError naming the JSON paths the user edits (`parameters.<name>.value`)."""
    problems: list[str] = []
    fields: list[str] = []
    for error in exc.errors():
        loc = [str(part) for part in error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        if not within_parameters:
            field = ".".join(loc)
        elif error["type"] == "missing":
            field, message = f"parameters.{loc[0]}", "missing"
        elif error["type"] == "extra_forbidden":
            hint = did_you_mean(loc[0], Calibration.model_fields)
            field, message = f"parameters.{loc[0]}", f"unknown parameter.{hint}"
        else:
            field = ".".join(["parameters", loc[0], "value", *loc[1:]])
        problems.append(f"{field}: {message}")
        fields.append(field)
    return CalibrationError(
        f"Calibration file {file_path} is invalid: " + "; ".join(problems),
        f"correct {', '.join(dict.fromkeys(fields))} in {file_path} (each parameter is an "
        "object with value, unit, source and as_of).",
    )
