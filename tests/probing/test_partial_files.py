"""Garbage in the probe store's partial files never blocks a later run."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from srifty_core.cloud.local import LocalProvider
from srifty_core.measure.partials import partial_dir
from srifty_core.measure.sweep import probe_sweep
from srifty_core.probing.config import SweepConfig
from srifty_core.probing.store import read_probes

DAY = date(2026, 3, 3)


def test_garbage_partial_files_are_set_aside_and_the_sweep_runs(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = partial_dir(DAY, "local", "local.cpu")
    folder.mkdir(parents=True)
    for name, text in (
        ("dict.jsonl", '{"x": 1}\n'),
        ("list.jsonl", "[1, 2]\n"),
        ("binary.jsonl", "garbage\n\x00\x01"),
        ("types.jsonl", '{"allocation_slot": "zz", "status": "ok"}\n'),
    ):
        (folder / name).write_text(text)
    config = SweepConfig(sizes=(4,), world_sizes=(2,), concurrency=(1,), repeats=2)
    result = probe_sweep(config, provider=LocalProvider(), day=DAY)
    assert result.ok and result.rows == 2 and len(read_probes()) == 2
    assert sorted(p.name for p in folder.iterdir() if p.suffix == ".bad") == [
        "binary.jsonl.bad",
        "dict.jsonl.bad",
        "list.jsonl.bad",
        "types.jsonl.bad",
    ]
    assert "were not probe rows" in capsys.readouterr().err
    again = probe_sweep(config, provider=LocalProvider(), day=DAY)  # nothing left in the way
    assert again.ok and again.measured == 0
