"""What a stack's Lambda Managed Instances cost: its environments packed onto EC2 instances.

A stack has one capacity provider (one instance type) for all its managed functions. Each
managed function keeps `n_f` environments (`ground.managed`: whole vCPUs, 2 GiB per vCPU); the
provider runs

    instances = max(default instances, instances the environments pack onto)

for the whole period, packed first-fit decreasing (an environment lives on one instance), and
the stack picks the instance type of the plan's architecture whose instances cost least. The
bill of a period of h hours with r invocations of managed functions:

    instances x h x hourly price x (1 + management fee) + r x request price

A pool is of CPU or of GPU instances (`managed_prices(..., accelerated=...)`). A CPU pool packs
onto the instance types without GPUs only, so a CPU plan's bill does not change with the GPU
types the calibration prices; a GPU pool (GPU-backed functions, `AcceleratorConfig`) packs onto
the types with GPUs only, by the same rule and the same bill. A GPU-backed environment takes
its vCPUs and memory from its instance as any other, and one whole GPU of that instance with at
least its AcceleratorMemorySize: AWS documents the size as the least memory "of each
accelerator device exposed to the execution environment" and says Lambda "might allocate more,
depending on the accelerator instance types available" (Lambda API reference,
AcceleratorConfig), so a device is exposed to one environment, not divided among several (the
smaller sizes, 3, 6 and 12 GiB, are those of the fractional-GPU G6f types, whose fractions are
devices of their own; the calibration prices none, so here they take a whole GPU).

Not every price under that bill was read on AWS's own pages (the calibration's `source_kind`
says which were transcribed elsewhere or derived): `ManagedPrices.sources_note` names them in
the bill's notes.

Approximations: the instances' own share for the Lambda agent and the OS is not subtracted
from their vCPUs and memory (AWS publishes none); instances run the whole period (a fixed
environment count needs no scaling); first-fit decreasing (by GPU memory, then by vCPUs) may
use more instances than the optimal packing, never fewer: at most 11/9 of it plus one when
vCPUs alone bind, with no such bound once memory and GPUs bind too (tests/traffic/
test_managed_gpu.py compares it with an exhaustive search on small cases).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from ground.managed import MB_PER_GIB, environment_memory_mb, environment_vcpus
from planner.calibration import Calibration, load_calibration

__all__ = ["InstanceChoice", "InstanceType", "ManagedPrices", "managed_prices", "pack"]

_EPS = 1e-9  # GiB compared after float arithmetic


@dataclass(frozen=True)
class InstanceChoice:
    """The capacity provider's instance type and how many instances it runs."""

    instance_type: str
    instances: int
    hourly_usd: float  # one instance, before the management fee


class InstanceType(NamedTuple):
    """An instance type a pool can run: its size, its price and its GPUs (none: a CPU type)."""

    name: str
    vcpus: int
    memory_gib: float
    hourly_usd: float  # one instance, before the management fee
    gpus: int = 0
    gpu_memory_gib: float = 0.0  # each GPU's
    gpu: str | None = None  # the GPU's key in planner/data/gpu_catalogue.json


