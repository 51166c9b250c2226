"""Two probe runs into one partition at once: nothing lost, nothing doubled."""

from __future__ import annotations

import threading
from datetime import date
from pathlib import Path

from srifty_core.cloud.local import LocalProvider
from srifty_core.measure.partials import merge_records
from srifty_core.measure.sweep import SweepResult, probe_sweep
from srifty_core.probing.config import SweepConfig
from srifty_core.probing.store import read_probes

DAY = date(2026, 3, 2)
CONFIG = SweepConfig(sizes=(4, 512, 65536), world_sizes=(2,), concurrency=(1,), repeats=2)


def test_two_runs_started_together_store_each_point_once(data_dir: Path) -> None:
    results: list[SweepResult] = []
    errors: list[BaseException] = []
    go = threading.Barrier(2)

    def one() -> None:
        try:
            go.wait()
            results.append(probe_sweep(CONFIG, provider=LocalProvider(), day=DAY))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert len(results) == 2 and all(r.ok for r in results)
    df = read_probes()
    # every point once: 3 sizes x 2 repeats from a single allocation per point
    assert len(df) == 6
    assert (df.groupby("buffer_bytes")["allocation_id"].nunique() == 1).all()
    assert sorted(df.groupby("buffer_bytes")["repeat"].apply(sorted).tolist()) == [[0, 1]] * 3
    assert not list((data_dir / "probes" / "_partial").rglob("*.jsonl"))


def test_a_point_measured_twice_keeps_one_complete_set() -> None:
    def rows(alloc: str, t0: str, n: int) -> list[dict[str, object]]:
        return [
            {"allocation_id": alloc, "allocation_slot": 0, "world_size": 2, "buffer_bytes": 4,
             "concurrent": 1, "repeat": k, "status": "ok", "phase": "burst",
             "probed_at": f"2026-03-02T00:00:0{t0}+00:00", "date": "2026-03-02"}
            for k in range(n)
        ]  # fmt: skip

    both = merge_records(rows("late", "5", 2) + rows("early", "1", 2), repeats=2)
    assert {r["allocation_id"] for r in both} == {"early"} and len(both) == 2
    # no allocation complete: a rerun's samples add to a crashed run's
    parts = merge_records(rows("a", "1", 1) + rows("b", "2", 1), repeats=2)
    assert {r["allocation_id"] for r in parts} == {"a", "b"}
