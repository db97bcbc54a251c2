"""Lambda Managed Instances: the packing, the instance choice, the bill by hand, and the
throttling a managed function shares with reserved concurrency."""

from __future__ import annotations

import numpy as np
import pytest

from ground.managed import environment_memory_mb, environment_vcpus
from planner import load_calibration
from planner.traffic import BatchPolicy, Capacity, simulate, workflow_model
from planner.traffic.managed import (
    InstanceChoice,
    InstanceType,
    ManagedPrices,
    managed_prices,
    pack,
)
from tests.traffic.plans import tiny_plan
from tests.traffic.test_simulate import RATE, _platform, _stream


def _prices(*types: tuple[str, int, float, float], default: int = 3) -> ManagedPrices:
    return ManagedPrices(
        request_usd=2e-7, fee_fraction=0.15, default_instances=default, mb_per_vcpu=1769.0,
        types=tuple(InstanceType(*t) for t in types),
    )  # fmt: skip


def test_an_environment_gets_whole_vcpus_at_two_gib_each() -> None:
    assert environment_vcpus(768, 1769) == 1 and environment_memory_mb(768, 1769) == 2048
    assert environment_vcpus(1769, 1769) == 1
    assert environment_vcpus(1770, 1769) == 2 and environment_memory_mb(3008, 1769) == 4096
    assert environment_memory_mb(10240, 1769) == 6 * 2048  # always above the planned memory


def test_first_fit_decreasing_by_hand() -> None:
    # vCPUs 3, 2, 2, 2, 1, 1 on 4-vCPU instances: [3, 1], [2, 2], [2, 1] -> 3 instances.
    vcpus, counts = np.array([1, 2, 3]), np.array([2, 3, 1])
    assert pack(vcpus, 2.0 * vcpus, counts, 4, 8.0) == 3
    # Memory binds: 1 vCPU but 6 GiB each, on (4 vCPUs, 8 GiB): one per instance.
    assert pack(np.array([1]), np.array([6.0]), np.array([3]), 4, 8.0) == 3
    assert pack(np.array([5]), np.array([10.0]), np.array([1]), 4, 8.0) is None  # too large
    assert pack(vcpus, 2.0 * vcpus, np.zeros(3, dtype=int), 4, 8.0) == 0


