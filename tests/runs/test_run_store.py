"""Run folders on object storage: checkpoints, the segmented progress log, the state file,
the monitor's reads and a resumed training run, all at an ``s3://`` URI.

A moto S3 server on loopback stands in for S3 (AWS itself cannot be reached here): s3fs
talks HTTP to it exactly as it would to S3, with fake credentials and its endpoint given
through the environment (``AWS_ENDPOINT_URL_S3``), as a deployment would give a real one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from srifty_core import paths
from srifty_core.cloud.local import LocalProvider
from srifty_core.errors import ConfigError
from srifty_core.jobs.job import JobPlan, JobSpec
from srifty_core.jobs.monitor_step import Monitor, read_decisions
from srifty_core.lifetime import free_port
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs import store as run_store
from srifty_core.runs.progress import (
    ProgressLog,
    ProgressRecord,
    ProgressTail,
    TrainState,
    read_progress,
    read_state,
    write_state,
)
from srifty_core.worker.checkpoint import (
    CheckpointError,
    check_resumable,
    load_checkpoint,
    save_checkpoint,
)
from srifty_core.worker.worker import run_rank, train_single

BUCKET = "srifty-runs"
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 (a free port) with the bucket made."""
    import fsspec
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in (*FAKE_ENV, "AWS_ENDPOINT_URL_S3")}
    os.environ.update(FAKE_ENV, AWS_ENDPOINT_URL_S3=endpoint)
    S3FileSystem = fsspec.get_filesystem_class("s3")  # s3fs's, through fsspec's registry
    S3FileSystem.clear_instance_cache()  # no client made for another endpoint
    try:
        # moto keeps its buckets per process: another module's server may have made it.
        run_store.filesystem(f"s3://{BUCKET}")[0].makedirs(BUCKET, exist_ok=True)
        yield endpoint
    finally:
        S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def run_uri(s3_endpoint: str, request: pytest.FixtureRequest) -> str:
    """A fresh run folder in the bucket, one per test."""
    return f"s3://{BUCKET}/deploy/runs/{request.node.name.replace('[', '_').strip(']')}"


def _fs() -> Any:
    return run_store.filesystem(f"s3://{BUCKET}")[0]


