"""Aurora's contention-free all-to-all schedule: padding, BvN rounds, the bounds of both modes."""

from __future__ import annotations

import numpy as np
import pytest

from gpu.aurora import a2a
from gpu.aurora.a2a import Schedule, lower_bound, pad, schedule, verify

HETERO = np.array([100.0, 100.0, 80.0, 80.0, 50.0, 50.0, 40.0, 40.0]) * 1.25e8  # Gbps -> B/s


def _random_tokens(rng: np.random.Generator, n: int) -> np.ndarray:
    """Integer traffic, sparse as often as dense: zeros are what force padding and idle slots."""
    density = rng.uniform(0.2, 1.0)
    return (rng.integers(0, 50, (n, n)) * (rng.random((n, n)) < density)).astype(float)


def _cases(count: int, seed: int, max_n: int = 10) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_random_tokens(rng, int(rng.integers(2, max_n + 1))) for _ in range(count)]


def _assert_partial_permutation(plan: Schedule, n: int) -> None:
    for r in plan.rounds:
        busy = r.dest[r.dest >= 0]
        assert len(np.unique(busy)) == len(busy), "a receiver hears two senders in one round"
        assert not (r.dest == np.arange(n)).any(), "a sender sends to itself"
        assert (r.tokens[r.dest < 0] == 0).all()
        assert r.seconds > 0


def _sent(plan: Schedule, n: int) -> np.ndarray:
    total = np.zeros((n, n))
    for r in plan.rounds:
        busy = np.flatnonzero(r.dest >= 0)
        total[busy, r.dest[busy]] += r.tokens[busy]
    return total


def _assert_same_rounds(a: Schedule, b: Schedule) -> None:
    assert len(a.rounds) == len(b.rounds)
    for x, y in zip(a.rounds, b.rounds, strict=True):
        assert x.seconds == y.seconds
        np.testing.assert_array_equal(x.dest, y.dest)
        np.testing.assert_array_equal(x.tokens, y.tokens)


def _off_diagonal(tokens: np.ndarray) -> np.ndarray:
    off = tokens.copy()
    np.fill_diagonal(off, 0.0)
    return off


def test_lower_bound_is_the_heaviest_line_and_ignores_the_diagonal() -> None:
    tokens = np.array([[9.0, 3.0, 1.0], [0.0, 9.0, 2.0], [4.0, 4.0, 9.0]])
    # Rows send 4, 2, 8; columns receive 4, 7, 3 -> sender 2 at 8 tokens * 2 B / 4 B/s.
    assert lower_bound(tokens, np.full(3, 4.0), 2.0) == 4.0


def test_pad_lifts_every_line_to_the_max() -> None:
    rng = np.random.default_rng(1)
    for n in range(1, 9):
        for t in (rng.integers(0, 20, (n, n)).astype(float), rng.random((n, n)) * 5):
            x = pad(t)
            top = max(t.sum(axis=0).max(), t.sum(axis=1).max())
            assert (x >= 0).all()
            np.testing.assert_allclose((t + x).sum(axis=0), top, rtol=1e-12)
            np.testing.assert_allclose((t + x).sum(axis=1), top, rtol=1e-12)