@pytest.mark.parametrize("seed", range(5))
def test_packing_is_between_the_bound_and_one_per_environment(seed: int) -> None:
    rng = np.random.default_rng(seed)
    vcpus = rng.integers(1, 5, size=6)
    counts = rng.integers(0, 5, size=6)
    got = pack(vcpus, 2.0 * vcpus, counts, 8, 16.0)
    assert got is not None
    assert -(-int((vcpus * counts).sum()) // 8) <= got <= int(counts.sum())


def test_the_cheapest_instance_type_wins_and_three_is_the_floor() -> None:
    prices = _prices(("big", 8, 16.0, 0.40), ("small", 4, 8.0, 0.17))
    memory = np.array([1769.0, 3000.0])
    # 2 x 1 + 3 x 2 = 8 vCPUs: big needs 1 instance (3 by default), small 2 (3): small wins.
    assert prices.choose(memory, np.array([2, 3])) == InstanceChoice("small", 3, 0.17)
    # 40 vCPUs: big 5 x 0.40 = 2.00, small 10 x 0.17 = 1.70.
    assert prices.choose(memory, np.array([10, 15])) == InstanceChoice("small", 10, 0.17)
    cheap_big = _prices(("big", 8, 16.0, 0.30), ("small", 4, 8.0, 0.17))
    assert cheap_big.choose(memory, np.array([10, 15])) == InstanceChoice("big", 5, 0.30)
    assert prices.choose(np.array([20000.0]), np.array([1])) is None  # 12 vCPUs fit neither


def test_the_calibration_prices_each_architecture_apart() -> None:
    cal = load_calibration()
    x86, arm = managed_prices(cal, "x86_64"), managed_prices(cal, "arm64")
    assert x86 is not None and arm is not None
    assert {t[0] for t in x86.types} == {"m7i.xlarge", "m7i.2xlarge"}
    assert {t[0] for t in arm.types} == {"m7g.xlarge", "m7g.2xlarge"}
    assert x86.fee_fraction == 0.15 and x86.default_instances == 3
    assert managed_prices(cal.model_copy(update={"ec2_instance_prices": None}), "arm64") is None


@pytest.fixture(scope="module", params=["s3", "direct"])
def model(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    return workflow_model(tiny_plan(method=request.param), 4096)


def test_the_managed_bill_by_hand(model) -> None:  # type: ignore[no-untyped-def]
    # 20 requests of 300 tokens 100 s apart over 2,000 s, every function managed with as many
    # environments as the batch invokes: no cold start, no INIT, the warm latency, and the
    # instances (3, the floor) x hours x price x 1.15 + requests, instead of Lambda's duration
    # and requests for those invocations.
    fns = model.functions
    reps = model.replicas[300]
    k = np.maximum(reps, 1)
    prices = _prices(("m", 64, 128.0, 0.50))
    platform = _platform(fns.count, managed=prices)
    capacity = [Capacity("managed", environments=int(n)) for n in k]
    stream = _stream(np.arange(20) * 100.0, 300, 2000.0)
    base = simulate(model, stream, BatchPolicy(4096, 0.0), _platform(fns.count, idle_s=1e9))
    result = simulate(model, stream, BatchPolicy(4096, 0.0), platform, capacity)
    warm = float(model.at(model.latency_s, np.array([300]))[0])
    np.testing.assert_allclose(result.latency_s, warm)
    assert sum(result.cold_starts.values()) == 0 and result.bill_usd["init_usd"] == 0
    assert result.managed["instance_type"] == "m" and result.managed["instances"] == 3
    gb = fns.memory_mb / 1024
    seconds = model.at(model.duration_s, np.array([300]))[0] * reps
    instances = 3 * (2000.0 / 3600.0) * 0.50 * 1.15
    requests = 20 * int(reps.sum()) * 2e-7
    lambda_usd = 20 * (seconds * gb).sum() * RATE + 20 * int(reps.sum()) * 2e-7
    want = instances + requests - lambda_usd
    assert result.bill_usd["managed_instances_usd"] == pytest.approx(want, rel=1e-9)
    # Everything else is the warm deployment's bill: the cost model's items are unchanged.
    for item in ("experts_usd", "nonmoe_usd", "requests_usd", "s3_usd", "workflow_usd"):
        assert result.bill_usd[item] == pytest.approx(base.bill_usd[item], rel=1e-12)
    items = {n: v for n, v in result.bill_usd.items() if n.endswith("_usd")}
    total = sum(items.values()) - items["total_usd"] - items["per_million_tokens_usd"]
    assert result.bill_usd["total_usd"] == pytest.approx(total, rel=1e-12)


def test_a_managed_function_throttles_as_reserved_concurrency_does(model) -> None:  # type: ignore[no-untyped-def]
    # A burst of batches on one environment per function: the managed run equals one
    # provisioned environment under a reservation of one, throttled retries and all.
    fns = model.functions
    stream = _stream(np.repeat(np.arange(5) * 0.5, 3), 300, 60.0)
    policy = BatchPolicy(300, 0.0, front_door=False)
    managed = simulate(
        model, stream, policy, _platform(fns.count, managed=_prices(("m", 64, 128.0, 0.5))),
        [Capacity("managed", environments=1)] * fns.count, reserve=False,
    )  # fmt: skip
    reserved = simulate(
        model, stream, policy, _platform(fns.count),
        [Capacity("provisioned", 1, reserved=1)] * fns.count,
    )  # fmt: skip
    np.testing.assert_array_equal(managed.latency_s, reserved.latency_s)
    assert managed.failed_batches == reserved.failed_batches
    assert managed.over_reserved == reserved.over_reserved and managed.over_reserved
    warm = float(model.at(model.latency_s, np.array([300]))[0])
    assert managed.latency_s.max() > warm + 0.4  # some waited a retry


def test_managed_capacity_without_prices_or_room_is_refused(model) -> None:  # type: ignore[no-untyped-def]
    fns = model.functions
    stream = _stream([0.0], 300, 60.0)
    capacity = [Capacity("managed", environments=1)] * fns.count
    with pytest.raises(ValueError, match="prices"):
        simulate(model, stream, BatchPolicy(300, 0.0), _platform(fns.count), capacity)
    tiny = _platform(fns.count, managed=_prices(("t", 1, 1.0, 0.01)))
    with pytest.raises(ValueError, match="larger than every instance type"):
        simulate(model, stream, BatchPolicy(300, 0.0), tiny, capacity)
    with pytest.raises(ValueError, match="at least one environment"):
        Capacity("managed")


def test_a_managed_bill_names_the_prices_not_read_on_aws_own_pages(model) -> None:  # type: ignore[no-untyped-def]
    # The packaged calibration: the fee and the request charge from a transcription of AWS's
    # page, the xlarge prices from a blog, the 2xlarge ones derived (twice the xlarge).
    cal = load_calibration()
    arm = managed_prices(cal, "arm64")
    assert arm is not None
    kinds = dict(arm.source_kinds)
    assert kinds["request_usd"] == kinds["management_fee_fraction"] == "secondary"
    assert kinds["m7g.xlarge"] == "secondary" and kinds["m7g.2xlarge"] == "derived"
    note = arm.sources_note("m7g.2xlarge")
    assert note is not None and note.startswith("Lambda Managed Instances prices not read on")
    assert "the request charge (0.20 USD per million)" in note
    assert "the 15% management fee" in note and "secondary source" in note
    assert "m7g.2xlarge's 0.3264 USD per hour (derived, not read)" in note
    assert "https://aws.amazon.com/lambda/pricing/" in note
    # The simulated bill carries it in its notes, which `traffic` and `plan --traffic` print.
    fns = model.functions
    stream = _stream(np.arange(5) * 100.0, 300, 600.0)
    platform = _platform(fns.count, managed=managed_prices(cal, "x86_64"))
    capacity = [Capacity("managed", environments=1)] * fns.count
    result = simulate(model, stream, BatchPolicy(4096, 0.0), platform, capacity)
    chosen = result.managed["instance_type"]
    assert chosen.startswith("m7i.")
    (managed_note,) = [n for n in result.notes if "Lambda Managed Instances" in n]
    assert chosen in managed_note and "secondary source" in managed_note
    assert result.summary(None)["notes"] == result.notes
    # Without managed capacity, no such note.
    plain = simulate(model, stream, BatchPolicy(4096, 0.0), platform)
    assert not any("Lambda Managed Instances" in n for n in plain.notes)


def test_the_note_follows_the_calibration_and_a_plans_calibration() -> None:
    cal = load_calibration()
    # Every price confirmed on AWS's pages: nothing to say.
    confirmed = {
        name: entry.model_copy(update={"source_kind": "aws"})
        for name, entry in cal.provenance.items()
    }
    prices = managed_prices(cal.model_copy(update={"provenance": confirmed}), "arm64")
    assert prices is not None and prices.sources_note("m7g.xlarge") is None
    # A plan's calibration carries no provenance: the packaged file's kinds apply to the same
    # prices, and a changed price is flagged as not recorded.
    bare = cal.model_copy(update={"provenance": {}})
    same = managed_prices(bare, "arm64")
    assert same is not None and same.source_kinds == managed_prices(cal, "arm64").source_kinds  # type: ignore[union-attr]
    lmi = cal.managed_instances_prices
    assert lmi is not None
    changed = bare.model_copy(
        update={
            "managed_instances_prices": lmi.model_copy(update={"management_fee_fraction": 0.2})
        }
    )
    note = managed_prices(changed, "arm64").sources_note("m7g.xlarge")  # type: ignore[union-attr]
    assert note is not None and "the 20% management fee" in note
    assert "its source not recorded in this calibration" in note
    # Prices built by hand carry no kinds: no note.
    assert _prices(("m", 64, 128.0, 0.5)).sources_note("m") is None


def test_filling_a_plans_calibration_keeps_the_filled_entries_provenance() -> None:
    from planner.traffic.platform import MANAGED_FIELDS, traffic_calibration
    from tests.traffic.plans import tiny_plan as plan_of

    cal = load_calibration()
    plan = plan_of(method="s3")
    own = dict(plan.calibration)
    for name in MANAGED_FIELDS:
        own.pop(name, None)
    filled, where = traffic_calibration(plan.model_copy(update={"calibration": own}), cal)
    assert where != "plan"
    for name in MANAGED_FIELDS:
        assert filled.provenance[name] == cal.provenance[name]


def test_plan_traffic_prints_the_bills_notes() -> None:
    from rich.console import Console

    from moelambda.cli import _render_traffic

    summary = {
        "traffic": {"requests": 10, "rate_per_s": 0.1}, "slo_p99_s": 10.0,
        "max_batch_tokens": 4096, "max_wait_s": 0.0, "capacity": "managed",
        "latency_s": {"p99": 1.0}, "bill_usd": {"total_usd": 1.0, "per_million_tokens_usd": 2.0},
        "candidates": 3, "seconds": 1.0, "plan": "plan.json",
        "notes": ["Lambda Managed Instances prices not read on AWS's own pages: x"],
    }  # fmt: skip
    console = Console(record=True, width=300)
    _render_traffic.plan_traffic(console, summary)
    assert "note: Lambda Managed Instances prices not read on AWS's own pages: x." in (
        console.export_text()
    )