def test_a_checkpoint_round_trips_through_s3_and_is_published_whole(run_uri: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    uri = f"{run_uri}/checkpoint.pt"
    assert load_checkpoint(uri) is None
    for it in (7, 8):
        save_checkpoint(
            uri, model=model, optimizer=opt, iteration=it, global_batch=32, config_id="c1"
        )
    ck = load_checkpoint(uri)
    assert ck is not None and ck.iteration == 8 and ck.samples == 256 and ck.config_id == "c1"
    for k, v in model.state_dict().items():
        assert torch.equal(ck.model[k], v)
    assert ck.optimizer["state"], "the optimizer's momentum travels too"
    # Only the published key (and its summary) is left: the temporary keys were removed
    # after the copy.
    folder = uri.removeprefix("s3://").rsplit("/", 1)[0]
    fs = _fs()
    fs.invalidate_cache()
    assert [p.rsplit("/", 1)[1] for p in fs.ls(folder, detail=False)] == [
        "checkpoint.json",
        "checkpoint.pt",
    ]
    # A damaged object is named, never taken for a fresh run.
    fs.pipe_file(uri.removeprefix("s3://"), fs.cat_file(uri.removeprefix("s3://"))[:100])
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(uri)


def test_two_ranks_log_concurrently_and_read_back_complete_and_ordered(run_uri: str) -> None:
    log = f"{run_uri}/progress.jsonl"
    n = 40
    t0 = 1_000.0

    def write(rank: int) -> None:
        with ProgressLog(log, rank=rank, flush_s=0.01) as out:
            for i in range(1, n + 1):
                out.append(ProgressRecord(i, t0 + i + rank / 2, 0.1, 8, "c0"))
                time.sleep(0.002)

    threads = [threading.Thread(target=write, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = read_progress(log)
    assert len(records) == 2 * n
    assert [r.wall_time for r in records] == sorted(r.wall_time for r in records)
    for rank in (0, 1):  # each rank's records complete and in its own order
        mine = [r.iteration for r in records if (r.wall_time - t0 - r.iteration) * 2 == rank]
        assert mine == list(range(1, n + 1))
    segments = run_store.list_segments(_fs(), log.removeprefix("s3://").removesuffix(".jsonl"))
    assert {s.stream for s in segments} == {"c0-0", "c0-1"}
    assert len(segments) > 2, "one object per flush window, not one per writer"
    # A restarted writer continues its stream's sequence instead of overwriting it.
    with ProgressLog(log, rank=0) as again:
        again.append(ProgressRecord(n + 1, t0 + 2 * n, 0.1, 8, "c0"))
    assert len(read_progress(log)) == 2 * n + 1


def test_a_torn_segment_is_tolerated_and_a_bad_line_named(run_uri: str) -> None:
    log = f"{run_uri}/progress.jsonl"
    folder = log.removeprefix("s3://").removesuffix(".jsonl")
    fs = _fs()

    def line(i: int) -> str:
        return (
            f'{{"iteration":{i},"wall_time":{float(i)},"step_s":0.1,"samples":8,'
            f'"config_id":"c0"}}\n'
        )

    tail = ProgressTail(log)
    fs.pipe_file(f"{folder}/c0-0-00000000.jsonl", (line(1) + line(2)).encode())
    # A writer killed mid-PUT on a store that is not atomic: the last line is cut short.
    torn = line(3) + line(4)[:25]
    fs.pipe_file(f"{folder}/c0-0-00000001.jsonl", torn.encode())
    assert [r.iteration for r in read_progress(log)] == [1, 2, 3]
    assert [r.iteration for r in tail.read()] == [1, 2, 3]
    # The stream goes on in its next segment; the torn line is skipped for good.
    fs.pipe_file(f"{folder}/c0-0-00000002.jsonl", line(4).encode())
    assert [r.iteration for r in tail.read()] == [4]
    assert [r.iteration for r in read_progress(log)] == [1, 2, 3, 4]
    assert tail.read() == []
    # A line that is not JSON in the middle of a segment is damage, not a torn write.
    fs.pipe_file(f"{folder}/c0-1-00000000.jsonl", (line(5) + "garbage\n" + line(6)).encode())
    with pytest.raises(ConfigError, match="line 2 is not JSON"):
        read_progress(log)


def test_progress_without_a_checkpoint_on_s3_is_refused_unless_restart(run_uri: str) -> None:
    ck, log = f"{run_uri}/checkpoint.pt", f"{run_uri}/progress.jsonl"
    assert check_resumable(ck, log, restart=False) == 0
    with ProgressLog(log) as out:
        for i in range(1, 6):
            out.append(ProgressRecord(i, float(i), 0.1, 8, "c0"))
    with pytest.raises(CheckpointError, match=r"5 iteration.*--restart"):
        check_resumable(ck, log, restart=False)
    assert check_resumable(ck, log, restart=True) == 0
    assert read_progress(log) == []
    fs = _fs()
    fs.invalidate_cache()
    aside = [p for p in fs.ls(run_uri.removeprefix("s3://"), detail=False) if ".old" in p]
    assert len(aside) == 1 and len(fs.ls(aside[0])) == 1  # the old segments, kept


def _plan(run_dir: str, **kw: object) -> TrainPlan:
    base: dict[str, object] = {
        "model": "dlrm", "size": "tiny", "global_batch": 8, "iterations": 3,
        "local_batches": (8,), "run_dir": run_dir, "dtype": "float64", "lr": 0.05,
        "momentum": 0.9, "checkpoint_every": 2,
    }  # fmt: skip
    base.update(kw)
    return TrainPlan(**base)  # type: ignore[arg-type]


def test_a_run_folder_on_s3_trains_then_resumes_to_exactly_n_iterations(run_uri: str) -> None:
    first = _plan(run_uri, iterations=3)
    assert isinstance(first.checkpoint_path, str) and first.checkpoint_path.startswith("s3://")
    plan_uri = first.save(f"{run_uri}/plan-c0.json")
    assert TrainPlan.load(plan_uri) == first
    # One rank in this process (gloo on loopback); the run folder only on S3.
    assert run_rank(first, 0, 1, "127.0.0.1", free_port()) == 0
    ck = load_checkpoint(first.checkpoint_path)
    assert ck is not None and ck.iteration == 3
    second = _plan(run_uri, iterations=7, config_id="c1")
    assert check_resumable(second.checkpoint_path, second.progress_path, restart=False) == 3
    assert run_rank(second, 0, 1, "127.0.0.1", free_port()) == 0
    ck = load_checkpoint(second.checkpoint_path)
    assert ck is not None and ck.iteration == 7 and ck.config_id == "c1"
    records = read_progress(second.progress_path)
    assert [(r.iteration, r.config_id) for r in records] == [
        (1, "c0"), (2, "c0"), (3, "c0"), (4, "c1"), (5, "c1"), (6, "c1"), (7, "c1"),
    ]  # fmt: skip
    state = read_state(f"{run_uri}/state.json")
    assert state is not None and state.iteration == state.checkpoint_iteration == 7
    # The same parameters as one straight run of 7 iterations: the resume lost nothing.
    straight = train_single(_plan(run_uri, iterations=7))
    assert max(float((ck.model[k] - straight[k]).abs().max()) for k in straight) < 1e-10


def test_the_monitor_reads_progress_state_and_plans_from_s3(run_uri: str) -> None:
    plan = _plan(run_uri, iterations=10)
    plan_uri = str(plan.save(f"{run_uri}/plan-c0.json"))
    job = JobPlan(
        config_id="c0", provider="ec2", region="us-east-1", train_plan=plan_uri, launches=(),
        usd_per_hour=1.0, predicted={"t_iter_s": 0.1}, explanation=(),
    )  # fmt: skip
    job_uri = str(job.save(f"{run_uri}/job-c0.json"))
    spec = JobSpec.from_params(
        {"model": "dlrm", "size": "tiny", "global_batch": 8, "iterations": 10,
         "offers": [{"type": "local.cpu", "quota": 1, "price": 1.0}], "provider": "local"}
    )  # fmt: skip
    started = time.time() - 5.0
    monitor = Monitor(job_uri, [], spec, started, provider=LocalProvider())
    assert monitor.facts.progress_path == f"{run_uri}/progress.jsonl"
    with ProgressLog(plan.progress_path, flush_s=0.0) as log:
        for i in range(1, 5):
            log.append(ProgressRecord(i, started + i, 0.1, 8, "c0"))
    write_state(monitor.facts.state_path, TrainState(4, started + 4, "c0", 2, 0.5))
    first = monitor.step(now=started + 5)
    assert first.status == "running" and first.iterations_done == 4
    with ProgressLog(plan.progress_path, flush_s=0.0) as log:
        for i in range(5, 11):
            log.append(ProgressRecord(i, started + 4 + i / 10, 0.1, 8, "c0"))
    write_state(monitor.facts.state_path, TrainState(10, started + 5, "c0", 10, 0.4))
    done = monitor.step(now=started + 6)
    assert done.status == "finished" and done.iterations_done == 10
    # The decisions went to the same run folder (flushed at the non-running one).
    decisions = read_decisions(run_uri, "c0")
    assert [d["status"] for d in decisions] == ["running", "finished"]


def test_run_storage_is_a_deployment_setting_and_confines_resumes(
    run_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(paths.RUN_STORAGE_ENV, raising=False)
    assert paths.run_storage() is None
    with pytest.raises(ConfigError, match="must be in a run folder"):  # no storage set
        run_store.confined_run_dir(f"{run_uri}/checkpoint.pt", "checkpoint.pt")
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, f"s3://{BUCKET}/deploy/")
    assert paths.run_storage() == f"s3://{BUCKET}/deploy"
    assert run_store.runs_root() == f"s3://{BUCKET}/deploy/runs"
    assert run_store.confined_run_dir(f"{run_uri}/checkpoint.pt", "checkpoint.pt") == run_uri
    for bad in (
        f"s3://{BUCKET}/other/runs/r1/checkpoint.pt",  # another prefix
        f"s3://{BUCKET}/deploy/runs/../x/checkpoint.pt",  # out by ..
        f"s3://{BUCKET}/deploy/runs/checkpoint.pt",  # the root, not a run folder
        f"s3://{BUCKET}/deploy/runs/a/b/checkpoint.pt",  # nested
        "/etc/checkpoint.pt",  # a local path
    ):
        with pytest.raises(ConfigError, match="must be in a run folder"):
            run_store.confined_run_dir(bad, "checkpoint.pt")
    monkeypatch.setenv(paths.RUN_STORAGE_ENV, "bucket-without-scheme")
    with pytest.raises(ConfigError, match="SRIFTY_RUN_STORAGE"):
        paths.run_storage()


def test_local_paths_keep_their_files(tmp_path: Path) -> None:
    """The same calls on a local folder write the files they always did."""
    tmp_path = tmp_path / "run"
    assert run_store.join(tmp_path, "progress.jsonl") == tmp_path / "progress.jsonl"
    with ProgressLog(tmp_path / "progress.jsonl", rank=1, flush_s=60.0) as log:
        log.append(ProgressRecord(1, 1.0, 0.1, 8, "c0"))
        assert len((tmp_path / "progress.jsonl").read_text().splitlines()) == 1  # not buffered
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.jsonl"]
