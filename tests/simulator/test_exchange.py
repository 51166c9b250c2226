"""The gradient-exchange event simulation, on cases worked out by hand."""

from __future__ import annotations

import math

import pytest

from srifty_core.simulator.exchange import bus_bytes, simulate_exchange

GB = 1e9


def test_one_bucket() -> None:
    # 100 MB over 4 ranks moves 2*100*(3/4) = 150 MB on the bus; at 10 GB/s: 15 ms after its start
    vol = bus_bytes(100e6, 4)
    assert vol == pytest.approx(150e6)
    r = simulate_exchange([0.020], [vol], [10 * GB], cap=math.inf)
    assert r.t_pe == pytest.approx(0.020 + 0.015)


def test_two_equal_buckets_starting_together_under_a_cap() -> None:
    # each alone would take 10 ms at 10 GB/s; the cap is 10 GB/s, so each gets 5 GB/s: 20 ms
    r = simulate_exchange([0.0, 0.0], [100e6, 100e6], [10 * GB, 10 * GB], cap=10 * GB)
    assert r.finish == pytest.approx((0.020, 0.020))
    assert r.max_concurrency == 2


def test_a_cap_that_is_never_reached() -> None:
    r = simulate_exchange([0.0, 0.0], [100e6, 100e6], [10 * GB, 10 * GB], cap=25 * GB)
    assert r.finish == pytest.approx((0.010, 0.010))


def test_a_late_small_bucket_overlaps_a_long_one() -> None:
    # A: 100 MB from t=0 at 10 GB/s. At 5 ms A has 50 MB left and B (10 MB) starts.
    # Together (20 GB/s asked, cap 10) each gets 5 GB/s: B ends at 5 + 10/5 = 7 ms, A has
    # 50 - 5*2 = 40 MB left, alone again at 10 GB/s: ends at 7 + 4 = 11 ms.
    r = simulate_exchange([0.0, 0.005], [100e6, 10e6], [10 * GB, 10 * GB], cap=10 * GB)
    assert r.finish == pytest.approx((0.011, 0.007))
    assert r.t_pe == pytest.approx(0.011)


def test_slow_transfer_keeps_its_own_bandwidth_under_fair_share() -> None:
    # b_tra = min(b_bus, cap/c): a slow 2 GB/s transfer beside a fast one under a 10 GB/s cap
    # keeps 2 GB/s and ends at 5 ms; the fast one gets min(10, 10/2) = 5 GB/s until then
    # (25 MB done), then runs alone at 10 GB/s: 25 MB more in 2.5 ms
    r = simulate_exchange([0.0, 0.0], [10e6, 50e6], [2 * GB, 10 * GB], cap=10 * GB)
    assert r.finish == pytest.approx((0.005, 0.0075))


def test_gaps_between_transfers_and_order_of_input() -> None:
    r = simulate_exchange([0.050, 0.0], [10e6, 10e6], [10 * GB, 10 * GB], cap=math.inf)
    assert r.finish == pytest.approx((0.051, 0.001))
    assert simulate_exchange([], [], [], cap=1.0).t_pe == 0.0


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="same length"):
        simulate_exchange([0.0], [1.0, 2.0], [1.0], cap=1.0)
    with pytest.raises(ValueError, match="positive"):
        simulate_exchange([0.0], [1.0], [0.0], cap=1.0)
