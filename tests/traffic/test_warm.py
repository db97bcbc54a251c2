"""Warmer pings and provisioned INIT load the function's own weights, and nothing else runs:
what the simulator assumes of a warmed or provisioned environment."""

from __future__ import annotations

from typing import Any

import pytest

import functions.expert
import functions.head
import functions.layer
import functions.tail
from functions import config, warm

ENV = {
    "MOELAMBDA_BUCKET": "b",
    "MOELAMBDA_WEIGHTS_PREFIX": "w/",
    "MOELAMBDA_LAYER": "3",
    "MOELAMBDA_EXPERT": "1",
    "MOELAMBDA_HOSTS": "1,5",
}


@pytest.fixture()
def loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(warm, "s3_client", lambda: "s3")
    for role in ("head", "layer", "expert", "tail"):
        monkeypatch.setattr(
            warm.weights, role, lambda *args, _r=role: calls.append((_r, *args[1:]))
        )
    return calls


@pytest.mark.parametrize(
    ("module", "want"),
    [
        (functions.head, [("head", "b", "w/")]),
        (functions.layer, [("layer", "b", "w/", 3)]),
        (functions.expert, [("expert", "b", "w/", 3, 1), ("expert", "b", "w/", 3, 5)]),
        (functions.tail, [("tail", "b", "w/")]),
    ],
)
def test_a_ping_loads_the_functions_own_weights(module, want, loads) -> None:  # type: ignore[no-untyped-def]
    with config.local(ENV):
        assert module.handler({"warmer": True}, None) == {"warm": True}
    assert loads == want


def test_only_an_exact_ping_is_a_ping() -> None:
    assert warm.is_ping({"warmer": True})
    assert not warm.is_ping({"warmer": True, "request_id": "x"})
    assert not warm.is_ping({"warmer": "yes"}) and not warm.is_ping(None)


def test_provisioned_init_preloads(loads, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    with config.local(ENV):
        warm.preload_if_provisioned("tail")
        assert loads == []
        monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "provisioned-concurrency")
        warm.preload_if_provisioned("tail")
    assert loads == [("tail", "b", "w/")]
