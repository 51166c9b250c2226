from __future__ import annotations

import pytest

from srifty_core.catalog.loader import parse_network_rating


@pytest.mark.parametrize(
    ("rating", "expected"),
    [
        ("10.0 / 25.0 (baseline/burst Gbps)", (10.0, 25.0)),
        ("Up to 10 Gbps", (None, 10.0)),
        ("4x 100 Gigabit", (400.0, None)),
        ("25 Gbps", (25.0, None)),
        ("3200 Gigabit", (3200.0, None)),
        ("", (None, None)),
    ],
)
def test_parse_network_rating(rating: str, expected: tuple[float | None, float | None]) -> None:
    assert parse_network_rating(rating) == expected