def test_pad_keeps_integers_and_leaves_balanced_matrices_alone() -> None:
    t = np.array([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    x = pad(t)
    assert (x == np.round(x)).all()
    assert ((t + x).sum(axis=0) == 4).all() and ((t + x).sum(axis=1) == 4).all()
    assert not pad(np.eye(4)[[1, 2, 3, 0]] * 7).any()


def test_fig4_traffic_takes_two_contention_free_rounds() -> None:
    tokens = np.array([[0, 1, 1], [1, 0, 1], [0, 0, 0]])
    plan = schedule(tokens, np.ones(3), 1.0)
    assert plan.makespan_s == plan.lower_bound_s == 2.0
    assert [r.seconds for r in plan.rounds] == [1.0, 1.0]
    _assert_partial_permutation(plan, 3)
    np.testing.assert_array_equal(_sent(plan, 3), tokens)


def test_bvn_rounds_reach_the_bound_exactly_on_random_integer_traffic() -> None:
    cases = _cases(220, seed=2)
    for tokens in cases:
        n = len(tokens)
        bandwidth = np.full(n, 25e9)
        plan = schedule(tokens, bandwidth, 1536.0)
        assert plan.makespan_s == lower_bound(tokens, bandwidth, 1536.0) == plan.lower_bound_s
        assert len(plan.rounds) <= n * n - 2 * n + 2
        _assert_partial_permutation(plan, n)
        chunks = np.concatenate([r.tokens for r in plan.rounds]) if plan.rounds else np.zeros(0)
        assert (chunks == np.round(chunks)).all(), "homogeneous integer traffic: whole tokens"
        np.testing.assert_array_equal(_sent(plan, n), _off_diagonal(tokens))
        seconds = sum(r.seconds for r in plan.rounds)
        assert seconds == pytest.approx(plan.makespan_s, rel=1e-12)


def test_max_weight_matchings_keep_the_round_count_near_3n() -> None:
    # Each round is one grouped NCCL launch, so the count matters: arbitrary matchings on dense
    # traffic approach the n^2 - 2n + 2 worst case; heaviest-first peels about 3n.
    rng = np.random.default_rng(12)
    for n in (8, 16):
        tokens = rng.integers(1, 100, (n, n)).astype(float)
        assert len(schedule(tokens, np.ones(n), 1.0).rounds) <= 4 * n


def test_heterogeneous_min_pair_reaches_its_own_bound_and_own_nic_reports_thm_5_2() -> None:
    # GPU 0 (2 B/s) sends 2 tokens to each of two 1 B/s GPUs. One flow at a time runs at 1 B/s:
    # 4 s (Appendix B). Rate-split senders would need only 2 s (Theorem 5.2 as printed).
    tokens = np.array([[0, 2, 2], [0, 0, 0], [0, 0, 0]])
    bandwidth = np.array([2.0, 1.0, 1.0])
    pair = schedule(tokens, bandwidth, 1.0)
    own = schedule(tokens, bandwidth, 1.0, mode="own_nic")
    assert pair.makespan_s == pair.lower_bound_s == 4.0
    assert own.makespan_s == 4.0 and own.lower_bound_s == 2.0
    _assert_same_rounds(own, pair)


def test_heterogeneous_schedules_fit_their_rounds_and_deliver_everything() -> None:
    for tokens in _cases(40, seed=3, max_n=8):
        n = len(tokens)
        bandwidth = HETERO[:n]
        plan = schedule(tokens, bandwidth, 1536.0)
        own = schedule(tokens, bandwidth, 1536.0, mode="own_nic")
        assert plan.makespan_s == pytest.approx(plan.lower_bound_s, rel=1e-9)
        assert own.lower_bound_s == lower_bound(tokens, bandwidth, 1536.0)
        assert own.lower_bound_s <= plan.makespan_s * (1 + 1e-12)
        _assert_partial_permutation(plan, n)
        np.testing.assert_allclose(_sent(plan, n), _off_diagonal(tokens), rtol=1e-9, atol=1e-9)
        for r in plan.rounds:
            busy = np.flatnonzero(r.dest >= 0)
            rate = np.minimum(bandwidth[busy], bandwidth[r.dest[busy]])
            assert (r.tokens[busy] * 1536.0 / rate <= r.seconds * (1 + 1e-12)).all()


def test_schedule_is_deterministic_whatever_the_array_layout() -> None:
    tokens = _cases(1, seed=4)[0]
    n = len(tokens)
    plans = [
        schedule(t, np.full(n, 1e9), 2.0)
        for t in (tokens, tokens.copy(), np.asfortranarray(tokens), tokens.astype(np.int64))
    ]
    for other in plans[1:]:
        _assert_same_rounds(plans[0], other)


def test_local_traffic_and_empty_traffic_cost_nothing() -> None:
    tokens = np.array([[0.0, 5.0], [3.0, 0.0]])
    with_local = tokens + np.diag([100.0, 7.0])
    _assert_same_rounds(schedule(with_local, np.ones(2), 1.0), schedule(tokens, np.ones(2), 1.0))
    assert schedule(with_local, np.ones(2), 1.0).makespan_s == 5.0
    empty = schedule(np.diag([4.0, 4.0]), np.ones(2), 1.0)
    assert empty.rounds == () and empty.makespan_s == 0.0


def test_verify_passes_and_catches_a_broken_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    assert verify(samples=60, seed=5)
    real = a2a.schedule

    def dropped_last_round(*args, **kwargs) -> Schedule:
        plan = real(*args, **kwargs)
        return Schedule(plan.rounds[:-1], plan.makespan_s, plan.lower_bound_s)

    monkeypatch.setattr(a2a, "schedule", dropped_last_round)
    assert not verify(samples=20, seed=5)


@pytest.mark.parametrize(
    ("tokens", "bandwidth", "token_bytes", "mode", "message"),
    [
        (np.ones((2, 3)), np.ones(2), 1.0, "min_pair", "square"),
        (np.ones(3), np.ones(3), 1.0, "min_pair", "square"),
        (-np.eye(2)[::-1], np.ones(2), 1.0, "min_pair", "non-negative"),
        (np.ones((2, 2)), np.ones(3), 1.0, "min_pair", r"shape \(2,\)"),
        (np.ones((2, 2)), np.array([1.0, 0.0]), 1.0, "min_pair", "positive"),
        (np.ones((2, 2)), np.ones(2), 0.0, "min_pair", "token_bytes"),
        (np.ones((2, 2)), np.ones(2), 1.0, "fastest", "mode"),
    ],
)
def test_schedule_rejects_bad_input(tokens, bandwidth, token_bytes, mode, message) -> None:
    with pytest.raises(ValueError, match=message):
        schedule(tokens, bandwidth, token_bytes, mode)


def test_pad_rejects_non_square() -> None:
    with pytest.raises(ValueError, match="square"):
        pad(np.ones((2, 3)))
