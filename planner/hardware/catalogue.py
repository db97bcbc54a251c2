"""GPU types with their speeds and prices: what every GPU hardware kind is priced from.

Every number lives in a data file with its source and date, so no algorithm hard-codes a price:
the types' speeds in `planner/data/gpu_catalogue.json`, and every price in the calibration
only. A type names in `price_from` the instance it is priced on (t4 on g4dn.xlarge, l4 on
g6.xlarge, a10g on g5.xlarge, l40s on g6e.xlarge, a100 on p4d.24xlarge): its price is that
`ec2_instance_prices` entry (planner/data/calibration.json) divided by the instance's GPUs,
with the entry's `source_kind`. GPU-backed Lambda (`planner.hardware.gpu_model`) and the
GPU-cluster backend (`gpu`, whose clusters `gpu.cluster` reads) both read it; a cluster file
may still define a type of its own with its own price. A type's `usable_memory_mib` is what
its device exposes (`GpuType.usable_gib`, at most the nominal `memory_gb`): GPU-backed Lambda
bounds every placement by it, while the GPU-cluster backend keeps its own headroom on
`memory_gb`.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ground.errors import MoelambdaError, did_you_mean

if TYPE_CHECKING:
    from planner.calibration import Calibration

__all__ = ["Catalogue", "GpuType", "HardwareError", "load_catalogue"]


class HardwareError(MoelambdaError):
    """A GPU catalogue or cluster file that cannot be used."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Parameter(_Strict):
    value: float
    unit: str
    source: str
    as_of: str


class GpuType(_Strict):
    """One GPU type: what it computes, moves and costs."""

    gpu: str
    instance: str
    memory_gb: float = Field(gt=0)
    usable_memory_mib: int | None = Field(
        default=None,
        gt=0,
        description="MiB the device exposes (nvidia-smi's memory.total), at most the nominal "
        "memory_gb: what a GPU-backed Lambda function has at most whatever accelerator size it "
        "asks; None: the nominal memory is taken as usable (a cluster file's own type).",
    )
    peak_tflops: float = Field(gt=0, description="Dense FP16/BF16 tensor peak.")
    network_gbps: float = Field(gt=0, description="This GPU's share of the instance network.")
    memory_gbps: float | None = Field(
        default=None,
        gt=0,
        description="Memory bandwidth, GB/s: a decode step reads every weight it uses "
        "(`gpu.generation`); None: the type is not offered for generation.",
    )
    usd_per_gpu_hour: float = Field(gt=0)
    price_source_kind: str | None = Field(
        default=None,
        description="The kind of the price's source, as the calibration names kinds (aws, "
        "secondary, ...); None: not said (a cluster file's own type).",
    )
    source: str
    as_of: str

    @model_validator(mode="after")
    def _usable_within_nominal(self) -> GpuType:
        if self.usable_memory_mib is not None and self.usable_memory_mib > self.memory_gb * 1024:
            raise ValueError(
                f"usable_memory_mib {self.usable_memory_mib} exceeds memory_gb {self.memory_gb:g}"
                " (GiB, as GPU memory is counted)"
            )
        return self

    @property
    def usable_gib(self) -> float:
        """GiB the device exposes: a nominal 48-GB L40S exposes 44.99 GiB."""
        if self.usable_memory_mib is None:
            return self.memory_gb
        return self.usable_memory_mib / 1024

    @property
    def bandwidth(self) -> float:
        """NIC bytes per second."""
        return self.network_gbps * 1e9 / 8

    def flops(self, mfu: float) -> float:
        """FLOP/s reached at model-FLOPs utilisation `mfu`."""
        return self.peak_tflops * 1e12 * mfu


class _CatalogueType(GpuType):
    """A type as the catalogue writes it: no price of its own, but `price_from`, an instance
    type of the calibration's `ec2_instance_prices` whose hourly price, divided by its GPUs, is
    this type's."""

    usd_per_gpu_hour: None = None  # type: ignore[assignment]
    price_source_kind: None = None
    usable_memory_mib: int = Field(gt=0)  # the catalogue gives every type's, with its source
    price_from: str = Field(min_length=1)


class _CatalogueFile(_Strict):
    schema_version: int
    note: str
    defaults: dict[str, _Parameter]
    types: dict[str, _CatalogueType]
    default_type: str
    # GPU platforms billed per second, validated where they are priced (gpu.serverless)
    serverless_platforms: dict[str, dict[str, Any]] = Field(default_factory=dict)


_FIX = "fix planner/data/gpu_catalogue.json."


def _priced(name: str, entry: _CatalogueType, calibration: Calibration) -> GpuType:
    """`entry` with its price: the calibration's instance type's, per GPU."""
    cal = calibration
    where = cal.source_path or "the calibration"
    instance = (cal.ec2_instance_prices or {}).get(entry.price_from)
    if instance is None or instance.gpu != name or instance.gpus < 1:
        found = "lists no such type" if instance is None else f"gives it GPU {instance.gpu!r}"
        raise HardwareError(
            f"the catalogue prices '{name}' from ec2_instance_prices.{entry.price_from} of "
            f"{where}, which {found}.",
            f"add {entry.price_from} with gpu '{name}' and its price to ec2_instance_prices "
            "there (lambda_managed false where no capacity provider should run it).",
        )
    fields = entry.model_dump(exclude={"price_from"})
    fields["usd_per_gpu_hour"] = instance.hourly_usd / instance.gpus
    fields["price_source_kind"] = cal.source_kind("ec2_instance_prices", entry.price_from)
    return GpuType(**fields)


class Catalogue(_Strict):
    """The catalogue's types and the modelling defaults (`mfu`, `kernel_s`, `max_utilisation`)."""

    types: dict[str, GpuType]
    default_type: str
    mfu: float
    kernel_s: float
    max_utilisation: float

    def get(self, name: str) -> GpuType:
        if name not in self.types:
            raise HardwareError(
                f"unknown GPU type '{name}'.{did_you_mean(name, list(self.types))}",
                f"use one of: {', '.join(sorted(self.types))}, or define it in the cluster file.",
            )
        return self.types[name]


def load_catalogue(calibration: Calibration | None = None) -> Catalogue:
    """The packaged catalogue, validated, each type priced by the `ec2_instance_prices` entry
    its `price_from` names in `calibration` (None: the packaged one)."""
    text = resources.files("planner").joinpath("data/gpu_catalogue.json").read_text()
    doc = _CatalogueFile.model_validate_json(text)
    if doc.default_type not in doc.types:
        raise HardwareError(
            f"the catalogue's default type '{doc.default_type}' is not one of its types.",
            _FIX,
        )
    if calibration is None:
        from planner.calibration import load_calibration

        calibration = load_calibration()
    return Catalogue(
        types={name: _priced(name, entry, calibration) for name, entry in doc.types.items()},
        default_type=doc.default_type,
        mfu=doc.defaults["mfu"].value,
        kernel_s=doc.defaults["kernel_s"].value,
        max_utilisation=doc.defaults["max_utilisation"].value,
    )
