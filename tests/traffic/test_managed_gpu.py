"""Lambda Managed Instances with GPUs: packing GPU-backed environments (one whole GPU each)
against an exhaustive search, the split of CPU and GPU pools, and the bill."""

from __future__ import annotations

import numpy as np
import pytest

from planner import load_calibration
from planner.traffic.managed import (
    InstanceChoice,
    InstanceType,
    ManagedPrices,
    managed_prices,
    pack,
)

L4 = 24.0  # GiB of one GPU of the g6 types
CHEAP_CPU = InstanceType("cpu", 64, 256.0, 0.01)
L4_X1 = InstanceType("gpu1", 4, 16.0, 0.80, 1, L4, "l4")
L4_X4 = InstanceType("gpu4", 48, 192.0, 4.60, 4, L4, "l4")


def _prices(*types: InstanceType, sizes: tuple[int, ...] = ()) -> ManagedPrices:
    return ManagedPrices(
        request_usd=2e-7, fee_fraction=0.15, default_instances=3, mb_per_vcpu=1769.0,
        types=types, accelerator_sizes_gib=sizes,
    )  # fmt: skip


def _fits_gpus(accs: list[float], gpus: int, gpu_gib: float) -> bool:
    """Whether the accelerators fit `gpus` GPUs of `gpu_gib`, one whole GPU each."""
    return len(accs) <= gpus and all(a <= gpu_gib + 1e-9 for a in accs)


def _optimum(
    items: list[tuple[int, float, float]], caps: tuple[int, float, int, float]
) -> int | None:
    """The fewest instances that hold every (vCPUs, GiB, GPU GiB) item, by trying every
    partition of the items (None: some item fits no instance)."""
    cap_v, cap_g, gpus, gpu_gib = caps

    def fits(group: list[tuple[int, float, float]]) -> bool:
        accs = [a for _, _, a in group if a > 0]
        return (
            sum(v for v, _, _ in group) <= cap_v
            and sum(g for _, g, _ in group) <= cap_g + 1e-9
            and (not accs or (gpus > 0 and _fits_gpus(accs, gpus, gpu_gib)))
        )

    best: int | None = None

    def place(i: int, groups: list[list[tuple[int, float, float]]]) -> None:
        nonlocal best
        if best is not None and len(groups) >= best:
            return
        if i == len(items):
            best = len(groups)
            return
        for group in groups:
            group.append(items[i])
            if fits(group):
                place(i + 1, groups)
            group.pop()
        if fits([items[i]]):
            place(i + 1, [*groups, [items[i]]])

    place(0, [])
    return best if items else 0


@pytest.mark.parametrize("seed", range(80))
def test_first_fit_decreasing_is_feasible_and_near_the_exhaustive_optimum(seed: int) -> None:
    rng = np.random.default_rng(seed)
    functions = 3
    vcpus = rng.integers(1, 4, size=functions)
    gib = 2.0 * vcpus
    acc = rng.choice([0, 3, 6, 12, 16, 24, 48], size=functions).astype(float)
    counts = rng.integers(0, 3, size=functions)
    caps = (int(rng.choice([4, 8])), float(rng.choice([16.0, 32.0])), int(rng.integers(1, 3)), L4)
    got = pack(vcpus, gib, counts, caps[0], caps[1], acc, caps[2], caps[3])
    items = [(int(vcpus[f]), float(gib[f]), float(acc[f])) for f in range(functions)]
    best = _optimum([items[f] for f in range(functions) for _ in range(counts[f])], caps)
    if best is None:
        assert got is None
    else:
        assert got is not None and best <= got <= best + 1


def test_each_environment_holds_a_whole_gpu() -> None:
    one = np.array([1])
    two_gib = np.array([2.0])
    # Eight 3-GiB environments on 4-GPU instances: one GPU each, two instances.
    assert pack(one, two_gib, np.array([8]), 48, 192.0, np.array([3.0]), 4, L4) == 2
    # Two 6-GiB ones on 1-GPU instances: one instance each, though 12 GiB would fit one L4.
    assert pack(one, two_gib, np.array([2]), 4, 16.0, np.array([6.0]), 1, L4) == 2
    # 48 GiB on four 24-GiB GPUs: an environment cannot span GPUs.
    assert pack(one, two_gib, np.array([1]), 48, 192.0, np.array([48.0]), 4, L4) is None
    # A CPU instance holds no accelerator; an environment without one needs no GPU and shares
    # an instance with a GPU-backed one.
    assert pack(one, two_gib, np.array([1]), 64, 256.0, np.array([3.0])) is None
    assert pack(one, two_gib, np.array([3]), 4, 16.0, np.array([0.0]), 1, L4) == 1
    mixed = pack(
        np.array([1, 1]), np.full(2, 2.0), np.array([1, 2]), 4, 16.0, np.array([24.0, 0.0]), 1, L4
    )
    assert mixed == 1
    # vCPUs still bind: two 3-vCPU GPU environments on 4-vCPU, 4-GPU instances.
    three = np.array([3])
    assert pack(three, 2.0 * three, np.array([2]), 4, 64.0, np.array([3.0]), 4, L4) == 2


