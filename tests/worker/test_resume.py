"""A run folder resumes from its checkpoint, or refuses to start over by accident."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from srifty_core.runs.progress import ProgressLog, ProgressRecord, read_progress
from srifty_core.worker.checkpoint import (
    CheckpointError,
    check_resumable,
    load_checkpoint,
    save_checkpoint,
)


def _log(path: Path, n: int) -> None:
    with ProgressLog(path) as log:
        for i in range(1, n + 1):
            log.append(ProgressRecord(i, float(i), 0.1, 8, "c0"))


def test_progress_without_a_checkpoint_is_refused_unless_restart(tmp_path: Path) -> None:
    ck, log = tmp_path / "checkpoint.pt", tmp_path / "progress.jsonl"
    assert check_resumable(ck, log, restart=False) == 0  # a fresh folder
    _log(log, 40)
    with pytest.raises(CheckpointError, match=r"40 iteration.*--restart"):
        check_resumable(ck, log, restart=False)
    assert check_resumable(ck, log, restart=True) == 0
    assert read_progress(log) == [] and len(list(tmp_path.glob("progress.jsonl.*.old"))) == 1


def test_a_checkpoint_resumes_and_a_damaged_one_is_named(tmp_path: Path) -> None:
    ck, log = tmp_path / "checkpoint.pt", tmp_path / "progress.jsonl"
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(ck, model=model, optimizer=opt, iteration=40, global_batch=8, config_id="c0")
    _log(log, 40)
    assert check_resumable(ck, log, restart=False) == 40
    ck.write_bytes(ck.read_bytes()[:100])  # cut short
    with pytest.raises(CheckpointError, match=r"cannot be read.*--restart"):
        load_checkpoint(ck)
    with pytest.raises(CheckpointError, match="cannot be read"):
        check_resumable(ck, log, restart=False)
    assert check_resumable(ck, log, restart=True) == 0
    assert not ck.exists() and len(list(tmp_path.glob("checkpoint.pt.*.old"))) == 1


def test_flipped_bytes_inside_a_checkpoint_are_caught_by_its_digest(tmp_path: Path) -> None:
    """torch.load does not check the zip's CRCs: zeroed bytes inside a tensor load and
    train on damaged weights. The sha256 recorded beside the checkpoint catches them; a
    summary of another checkpoint checks nothing."""
    import json

    ck = tmp_path / "checkpoint.pt"
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(ck, model=model, optimizer=opt, iteration=40, global_batch=8, config_id="c0")
    assert load_checkpoint(ck) is not None
    data = bytearray(ck.read_bytes())
    weights = data.index(model.weight.detach().numpy().tobytes()[:64])
    data[weights : weights + 64] = bytes(64)  # zero part of the weight tensor
    ck.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"does not match the sha256.*damaged"):
        load_checkpoint(ck)
    summary = tmp_path / "checkpoint.json"
    other = json.loads(summary.read_text()) | {"iteration": 30}  # another checkpoint's
    summary.write_text(json.dumps(other))
    damaged = load_checkpoint(ck)  # nothing to check it against: loads (as before)
    assert damaged is not None and damaged.iteration == 40


def test_records_past_the_checkpoint_are_cut_off_before_a_resume(tmp_path: Path) -> None:
    """A run that died between two checkpoints logged iterations the checkpoint does not
    hold; the rerun resumes at the checkpoint and logs them again. They are cut off the
    log (kept beside it, whole lines and the torn tail), so that each iteration is in the
    log once, raw, as the monitor reads it."""
    ck, log = tmp_path / "checkpoint.pt", tmp_path / "progress.jsonl"
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(ck, model=model, optimizer=opt, iteration=40, global_batch=8, config_id="c0")
    _log(log, 47)
    with log.open("a") as fh:
        fh.write('{"iteration": 48, "wall')  # the kill's torn line
    assert check_resumable(ck, log, restart=False) == 40
    assert [r.iteration for r in read_progress(log)] == list(range(1, 41))
    (aside,) = tmp_path.glob("progress.jsonl.after-40.*.old")
    kept = aside.read_text()
    assert kept.count("\n") == 7 and kept.endswith('{"iteration": 48, "wall')
    assert check_resumable(ck, log, restart=False) == 40  # a log at the checkpoint stays
    assert len(read_progress(log)) == 40 and len(list(tmp_path.glob("*.old"))) == 1
    _log_from(log, 41, 50)  # the rerun
    assert [r.iteration for r in read_progress(log)] == list(range(1, 51))


def _log_from(path: Path, first: int, last: int) -> None:
    with ProgressLog(path) as log:
        for i in range(first, last + 1):
            log.append(ProgressRecord(i, float(i), 0.1, 8, "c0"))
