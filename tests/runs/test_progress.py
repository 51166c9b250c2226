from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.errors import ConfigError
from srifty_core.runs.progress import ProgressLog, ProgressRecord, read_progress


def test_append_read_and_a_cut_last_line(tmp_path: Path) -> None:
    path = tmp_path / "p" / "progress.jsonl"
    assert read_progress(path) == []
    recs = [ProgressRecord(i, 100.0 + i, 0.5, 8, "c0") for i in range(1, 4)]
    with ProgressLog(path) as log:
        for r in recs[:2]:
            log.append(r)
        assert read_progress(path) == recs[:2]  # readable while open
    with ProgressLog(path) as log:
        log.append(recs[2])
    with open(path, "a") as fh:
        fh.write('{"iteration": 4, "wall')  # a writer killed mid-line
    assert read_progress(path) == recs
    with pytest.raises(ConfigError):
        log.append(recs[0])  # closed


def test_a_corrupt_middle_line_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "progress.jsonl"
    path.write_text(
        'garbage\n{"iteration":1,"wall_time":1,"step_s":1,"samples":8,"config_id":"c"}\n'
    )
    with pytest.raises(ConfigError, match="line 1"):
        read_progress(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"iteration": "6"}, "iteration must be a whole number"),
        ({"iteration": 6.7}, "iteration must be a whole number"),
        ({"step_s": float("nan")}, "step_s must be a finite time"),
        ({"wall_time": -1}, "wall_time must be a finite time"),
        ({"samples": True}, "samples must be a whole number"),
        ({"config_id": None}, "config_id must be text"),
        ({"compute_s": "fast"}, "compute_s must be a list"),
    ],
)
def test_a_record_of_the_wrong_shape_is_an_error_naming_log_record_and_field(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    """What the DAG's monitor reads: a damaged record is a ConfigError naming the log,
    the record and the field, never a traceback or a record computed with (NaN times,
    an iteration truncated from 6.7 to 6)."""
    import json

    good = {"iteration": 1, "wall_time": 1.0, "step_s": 0.5, "samples": 8, "config_id": "c0"}
    path = tmp_path / "progress.jsonl"
    lines = [json.dumps(good), json.dumps(good | {"iteration": 2} | change)]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"progress.jsonl: record 2: .*{message}"):
        read_progress(path)


def test_a_configurations_measured_step_leaves_its_warm_up_out() -> None:
    from srifty_core.runs.progress import WARMUP_STEPS, median_step_s, steady_steps

    def rec(i: int, step: float, config: str) -> ProgressRecord:
        return ProgressRecord(i, 1000.0 + i, step, 8, config)

    # c0: three slow warm-up steps, then steady ones; c1: only three steps
    steps = [0.40, 0.26, 0.20, 0.18, 0.18, 0.19, 0.18]
    assert WARMUP_STEPS == 3
    recs = [rec(i + 1, s, "c0") for i, s in enumerate(steps)]
    recs += [rec(len(steps) + k, s, "c1") for k, s in enumerate([0.5, 0.3, 0.3], start=1)]
    assert [r.step_s for r in steady_steps(recs, "c0")] == steps[WARMUP_STEPS:]
    assert median_step_s(recs, "c0") == 0.18  # after the first step only: 0.185
    assert median_step_s(recs, "c1") == 0.3  # too few to leave 3 out: the first only
    assert median_step_s(recs[:2], "c0") is None
    # a checkpoint written after a step counts in the next step's period, not its training
    ckpt = ProgressRecord(8, 1008.0, 0.48, 8, "c0", upkeep_s=0.3)
    assert ckpt.train_s == pytest.approx(0.18)
    assert ProgressRecord.from_dict(ckpt.to_dict()) == ckpt
    assert median_step_s([*recs[:7], ckpt], "c0") == pytest.approx(0.18)
    with pytest.raises(ConfigError, match="upkeep_s must be a finite time"):
        ProgressRecord.from_dict({**ckpt.to_dict(), "upkeep_s": -1})
