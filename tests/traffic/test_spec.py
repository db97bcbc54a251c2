"""Traffic specs: the shipped trace as it is, scaling, repetition, synthetic streams, errors."""

from __future__ import annotations

import csv
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from ground.errors import UsageError
from planner.traffic import load_arrivals

TRACE = Path(str(resources.files("planner.traffic") / "data" / "AzureLLMInferenceTrace_conv.csv"))


def test_shipped_trace_is_read_as_it_is() -> None:
    with TRACE.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    arrivals = load_arrivals("azure-conv")
    assert arrivals.requests == len(rows) == 19366
    assert arrivals.tokens.tolist() == [int(r["ContextTokens"]) for r in rows]
    assert arrivals.times_s[0] == 0.0 and (np.diff(arrivals.times_s) >= 0).all()
    # 18:15:46.6805900 to 18:15:50.9951690 is 4.314579 s
    assert arrivals.times_s[1] == pytest.approx(4.314579, abs=1e-6)
    assert (TRACE.parent / "LICENSE-CC-BY-4.0.txt").is_file()
    assert "CC-BY 4.0" in (TRACE.parent / "SOURCES.md").read_text()


def test_scale_stretches_the_same_pattern() -> None:
    native = load_arrivals("azure-conv")
    sparse = load_arrivals("azure-conv", scale=0.01)
    np.testing.assert_allclose(sparse.times_s, native.times_s * 100)
    assert sparse.tokens.tolist() == native.tokens.tolist()
    assert sparse.period_s == pytest.approx(native.period_s * 100)


def test_hours_cut_and_repeat() -> None:
    native = load_arrivals("azure-conv")
    half = load_arrivals("azure-conv", hours=0.5)
    assert half.requests == int((native.times_s < 1800).sum()) and half.period_s == 1800
    span = float(native.times_s[-1])
    cycle = span + span / (native.requests - 1)
    twice = load_arrivals("azure-conv", hours=2 * cycle / 3600)
    assert twice.requests == 2 * native.requests
    cut = load_arrivals("azure-conv", hours=(cycle + span) / 3600)
    assert cut.requests == 2 * native.requests - 1  # the period ends at copy 2's last arrival
    np.testing.assert_allclose(twice.times_s[native.requests], cycle)
    assert twice.tokens[native.requests :].tolist() == native.tokens.tolist()


def test_window_takes_a_later_period() -> None:
    day2 = load_arrivals("azure-conv", scale=0.003, hours=48).window(86400, 172800)
    whole = load_arrivals("azure-conv", scale=0.003, hours=48)
    late = whole.times_s >= 86400
    assert day2.requests == int(late.sum()) and day2.period_s == 86400
    np.testing.assert_allclose(day2.times_s, whole.times_s[late] - 86400)
    with pytest.raises(UsageError):
        whole.window(0, 10**7)


def test_poisson_is_seeded_and_at_its_rate() -> None:
    a = load_arrivals("poisson:5", hours=1, seed=1)
    b = load_arrivals("poisson:5", hours=1, seed=1)
    c = load_arrivals("poisson:5", hours=1, seed=2)
    assert a.times_s.tolist() == b.times_s.tolist() and a.tokens.tolist() == b.tokens.tolist()
    assert a.times_s.tolist() != c.times_s.tolist()
    assert a.requests == pytest.approx(18000, rel=0.03)
    assert load_arrivals("poisson:5", hours=1, seed=1, scale=0.1).requests == pytest.approx(
        1800, rel=0.1
    )
    assert set(np.unique(a.tokens)) <= set(np.unique(load_arrivals("azure-conv").tokens))


def test_diurnal_follows_the_day() -> None:
    day = load_arrivals("diurnal:4,0.5", seed=0)
    hours = day.times_s / 3600
    noon = ((hours >= 11) & (hours < 13)).sum() / 7200
    night = ((hours < 1) | (hours >= 23)).sum() / 7200
    assert noon == pytest.approx(4 * 0.5 * (1 - np.cos(2 * np.pi * 11.5 / 24)) * 0.875 + 0.5,
                                 rel=0.1)  # fmt: skip
    assert night == pytest.approx(0.5, rel=0.15)
    assert day.period_s == 86400


def test_own_csv_formats(tmp_path: Path) -> None:
    numeric = tmp_path / "numeric.csv"
    numeric.write_text("time_s,tokens\n5.0,10\n1.0,20\n")
    got = load_arrivals(str(numeric))
    assert got.times_s.tolist() == [0.0, 4.0] and got.tokens.tolist() == [20, 10]
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-01-01 00:00:00.5,3,1\n"
        "2024-01-01 00:00:02.0,4,1\n"
    )
    assert load_arrivals(str(azure)).times_s.tolist() == [0.0, 1.5]


@pytest.mark.parametrize(
    "spec, kwargs, says",
    [
        ("nope:3", {}, "neither a file nor a spec"),
        ("poisson:-1", {}, "not a positive number"),
        ("diurnal:1", {}, "a peak and a trough"),
        ("diurnal:1,5", {}, "trough exceeds the peak"),
        ("azure-conv", {"scale": 0}, "--scale"),
        ("azure-conv", {"hours": -1}, "--hours"),
    ],
)
def test_bad_specs_say_how_to_fix_them(spec: str, kwargs: dict, says: str) -> None:
    with pytest.raises(UsageError, match=says) as info:
        load_arrivals(spec, **kwargs)
    assert info.value.fix


def test_bad_files(tmp_path: Path) -> None:
    missing = tmp_path / "cols.csv"
    missing.write_text("when,how_many\n1,2\n")
    with pytest.raises(UsageError, match="no timestamp column"):
        load_arrivals(str(missing))
    bad = tmp_path / "bad.csv"
    bad.write_text("time_s,tokens\n1.0,ten\n")
    with pytest.raises(UsageError, match="does not parse"):
        load_arrivals(str(bad))
    empty = tmp_path / "empty.csv"
    empty.write_text("time_s,tokens\n")
    with pytest.raises(UsageError, match="no requests"):
        load_arrivals(str(empty))


SHARED = Path("/work/shared/data/azure-llm-2023/AzureLLMInferenceTrace_conv.csv")


@pytest.mark.skipif(not SHARED.is_file(), reason="the shared data directory is not mounted")
def test_the_trace_as_a_file_equals_the_shipped_copy() -> None:
    as_file = load_arrivals(str(SHARED), scale=0.5, hours=3)
    shipped = load_arrivals("azure-conv", scale=0.5, hours=3)
    np.testing.assert_array_equal(as_file.times_s, shipped.times_s)
    np.testing.assert_array_equal(as_file.tokens, shipped.tokens)


def test_scale_then_hours_takes_the_first_hours_of_the_stretched_trace() -> None:
    native = load_arrivals("azure-conv")
    day = load_arrivals("azure-conv", scale=0.01, hours=24)
    assert day.period_s == 86400
    assert day.requests == int((native.times_s * 100 < 86400).sum())
    assert day.describe()["rate_per_s"] == pytest.approx(day.requests / 86400)
    dense = load_arrivals("azure-conv", scale=4, hours=1)  # the 58-min trace 4x as dense
    cycle = native.period_s / 4  # one copy, repeated end to end to fill the hour
    assert dense.requests == pytest.approx(3600 / cycle * native.requests, rel=0.01)
