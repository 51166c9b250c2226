"""Sweep config: sizes, ranges, validation and the busbw label."""

from __future__ import annotations

import itertools

import pytest

from srifty_core.errors import ConfigError, UnknownNameError
from srifty_core.probing.config import (
    MAX_BUFFER_BYTES,
    SweepConfig,
    busbw,
    format_size,
    geometric_sizes,
    parse_int_list,
    parse_size,
    parse_sizes,
)


def test_parse_size_units_are_binary() -> None:
    assert parse_size("4B") == 4
    assert parse_size("64KB") == 64 * 1024
    assert parse_size("1.5MB") == 3 * 512 * 1024
    assert parse_size("512MiB") == MAX_BUFFER_BYTES
    assert parse_size("4096") == 4096
    with pytest.raises(ConfigError, match="sizes: cannot read '12XB'"):
        parse_size("12XB")


def test_range_is_geometric_with_both_ends() -> None:
    sizes = parse_sizes("4B:512MB")  # 3 points per decade by default
    assert sizes[0] == 4 and sizes[-1] == MAX_BUFFER_BYTES
    assert all(s % 4 == 0 for s in sizes)
    assert list(sizes) == sorted(set(sizes))
    ratios = [b / a for a, b in itertools.pairwise(sizes[5:])]
    assert all(abs(r - 10 ** (1 / 3)) < 0.05 for r in ratios[:-1]), ratios
    assert parse_sizes("4B:64KB", steps=3) == (4, 512, 65536)
    assert geometric_sizes(4, 4000, points_per_decade=1) == (4, 40, 400, 4000)
    assert len(geometric_sizes(4, 4096, points_per_decade=1)) == 5  # 3.01 decades
    assert parse_sizes("1KB,4B,1KB") == (4, 1024)


@pytest.mark.parametrize(
    ("spec", "kw", "match"),
    [
        ("2B:64KB", {}, "sizes: 2 bytes is out of range"),
        ("4B:1GB", {}, "sizes: 1073741824 bytes is out of range"),
        ("6B", {}, "sizes: 6 bytes is not a whole number of float32"),
        ("64KB:4B", {}, "goes downwards"),
        ("4B:1KB", {"steps": 1}, "steps: need at least 2"),
        ("4B,8B", {"steps": 3}, "LO:HI range only"),
    ],
)
def test_bad_sizes_name_the_field(spec: str, kw: dict[str, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SweepConfig(sizes=parse_sizes(spec, **kw))


def test_config_checks_each_field() -> None:
    ok = SweepConfig(sizes=(4, 1024))
    assert ok.world_sizes == (2,) and ok.concurrency == (1, 2, 4)
    with pytest.raises(ConfigError, match="world_sizes: an allreduce needs at least 2"):
        SweepConfig(sizes=(4,), world_sizes=(1,))
    with pytest.raises(ConfigError, match="concurrency: 0 is out of range"):
        SweepConfig(sizes=(4,), concurrency=(0,))
    with pytest.raises(ConfigError, match="repeats"):
        SweepConfig(sizes=(4,), repeats=0)
    with pytest.raises(UnknownNameError, match="unknown backend 'glo'; did you mean 'gloo'"):
        SweepConfig(sizes=(4,), backend="glo")
    with pytest.raises(ConfigError, match="world_sizes: 'two' is not"):
        parse_int_list("two", "world_sizes")


def test_config_round_trips_and_lists_points_in_sweep_order() -> None:
    cfg = SweepConfig(sizes=(4, 1024), world_sizes=(2, 4), concurrency=(1, 2), allocations=2)
    assert SweepConfig.from_dict(cfg.to_dict()) == cfg
    pts = cfg.points(1)
    assert len(pts) == 8 and {p.allocation_slot for p in pts} == {1}
    assert [p.world_size for p in pts] == [2, 2, 2, 2, 4, 4, 4, 4]
    assert len(cfg.all_points()) == 16
    with pytest.raises(ConfigError, match="unknown field"):
        SweepConfig.from_dict({"sizes": [4], "colour": "red"})


def test_busbw_formula() -> None:
    # 2 * s * (n-1) / (n * t): n=2 -> s/t; n=4 -> 1.5 s/t.
    assert busbw(1000, 2, 0.5) == pytest.approx(2000.0)
    assert busbw(64 * 1024**2, 4, 0.1) == pytest.approx(1.5 * 64 * 1024**2 / 0.1)
    assert busbw(4, 8, 1e-3) == pytest.approx(2 * 4 * 7 / (8 * 1e-3))
    with pytest.raises(ValueError):
        busbw(4, 2, 0.0)


def test_format_size() -> None:
    assert [format_size(s) for s in (4, 1024, 3 * 512 * 1024, MAX_BUFFER_BYTES)] == [
        "4B",
        "1KB",
        "1.5MB",
        "512MB",
    ]