def test_a_gpu_pool_never_chooses_a_cpu_type_nor_a_cpu_pool_a_gpu_type() -> None:
    prices = _prices(CHEAP_CPU, L4_X1, L4_X4)
    memory = np.array([1769.0, 3538.0])
    environments = np.array([4, 2])
    # Without accelerators the cheap CPU type wins; with any, only GPU types can hold them.
    assert prices.choose(memory, environments) == InstanceChoice("cpu", 3, 0.01)
    gpu = prices.choose(memory, environments, np.array([12, 0]))
    assert gpu is not None and gpu.instance_type in {"gpu1", "gpu4"}
    # 4 x 12 GiB, a GPU each: four 1-GPU instances (3.20 USD/h), the two 2-vCPU environments
    # beside them; one 4-GPU instance holds all, 3 by default (13.80 USD/h): the 1-GPU type.
    assert gpu == InstanceChoice("gpu1", 4, 0.80)
    # Larger than any GPU: no type holds it.
    assert prices.choose(memory, environments, np.array([48, 0])) is None
    # The calibration's pools: CPU types for a CPU pool, GPU types for a GPU pool.
    cal = load_calibration()
    cpu_pool = managed_prices(cal, "x86_64")
    gpu_pool = managed_prices(cal, "x86_64", accelerated=True)
    assert cpu_pool is not None and gpu_pool is not None
    assert all(t.gpus == 0 for t in cpu_pool.types) and not cpu_pool.gpu_types
    assert gpu_pool.types == gpu_pool.gpu_types and len(gpu_pool.types) >= 7
    assert {t.name for t in cpu_pool.types}.isdisjoint(t.name for t in gpu_pool.types)
    assert managed_prices(cal, "arm64", accelerated=True) is None  # accelerators are x86_64
    chosen = cpu_pool.choose(memory, environments)
    assert chosen is not None and chosen.instance_type.startswith("m7i.")


def test_the_calibrations_gpu_pool_carries_each_types_gpus() -> None:
    pool = managed_prices(load_calibration(), "x86_64", accelerated=True)
    assert pool is not None
    types = {t.name: t for t in pool.types}
    assert types["g6.xlarge"] == InstanceType("g6.xlarge", 4, 16, 0.8048, 1, 24, "l4")
    assert types["g6.12xlarge"][4:] == (4, 24, "l4")
    assert types["g6e.xlarge"][4:] == (1, 48, "l40s")
    assert types["g5.xlarge"][4:] == (1, 24, "a10g")
    assert pool.accelerator_sizes_gib == (3, 6, 12, 16, 24, 48)
    # A 48-GiB environment fits only an L40S.
    choice = pool.choose(np.array([1769.0]), np.array([1]), np.array([48]))
    assert choice is not None and choice.instance_type.startswith("g6e.")
    # One 24-GiB environment: three g6.xlarge by default, the cheapest GPU instance.
    assert pool.choose(np.array([1769.0]), np.array([1]), np.array([24])) == InstanceChoice(
        "g6.xlarge", 3, 0.8048
    )
    with pytest.raises(ValueError, match="AcceleratorMemorySize"):
        pool.choose(np.array([1769.0]), np.array([1]), np.array([20]))


def test_a_gpu_pools_bill_is_the_same_formula_and_names_its_weak_prices() -> None:
    pool = managed_prices(load_calibration(), "x86_64", accelerated=True)
    assert pool is not None
    choice = InstanceChoice("g6.xlarge", 5, 0.8048)
    bill = pool.bill_usd(choice, period_s=7200.0, invocations=1000)
    assert bill == pytest.approx(5 * 2.0 * 0.8048 * 1.15 + 1000 * 2e-7)
    note = pool.sources_note("g6.xlarge")
    assert note is not None and "g6.xlarge's 0.8048 USD per hour" in note
    assert "secondary source" in note
    assert dict(pool.source_kinds)["g6e.2xlarge"] == "secondary"


def test_a_plan_made_before_the_gpu_types_keeps_its_prices_kinds() -> None:
    # A plan's calibration records no provenance; one made before the file priced GPU types
    # holds only the CPU types, whose kinds still come from the packaged file.
    cal = load_calibration()
    assert cal.ec2_instance_prices is not None
    cpu_only = {n: t for n, t in cal.ec2_instance_prices.items() if not t.gpus}
    old = cal.model_copy(update={"provenance": {}, "ec2_instance_prices": cpu_only})
    before = managed_prices(old, "arm64")
    now = managed_prices(cal, "arm64")
    assert before is not None and now is not None
    assert before.source_kinds == now.source_kinds
    assert managed_prices(old, "x86_64", accelerated=True) is None
