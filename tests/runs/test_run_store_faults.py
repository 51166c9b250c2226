"""Run folders on object storage when the store misbehaves: a failed GET or PUT, two
writers on one stream, a denied checkpoint read, a remote run folder where only a local
one works, the deadline alert and the checkpoint summary on run storage.

fsspec's in-memory filesystem (``memory://``) stands in for an object store, with its
``cat_file`` / ``pipe_file`` made to fail on purpose (S3's throttling and denials cannot
be produced on demand); the create-only write is also checked against a moto S3 server
on loopback (see ``test_run_store``), which implements S3's ``If-None-Match``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fsspec.implementations.memory import MemoryFileSystem

from srifty_core import paths
from srifty_core.errors import ConfigError
from srifty_core.jobs.monitor_step import (
    DecisionLog,
    PollResult,
    append_decision,
    read_decisions,
)
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import (
    CHECKPOINT_FILE,
    check_resumable,
    checkpoint_iteration,
    load_checkpoint,
    save_checkpoint,
    sidecar_path,
)
from tests.runs.test_run_store import BUCKET, s3_endpoint  # noqa: F401  (the fixture)


@pytest.fixture
def mem_run() -> Iterator[str]:
    """A fresh run folder on the in-memory filesystem, removed afterwards."""
    uri = f"memory://faults-{uuid.uuid4().hex}/runs/r1"
    yield uri
    fs, where = run_store.filesystem(uri)
    if fs.exists(where.split("/runs/")[0]):
        fs.rm(where.split("/runs/")[0], recursive=True)


def _line(i: int) -> bytes:
    return (
        f'{{"iteration":{i},"wall_time":{float(i)},"step_s":0.1,"samples":8,"config_id":"c0"}}\n'
    ).encode()


def _three_segments(log: str) -> list[str]:
    fs, where = run_store.filesystem(log)
    folder = run_store.segment_folder(where)
    names = [f"{folder}/c0-0-{k:08d}.jsonl" for k in range(3)]
    for k, name in enumerate(names):
        fs.pipe_file(name, _line(2 * k + 1) + _line(2 * k + 2))
    return names


def _fail_get_once(
    monkeypatch: pytest.MonkeyPatch, path: str, exc: BaseException
) -> Callable[[], int]:
    """Make the in-memory GET of ``path`` raise ``exc`` once; returns the count of GETs."""
    real = MemoryFileSystem.cat_file
    state = {"failed": False, "gets": 0}

    def cat_file(self: Any, p: str, *a: Any, **kw: Any) -> Any:
        state["gets"] += 1
        if self._strip_protocol(p) == self._strip_protocol(path) and not state["failed"]:
            state["failed"] = True
            raise exc
        return real(self, p, *a, **kw)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", cat_file)
    return lambda: int(state["gets"])


# -- B1: a failed GET never leaves a hole -----------------------------------------------


def test_read_log_raises_on_a_failed_get_instead_of_leaving_a_hole(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    middle = _three_segments(log)[1]
    _fail_get_once(monkeypatch, middle, OSError("SlowDown"))
    with pytest.raises(OSError, match=r"c0-0-00000001\.jsonl.*SlowDown"):
        read_progress(log)
    assert [r.iteration for r in read_progress(log)] == [1, 2, 3, 4, 5, 6]


def test_read_log_skips_a_segment_removed_since_the_listing(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    middle = _three_segments(log)[1]
    _fail_get_once(monkeypatch, middle, FileNotFoundError(middle))
    assert [r.iteration for r in read_progress(log)] == [1, 2, 5, 6]


def test_a_tail_stops_a_stream_at_a_failed_segment_and_reads_it_next_time(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    fs, where = run_store.filesystem(log)
    middle = _three_segments(log)[1]
    other = f"{run_store.segment_folder(where)}/c0-1-00000000.jsonl"
    fs.pipe_file(other, _line(7))  # another rank's stream goes on regardless
    _fail_get_once(monkeypatch, middle, OSError("SlowDown"))
    tail = run_store.LogTail(log)
    assert [r["iteration"] for r in tail.read()] == [1, 2, 7]
    assert [r["iteration"] for r in tail.read()] == [3, 4, 5, 6]
    assert tail.read() == []


def test_a_tail_gives_up_on_a_segment_that_keeps_failing(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    middle = _three_segments(log)[1]
    real = MemoryFileSystem.cat_file

    def cat_file(self: Any, p: str, *a: Any, **kw: Any) -> Any:
        if self._strip_protocol(p) == self._strip_protocol(middle):
            raise PermissionError("AccessDenied")
        return real(self, p, *a, **kw)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", cat_file)
    tail = run_store.LogTail(log)
    assert [r["iteration"] for r in tail.read()] == [1, 2]
    for _ in range(run_store.READ_RETRIES - 2):
        assert tail.read() == []
    with pytest.raises(OSError, match=r"c0-0-00000001\.jsonl.*AccessDenied"):
        tail.read()


# -- B4: two writers on one stream -----------------------------------------------------


@pytest.fixture(params=["memory", "s3"])
def any_run(request: pytest.FixtureRequest) -> str:
    if request.param == "s3":
        request.getfixturevalue("s3_endpoint")
        return f"s3://{BUCKET}/faults/runs/{uuid.uuid4().hex}"
    return str(request.getfixturevalue("mem_run"))


def test_two_writers_on_one_stream_never_overwrite_each_other(any_run: str) -> None:
    log = f"{any_run}/decisions.jsonl"
    first = run_store.SegmentWriter(log, "c0-monitor", flush_s=60.0)
    second = run_store.SegmentWriter(log, "c0-monitor", flush_s=60.0)
    assert first.seq == second.seq == 0  # both listed an empty stream
    for k, w in enumerate((first, second, first, second)):
        w.write_line(json.dumps({"n": k, "at": float(k)}))
        w.flush()
    assert [d["n"] for d in run_store.read_log(log)] == [0, 1, 2, 3]
    fs, where = run_store.filesystem(log)
    segments = run_store.list_segments(fs, run_store.segment_folder(where))
    assert [s.seq for s in segments] == [0, 1, 2, 3]


def test_a_filesystem_without_create_only_writes_checks_first(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = MemoryFileSystem.pipe_file

    def pipe_file(self: Any, path: str, value: bytes, **kw: Any) -> None:
        if "mode" in kw:
            raise TypeError("pipe_file() got an unexpected keyword argument 'mode'")
        real(self, path, value)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", pipe_file)
    log = f"{mem_run}/decisions.jsonl"
    a = run_store.SegmentWriter(log, "c0-monitor", flush_s=60.0)
    b = run_store.SegmentWriter(log, "c0-monitor", flush_s=60.0)
    for k, w in enumerate((a, b)):
        w.write_line(json.dumps({"n": k, "at": float(k)}))
        w.flush()
    assert [d["n"] for d in run_store.read_log(log)] == [0, 1]


# -- R5: a failed PUT keeps the lines --------------------------------------------------


def _fail_puts(monkeypatch: pytest.MonkeyPatch, n: int) -> list[int]:
    """Make the next ``n`` in-memory PUTs raise; returns [PUTs tried]."""
    real = MemoryFileSystem.pipe_file
    tried = [0]

    def pipe_file(self: Any, path: str, value: bytes, **kw: Any) -> None:
        tried[0] += 1
        if tried[0] <= n:
            raise OSError("SlowDown")
        real(self, path, value, **kw)

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", pipe_file)
    return tried


def test_a_failed_put_keeps_the_lines_for_the_next_flush(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    writer = run_store.SegmentWriter(log, "c0-0", flush_s=0.0)
    tried = _fail_puts(monkeypatch, 2)
    writer.write_line(_line(1).decode().strip())  # PUT fails: kept
    writer.write_line(_line(2).decode().strip())  # fails again: kept
    assert read_progress(log) == [] and writer.failures == 2
    writer.write_line(_line(3).decode().strip())  # written, all three in one segment
    assert tried[0] == 3 and writer.failures == 0
    assert [r.iteration for r in read_progress(log)] == [1, 2, 3]


def test_a_writer_raises_after_several_failed_puts_in_a_row_naming_the_object(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    writer = run_store.SegmentWriter(log, "c0-0", flush_s=0.0, max_failures=3)
    _fail_puts(monkeypatch, 100)
    writer.write_line("{}")
    writer.write_line("{}")
    with pytest.raises(OSError, match=r"c0-0-00000000\.jsonl: 3 writes failed in a row"):
        writer.write_line("{}")


def test_close_retries_a_failed_put_with_a_backoff(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    slept: list[float] = []
    writer = run_store.SegmentWriter(log, "c0-0", flush_s=60.0, sleep=slept.append)
    writer.write_line(_line(1).decode().strip())
    _fail_puts(monkeypatch, 2)
    writer.close()
    assert slept == [0.2, 0.4]
    assert [r.iteration for r in read_progress(log)] == [1]


# -- B2: the monitor's decisions are written at once -----------------------------------


def test_running_decisions_are_written_at_once_on_run_storage(mem_run: str) -> None:
    for k in range(3):  # as ``poll`` does: a fresh monitor (and decision log) per poll
        result = PollResult("running", "", k, float(k), 0.0, config_id="c0", at=float(k))
        DecisionLog(mem_run, "c0").append(result)
    assert [d["iterations_done"] for d in read_decisions(mem_run, "c0")] == [0, 1, 2]


def test_a_decision_appended_beside_a_live_decision_log_is_kept(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    live = DecisionLog(mem_run, "c0")  # listed the stream before the other write
    first = PollResult("running", "", 1, 1.0, 0.0, config_id="c0", at=1.0)
    _fail_puts(monkeypatch, 1)  # the one-off append retries its failed PUT
    append_decision(mem_run, first)
    live.append(PollResult("finished", "", 2, 2.0, 0.0, config_id="c0", at=2.0))
    assert [d["status"] for d in read_decisions(mem_run, "c0")] == ["running", "finished"]


# -- B3 and R3: checkpoints ------------------------------------------------------------


def _save(uri: str, iteration: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(
        uri, model=model, optimizer=opt, iteration=iteration, global_batch=8, config_id="c0"
    )


def test_a_storage_error_is_not_taken_for_a_damaged_checkpoint(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck, log = f"{mem_run}/{CHECKPOINT_FILE}", f"{mem_run}/progress.jsonl"
    _save(ck, 4)
    _fail_get_once(monkeypatch, ck, PermissionError("AccessDenied"))
    with pytest.raises(PermissionError, match="AccessDenied"):
        check_resumable(ck, log, restart=True)
    # The checkpoint was left where it was, and still resumes.
    assert check_resumable(ck, log, restart=True) == 4
    loaded = load_checkpoint(ck)
    assert loaded is not None and loaded.iteration == 4


def test_the_checkpoint_summary_gives_the_iteration_without_loading_it(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = f"{mem_run}/{CHECKPOINT_FILE}"
    assert checkpoint_iteration(ck) is None
    _save(ck, 6)
    assert sidecar_path(ck) == f"{mem_run}/checkpoint.json"
    summary = json.loads(run_store.read_text(sidecar_path(ck)) or "")
    assert summary == {"iteration": 6, "config_id": "c0", "sha256": summary["sha256"]}
    assert len(summary["sha256"]) == 64
    gets = _fail_get_once(monkeypatch, "never", OSError())
    counting, read = MemoryFileSystem.cat_file, []

    def cat_file(self: Any, p: str, *a: Any, **kw: Any) -> Any:
        read.append(self._strip_protocol(p))
        return counting(self, p, *a, **kw)

    monkeypatch.setattr(MemoryFileSystem, "cat_file", cat_file)
    assert checkpoint_iteration(ck) == 6
    # only the summaries: the one-file checkpoint's and the sharded one's (none here)
    assert gets() == 2 and not any(r.endswith(f"/{CHECKPOINT_FILE}") for r in read), read
    # Without a summary (a checkpoint from before them), the checkpoint itself is read.
    fs, where = run_store.filesystem(str(sidecar_path(ck)))
    fs.rm_file(where)
    assert checkpoint_iteration(ck) == 6
    # A summary left behind by a checkpoint moved aside says nothing.
    fs.pipe_file(where, b'{"iteration": 9, "config_id": "c0"}\n')
    check_resumable(ck, f"{mem_run}/progress.jsonl", restart=True)  # readable: kept
    fs.rm_file(run_store.filesystem(ck)[1])
    assert checkpoint_iteration(ck) is None


def test_a_summary_older_than_its_checkpoint_is_not_trusted(tmp_path: Path) -> None:
    ck = tmp_path / CHECKPOINT_FILE
    _save(str(ck), 3)
    _save(str(ck), 5)
    summary = Path(sidecar_path(ck))
    summary.write_text('{"iteration": 3, "config_id": "c0"}\n')  # a writer stopped between
    os.utime(summary, (ck.stat().st_mtime - 10, ck.stat().st_mtime - 10))
    assert checkpoint_iteration(ck) == 5


def test_a_damaged_checkpoint_moved_aside_takes_its_summary_along(tmp_path: Path) -> None:
    ck = tmp_path / CHECKPOINT_FILE
    _save(str(ck), 3)
    ck.write_bytes(ck.read_bytes()[:50])
    assert check_resumable(ck, tmp_path / "progress.jsonl", restart=True) == 0
    assert not ck.exists() and not Path(sidecar_path(ck)).exists()
    assert checkpoint_iteration(ck) is None


# -- B6 and B7: local workers, the deadline alert --------------------------------------


def test_local_workers_refuse_a_run_folder_on_run_storage() -> None:
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.jobs.local_run import train_local
    from srifty_core.planner.schema.train_plan import TrainPlan

    plan = TrainPlan(
        model="dlrm", size="tiny", global_batch=8, iterations=2, local_batches=(8,),
        run_dir="s3://bucket/runs/r1",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"run_dir s3://bucket/runs/r1: local workers"):
        train_local(plan, LocalProvider())
    assert not Path("s3:").exists()


def test_the_deadline_alert_finds_the_latest_job_on_run_storage(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.jobs import orchestrate as orc

    storage = mem_run.removesuffix("/runs/r1")
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, storage)
    import types

    loaded: list[str] = []
    tagged: list[str] = []

    def load(where: Any) -> Any:
        loaded.append(str(where))
        return types.SimpleNamespace(config_run_id="config-run", job_run_id="job-run")

    class Runs:  # job_log's RunLog, where job_log uses it
        @staticmethod
        def open(experiment: str) -> Any:
            return types.SimpleNamespace(log_batch=lambda rid, tags: tagged.append(rid))

    # The MLflow side is covered by tests/dags/test_task_policy.py; here only which job.
    monkeypatch.setattr(orc.JobPlan, "load", staticmethod(load))
    monkeypatch.setattr(orc.job_log, "RunLog", Runs)
    assert orc.job_run_dir("manual__r1", {}) == f"{storage}/runs/manual__r1"
    resume = {"resume": {"checkpoint": f"{mem_run}/{CHECKPOINT_FILE}"}}
    assert orc.job_run_dir("child", resume) == mem_run
    outside = {"resume": {"checkpoint": "memory://elsewhere/runs/r1/checkpoint.pt"}}
    assert orc.job_run_dir("child", outside) is None
    assert orc.deadline_missed("child", outside, "t") is None
    assert orc.deadline_missed("child", resume, "t") is None  # no job file yet
    for k in (0, 2, 10, 1):  # written out of order: the number decides, not the time
        run_store.write_text(f"{mem_run}/job-c{k}.json", "{}")
    assert orc.deadline_missed("child", resume, "t") == f"{mem_run}/job-c10.json"
    assert loaded == [f"{mem_run}/job-c10.json"] and tagged == ["config-run", "job-run"]


def test_a_put_reported_failed_but_stored_is_not_written_twice(
    mem_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = f"{mem_run}/progress.jsonl"
    writer = run_store.SegmentWriter(log, "c0-0", flush_s=0.0)
    real = MemoryFileSystem.pipe_file
    tried = [0]

    def pipe_file(self: Any, path: str, value: bytes, **kw: Any) -> None:
        tried[0] += 1
        real(self, path, value, **kw)
        if tried[0] == 1:  # stored, but the answer was lost (a timeout)
            raise OSError("ReadTimeout")

    monkeypatch.setattr(MemoryFileSystem, "pipe_file", pipe_file)
    writer.write_line(_line(1).decode().strip())
    writer.write_line(_line(2).decode().strip())
    assert [r.iteration for r in read_progress(log)] == [1, 2]
    assert writer.seq == 2 and writer.failures == 0


def test_a_checkpoint_whose_summary_cannot_be_written_is_still_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ck = tmp_path / CHECKPOINT_FILE
    _save(str(ck), 3)
    real = run_store.write_text

    def write_text(where: Any, text: str) -> Any:
        if str(where).endswith("checkpoint.json"):
            raise OSError("SlowDown")
        return real(where, text)

    monkeypatch.setattr(run_store, "write_text", write_text)
    _save(str(ck), 5)
    os.utime(sidecar_path(ck), (ck.stat().st_mtime - 10, ck.stat().st_mtime - 10))
    assert checkpoint_iteration(ck) == 5  # the stale summary (3) is not trusted
