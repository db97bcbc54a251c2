"""The GPU catalogue and cluster files: every number has a source, bad files say what to fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu.cluster import ClusterError, load_catalogue, load_cluster
from ground.errors import UsageError


def test_catalogue_types_have_sources_and_sane_numbers() -> None:
    catalogue = load_catalogue()
    assert catalogue.default_type in catalogue.types
    assert 0 < catalogue.mfu <= 1 and 0 < catalogue.max_utilisation <= 1
    for kind in catalogue.types.values():
        assert kind.source and kind.as_of
        assert kind.bandwidth == pytest.approx(kind.network_gbps * 1.25e8)
        assert kind.flops(0.5) == pytest.approx(kind.peak_tflops * 0.5e12)


def test_default_cluster_and_a_mixed_file(tmp_path: Path) -> None:
    catalogue = load_catalogue()
    _, types = load_cluster(None, 3, catalogue)
    assert types == [catalogue.default_type] * 3
    path = tmp_path / "cluster.json"
    own = catalogue.types["t4"].model_dump() | {"gpu": "mine", "usd_per_gpu_hour": 0.1}
    path.write_text(
        json.dumps(
            {
                "gpus": [{"type": "a100", "count": 2}, {"type": "mine", "count": 2}],
                "types": {"mine": own},
            }
        )
    )
    merged, types = load_cluster(path, 3, catalogue)
    assert types == ["a100", "a100", "mine"]
    assert merged.get("mine").usd_per_gpu_hour == 0.1


@pytest.mark.parametrize(
    ("content", "gpus", "message"),
    [
        ({"gpus": [{"type": "t4", "count": 2}]}, 3, "holds 2 GPUs"),
        ({"gpus": [{"type": "a10", "count": 2}]}, 2, "Did you mean 'a10g'"),
        ({"gpus": []}, 1, "not a valid cluster file"),
        ({"gpu": [{"type": "t4", "count": 1}]}, 1, "not a valid cluster file"),
    ],
)
def test_bad_cluster_files_name_the_problem(
    tmp_path: Path, content: dict, gpus: int, message: str
) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ClusterError, match=message) as raised:
        load_cluster(path, gpus, load_catalogue())
    assert raised.value.fix


def test_zero_gpus_and_a_missing_file() -> None:
    with pytest.raises(UsageError, match="not positive"):
        load_cluster(None, 0, load_catalogue())
    with pytest.raises(ClusterError, match="cannot read"):
        load_cluster(Path("/nonexistent/cluster.json"), 1, load_catalogue())


def test_a_serverless_plan_as_cluster_file_is_named_in_two_lines(tmp_path: Path) -> None:
    """Issue 37: `gpu-plan --cluster out/plan.json` printed pydantic's 17 validation errors;
    it says what the file is and what --cluster takes instead."""
    path = tmp_path / "plan.json"
    path.write_text(
        json.dumps({"format_version": 2, "solver": "milp", "layers": [], "totals": {}})
    )
    with pytest.raises(ClusterError) as raised:
        load_cluster(path, 4, load_catalogue())
    problem, fix = raised.value.problem, raised.value.fix or ""
    assert "is a serverless plan (from `moelambda plan`), not a cluster file" in problem
    assert '--cluster takes a JSON file of GPU groups, e.g. {"gpus": [' in problem
    assert fix.startswith("pass it as --plan to `moelambda synth`") and "for --cluster" in fix
    assert "\n" not in problem + fix and "validation error" not in problem


def test_a_bad_cluster_file_names_its_first_error_only(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"gpu": [], "extra": 1, "more": 2}))
    with pytest.raises(ClusterError) as raised:
        load_cluster(path, 1, load_catalogue())
    assert raised.value.problem == f"'{path}' is not a valid cluster file (gpus: Field required)."
    path.write_text('{"gpus": [')
    with pytest.raises(ClusterError, match="not a valid cluster file \\(the document: Invalid"):
        load_cluster(path, 1, load_catalogue())


def _catalogue_file() -> dict:
    return json.loads((Path(__file__).parents[2] / "planner/data/gpu_catalogue.json").read_text())


def test_every_gpu_price_lives_in_the_calibration() -> None:
    # One home per price, with one source_kind: every catalogue type is priced on an instance
    # type of the calibration and carries no price of its own (the schema refuses one).
    from planner import load_calibration

    instances = load_calibration().ec2_instance_prices or {}
    for name, entry in _catalogue_file()["types"].items():
        assert "usd_per_gpu_hour" not in entry and "price_source_kind" not in entry, name
        assert instances[entry["price_from"]].gpu == name, name
        assert entry["instance"].split()[0] == entry["price_from"], name
    # the types priced only for the GPU-cluster backend are never a capacity provider's
    from planner.traffic.managed import managed_prices

    pool = managed_prices(load_calibration(), "x86_64", accelerated=True)
    assert pool is not None
    offered = {t.name for t in pool.types}
    assert offered.isdisjoint({"g4dn.xlarge", "p4d.24xlarge"})
    assert offered == {n for n, t in instances.items() if t.gpus and t.lambda_managed}


def test_prices_read_from_the_calibration_carry_its_source_kind() -> None:
    from planner import load_calibration

    calibration = load_calibration()
    instances = calibration.ec2_instance_prices or {}
    catalogue = load_catalogue(calibration)
    for name, entry in _catalogue_file()["types"].items():
        kind = catalogue.types[name]
        instance = instances[entry["price_from"]]
        assert kind.usd_per_gpu_hour == instance.hourly_usd / instance.gpus, name
        assert kind.price_source_kind == calibration.source_kind(
            "ec2_instance_prices", entry["price_from"]
        )
    assert catalogue.types["a100"].usd_per_gpu_hour == pytest.approx(32.7726 / 8)
    # No price was read on AWS's own rate card: the catalogue says so, as the calibration does.
    assert {k.price_source_kind for k in catalogue.types.values()} == {"secondary"}
    # A calibration with another price moves the catalogue's with it.
    cheaper = {
        **instances,
        "g6.xlarge": instances["g6.xlarge"].model_copy(update={"hourly_usd": 0.5}),
    }
    moved = load_catalogue(calibration.model_copy(update={"ec2_instance_prices": cheaper}))
    assert moved.types["l4"].usd_per_gpu_hour == 0.5


def test_a_calibration_without_the_priced_instance_type_is_named() -> None:
    from planner import load_calibration

    calibration = load_calibration()
    without = {
        n: t for n, t in (calibration.ec2_instance_prices or {}).items() if n != "g5.xlarge"
    }
    with pytest.raises(ClusterError, match=r"'a10g' from ec2_instance_prices\.g5\.xlarge") as err:
        load_catalogue(calibration.model_copy(update={"ec2_instance_prices": without}))
    assert "add g5.xlarge with gpu 'a10g'" in (err.value.fix or str(err.value))