@dataclass(frozen=True)
class ManagedPrices:
    """LMI's prices and the instance types of one pool (calibration file)."""

    request_usd: float
    fee_fraction: float
    default_instances: int
    mb_per_vcpu: float
    types: tuple[InstanceType, ...]
    # The kind of source of each price (`planner.calibration.SourceKind`): "request_usd",
    # "management_fee_fraction" and each instance type's name; None where it is not recorded.
    # Empty: not known (prices built by hand), and no note is made.
    source_kinds: tuple[tuple[str, str | None], ...] = ()
    # The AcceleratorMemorySize values Lambda takes (GiB); empty: not checked.
    accelerator_sizes_gib: tuple[int, ...] = ()

    @property
    def gpu_types(self) -> tuple[InstanceType, ...]:
        """The pool's instance types with GPUs."""
        return tuple(t for t in self.types if t.gpus)

    def sizes(self, memory_mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(vCPUs, GiB) of one environment of each function planned at `memory_mb`."""
        vcpus = np.array([environment_vcpus(float(m), self.mb_per_vcpu) for m in memory_mb])
        mb = np.array([environment_memory_mb(float(m), self.mb_per_vcpu) for m in memory_mb])
        return vcpus.astype(np.int64), mb / MB_PER_GIB

    def choose(
        self,
        memory_mb: np.ndarray,
        environments: np.ndarray,
        accelerator_gib: np.ndarray | None = None,
    ) -> InstanceChoice | None:
        """The cheapest instance type and count for `environments[f]` environments of each
        function planned at `memory_mb[f]`, each also holding `accelerator_gib[f]` GiB of one
        GPU (its AcceleratorMemorySize; 0 or None: no accelerator). None: no instance type holds
        the largest environment (a type without GPUs holds no accelerator).

        Raises:
            ValueError: If a used accelerator size is not one Lambda takes.
        """
        acc = None if accelerator_gib is None else np.asarray(accelerator_gib, dtype=float)
        if acc is not None and self.accelerator_sizes_gib:
            asked = {float(a) for a in acc[(environments > 0) & (acc > 0)]}
            wrong = sorted(asked - {float(s) for s in self.accelerator_sizes_gib})
            if wrong:
                raise ValueError(
                    f"AcceleratorMemorySize {wrong} GiB is not one Lambda takes: use one of "
                    f"{list(self.accelerator_sizes_gib)}"
                )
        vcpus, gib = self.sizes(memory_mb)
        best: InstanceChoice | None = None
        for t in self.types:
            count = pack(
                vcpus, gib, environments, t.vcpus, t.memory_gib, acc, t.gpus, t.gpu_memory_gib
            )
            if count is None:
                continue
            choice = InstanceChoice(t.name, max(self.default_instances, count), t.hourly_usd)
            if best is None or choice.instances * t.hourly_usd < best.instances * best.hourly_usd:
                best = choice
        return best

    def sources_note(self, instance_type: str) -> str | None:
        """The note a bill on `instance_type` carries: which of the prices it used were not
        read on AWS's own pages, and how they were had (None: all were, or none is known)."""
        kinds = dict(self.source_kinds)
        hourly = {t.name: t.hourly_usd for t in self.types}
        labels = {
            "request_usd": f"the request charge ({self.request_usd * 1e6:.2f} USD per million)",
            "management_fee_fraction": f"the {self.fee_fraction:.0%} management fee",
            instance_type: f"{instance_type}'s {hourly.get(instance_type, 0.0):.4g} USD per hour",
        }
        weak: dict[str, list[str]] = {}
        for name, label in labels.items():
            if name in kinds and kinds[name] != "aws":
                how = _HOW.get(kinds[name] or "", "its source not recorded in this calibration")
                weak.setdefault(how, []).append(label)
        if not weak:
            return None
        listed = "; ".join(f"{', '.join(items)} ({how})" for how, items in weak.items())
        return (
            "Lambda Managed Instances prices not read on AWS's own pages: "
            f"{listed}; see managed_instances_prices and ec2_instance_prices in the "
            "calibration, and check them at https://aws.amazon.com/lambda/pricing/ and "
            "https://aws.amazon.com/ec2/pricing/on-demand/"
        )

    def bill_usd(self, choice: InstanceChoice, period_s: float, invocations: float) -> float:
        """The instances over the period with the management fee, and the requests."""
        hours = period_s / 3600.0
        instances = choice.instances * hours * choice.hourly_usd * (1.0 + self.fee_fraction)
        return instances + invocations * self.request_usd


def pack(
    vcpus: np.ndarray,
    gib: np.ndarray,
    counts: np.ndarray,
    cap_vcpus: float,
    cap_gib: float,
    accelerator_gib: np.ndarray | None = None,
    gpus: int = 0,
    gpu_memory_gib: float = 0.0,
) -> int | None:
    """Instances that `counts[f]` environments of (`vcpus[f]`, `gib[f]`) fill, each also
    holding one whole GPU of at least `accelerator_gib[f]` GiB (0 or None: no accelerator), on
    instances of `cap_vcpus`, `cap_gib` and `gpus` GPUs of `gpu_memory_gib`: first-fit
    decreasing by GPU memory, then by vCPUs (None: an environment larger than an instance or
    than its GPUs)."""
    used = counts > 0
    if not used.any():
        return 0
    acc = np.zeros(len(counts)) if accelerator_gib is None else np.asarray(accelerator_gib, float)
    needs = acc > 0
    gpu_too_small = gpus == 0 or bool((acc[used & needs] > gpu_memory_gib + _EPS).any())
    if (
        (vcpus[used] > cap_vcpus).any()
        or (gib[used] > cap_gib + _EPS).any()
        or ((used & needs).any() and gpu_too_small)
    ):
        return None
    # By GPU memory, then vCPUs (lexsort sorts by its last key first, stably: without
    # accelerators, the order by vCPUs alone that a CPU pool always had).
    order = np.lexsort((-vcpus, -acc))
    free_v = np.zeros(0)
    free_g = np.zeros(0)
    free_gpus = np.zeros(0, dtype=np.int64)  # each instance's GPUs no environment holds
    for f in order:
        for _ in range(int(counts[f])):
            fits = (free_v >= vcpus[f]) & (free_g >= gib[f] - _EPS)
            if needs[f]:
                fits &= free_gpus > 0
            hit = np.flatnonzero(fits)
            if hit.size:
                i = int(hit[0])
            else:
                i = free_v.size
                free_v = np.append(free_v, cap_vcpus)
                free_g = np.append(free_g, cap_gib)
                free_gpus = np.append(free_gpus, gpus)
            free_v[i] -= vcpus[f]
            free_g[i] -= gib[f]
            free_gpus[i] -= int(needs[f])
    return int(free_v.size)


_HOW = {
    "secondary": "secondary source: a transcription of AWS's page",
    "derived": "derived, not read",
    "assumed": "assumed",
    "measured": "measured",
    "paper": "from a paper",
}


@lru_cache(maxsize=1)
def _packaged() -> Calibration:
    return load_calibration()


def _part(value: object, key: str) -> object:
    """The `key` of a parameter's value: an item of a map or a field of a model (None: none)."""
    return value.get(key) if isinstance(value, dict) else getattr(value, key, None)


def _kind(calibration: Calibration, name: str, key: str) -> str | None:
    """The kind of source of `key` of parameter `name`: from the calibration's provenance, or,
    for a plan's calibration (which records none), from the packaged file's where it holds the
    same value under that key (a plan made before the file priced more instance types keeps
    the kinds of the prices it shares with it); None where neither says."""
    if name in calibration.provenance:
        return calibration.source_kind(name, key)
    packaged = _packaged()
    mine = _part(getattr(calibration, name), key)
    if mine is not None and mine == _part(getattr(packaged, name), key):
        return packaged.source_kind(name, key)
    return None


def managed_prices(
    calibration: Calibration, arch: str, accelerated: bool = False
) -> ManagedPrices | None:
    """LMI's prices and the instance types of a pool on `arch`: the types with GPUs for an
    `accelerated` pool (GPU-backed functions), those without otherwise (None: the calibration
    lacks the prices or such types), with the kind of source of each price."""
    lmi = calibration.managed_instances_prices
    types = {
        name: t
        for name, t in (calibration.ec2_instance_prices or {}).items()
        if t.lambda_managed and t.arch == arch and (t.gpus > 0) == accelerated
    }
    if lmi is None or not types:
        return None
    lmi_name, ec2_name = "managed_instances_prices", "ec2_instance_prices"
    kinds = [
        (key, _kind(calibration, lmi_name, key))
        for key in ("request_usd", "management_fee_fraction")
    ]
    kinds += [(name, _kind(calibration, ec2_name, name)) for name in sorted(types)]
    return ManagedPrices(
        request_usd=lmi.request_usd,
        fee_fraction=lmi.management_fee_fraction,
        default_instances=lmi.default_instances,
        mb_per_vcpu=calibration.mb_per_vcpu,
        types=tuple(
            InstanceType(
                name, t.vcpus, t.memory_gib, t.hourly_usd, t.gpus, t.gpu_memory_gib, t.gpu
            )
            for name, t in sorted(types.items())
        ),
        source_kinds=tuple(kinds),
        accelerator_sizes_gib=calibration.lambda_accelerator_memory_gib or (),
    )
