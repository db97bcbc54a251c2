"""What a stack's Lambda Managed Instances cost: its environments packed onto EC2 instances.

A stack has one capacity provider (one instance type) for all its managed functions. Each
managed function keeps `n_f` environments (`ground.managed`: whole vCPUs, 2 GiB per vCPU); the
provider runs

    instances = max(default instances, instances the environments pack onto)

for the whole period, packed first-fit decreasing (an environment lives on one instance), and
the stack picks the instance type of the plan's architecture whose instances cost least. The
bill of a period of h hours with r invocations of managed functions:

    instances x h x hourly price x (1 + management fee) + r x request price

Not every price under that bill was read on AWS's own pages (the calibration's `source_kind`
says which were transcribed elsewhere or derived): `ManagedPrices.sources_note` names them in
the bill's notes.

Approximations: the instances' own share for the Lambda agent and the OS is not subtracted
from their vCPUs and memory (AWS publishes none); instances run the whole period (a fixed
environment count needs no scaling); first-fit decreasing may use more instances than the
optimal packing (at most 11/9 of it plus one), never fewer.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ground.managed import MB_PER_GIB, environment_memory_mb, environment_vcpus
from planner.calibration import Calibration, load_calibration

__all__ = ["InstanceChoice", "ManagedPrices", "managed_prices", "pack"]


@dataclass(frozen=True)
class InstanceChoice:
    """The capacity provider's instance type and how many instances it runs."""

    instance_type: str
    instances: int
    hourly_usd: float  # one instance, before the management fee


@dataclass(frozen=True)
class ManagedPrices:
    """LMI's prices and the instance types of one architecture (calibration file)."""

    request_usd: float
    fee_fraction: float
    default_instances: int
    mb_per_vcpu: float
    types: tuple[tuple[str, int, float, float], ...]  # (name, vCPUs, GiB, USD per hour)
    # The kind of source of each price (`planner.calibration.SourceKind`): "request_usd",
    # "management_fee_fraction" and each instance type's name; None where it is not recorded.
    # Empty: not known (prices built by hand), and no note is made.
    source_kinds: tuple[tuple[str, str | None], ...] = ()

    def sizes(self, memory_mb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(vCPUs, GiB) of one environment of each function planned at `memory_mb`."""
        vcpus = np.array([environment_vcpus(float(m), self.mb_per_vcpu) for m in memory_mb])
        mb = np.array([environment_memory_mb(float(m), self.mb_per_vcpu) for m in memory_mb])
        return vcpus.astype(np.int64), mb / MB_PER_GIB

    def choose(self, memory_mb: np.ndarray, environments: np.ndarray) -> InstanceChoice | None:
        """The cheapest instance type and count for `environments[f]` environments of each
        function planned at `memory_mb[f]` (None: no instance type holds the largest one)."""
        vcpus, gib = self.sizes(memory_mb)
        best: InstanceChoice | None = None
        for name, cap_vcpus, cap_gib, hourly in self.types:
            count = pack(vcpus, gib, environments, cap_vcpus, cap_gib)
            if count is None:
                continue
            choice = InstanceChoice(name, max(self.default_instances, count), hourly)
            if best is None or choice.instances * hourly < best.instances * best.hourly_usd:
                best = choice
        return best

    def sources_note(self, instance_type: str) -> str | None:
        """The note a bill on `instance_type` carries: which of the prices it used were not
        read on AWS's own pages, and how they were had (None: all were, or none is known)."""
        kinds = dict(self.source_kinds)
        hourly = {name: usd for name, _, _, usd in self.types}
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
    vcpus: np.ndarray, gib: np.ndarray, counts: np.ndarray, cap_vcpus: float, cap_gib: float
) -> int | None:
    """Instances that `counts[f]` environments of (`vcpus[f]`, `gib[f]`) fill, first-fit
    decreasing by vCPUs (None: an environment larger than an instance)."""
    used = counts > 0
    if not used.any():
        return 0
    if (vcpus[used] > cap_vcpus).any() or (gib[used] > cap_gib + 1e-9).any():
        return None
    order = np.argsort(-vcpus, kind="stable")
    free_v = np.zeros(0)
    free_g = np.zeros(0)
    for f in order:
        for _ in range(int(counts[f])):
            fits = np.flatnonzero((free_v >= vcpus[f]) & (free_g >= gib[f] - 1e-9))
            if fits.size:
                free_v[fits[0]] -= vcpus[f]
                free_g[fits[0]] -= gib[f]
            else:
                free_v = np.append(free_v, cap_vcpus - vcpus[f])
                free_g = np.append(free_g, cap_gib - gib[f])
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


def _kind(calibration: Calibration, name: str, key: str) -> str | None:
    """The kind of source of `key` of parameter `name`: from the calibration's provenance, or,
    for a plan's calibration (which records none), from the packaged file's where it holds the
    same value; None where neither says."""
    if name in calibration.provenance:
        return calibration.source_kind(name, key)
    packaged = _packaged()
    if getattr(packaged, name) == getattr(calibration, name) and name in packaged.provenance:
        return packaged.source_kind(name, key)
    return None


def managed_prices(calibration: Calibration, arch: str) -> ManagedPrices | None:
    """LMI's prices and the instance types of `arch` (None: the calibration lacks either),
    with the kind of source of each price."""
    lmi = calibration.managed_instances_prices
    types = {
        name: t for name, t in (calibration.ec2_instance_prices or {}).items() if t.arch == arch
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
            (name, t.vcpus, t.memory_gib, t.hourly_usd) for name, t in sorted(types.items())
        ),
        source_kinds=tuple(kinds),
    )
