"""The worker tests' local rank processes, started once per test session (``rank_pool``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .rank_pool import RankPool


@pytest.fixture(scope="session")
def rank_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RankPool]:
    """Rank processes shared by the tests that train on several local processes: one
    pool per parallel worker that runs such a test (scripts/test sends a file whole to
    one worker)."""
    pool = RankPool(tmp_path_factory.mktemp("rank-pool"))
    yield pool
    pool.close()
