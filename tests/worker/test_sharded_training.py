"""Sharded training (issue 50 item 5): the built-in worker under ``fsdp``/``hsdp`` plans
(FSDP2 on local gloo processes) gives the parameters of one process on the global batch
with uneven local batches; its DCP checkpoints resume on another world size and across
strategies, ending at exactly N iterations; a kill while one is written leaves the
previous one."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from srifty_core.errors import ConfigError
from srifty_core.lifetime import free_port
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress
from srifty_core.worker.checkpoint import (
    checkpoint_iteration,
    latest,
    load_checkpoint,
    sharded_paths,
    sharded_summary,
)
from srifty_core.worker.worker import EXIT_STOPPED, train_single

from .rank_pool import RankPool


def plan(tmp: Path, **kw: object) -> TrainPlan:
    base: dict[str, object] = {
        "model": "dlrm", "size": "tiny", "global_batch": 10, "iterations": 2,
        "local_batches": (5, 3, 2), "run_dir": str(tmp), "dtype": "float64", "lr": 0.5,
        "momentum": 0.9, "strategy": "fsdp",
    }  # fmt: skip
    base.update(kw)
    return TrainPlan(**base)  # type: ignore[arg-type]


def sharded_params(p: TrainPlan) -> dict[str, torch.Tensor]:
    """The model parameters of the run folder's sharded checkpoint, read whole in this
    process (DCP without a process group)."""
    import torch.distributed.checkpoint as dcp

    from srifty_core.workloads import build

    info = sharded_summary(p.checkpoint_path)
    assert info is not None
    module = build(p.model, p.size, seed=p.seed).module.double()
    state = {"model": module.state_dict()}
    dcp.load(state, checkpoint_id=str(info.folder), no_dist=True)
    return state["model"]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


@pytest.mark.parametrize(
    ("strategy", "batches", "per_vm"), [("fsdp", (5, 3, 2), 0), ("hsdp", (4, 3, 2, 1), 2)]
)
def test_sharded_ranks_with_uneven_batches_equal_one_process(
    tmp_path: Path, rank_pool: RankPool, strategy: str, batches: tuple[int, ...], per_vm: int
) -> None:
    """FSDP2's reduce-scatter (and hsdp's allreduce across VMs) average over every rank as
    DDP does, so the method's loss scale ``world * b_rank / B`` makes each sample weigh
    1/B: AdamW steps over shards equal one process on the whole global batch."""
    kw: dict[str, object] = {"optimizer": "adamw", "lr": 0.05, "iterations": 3}
    kw |= {"strategy": strategy, "local_batches": batches, "ranks_per_vm": per_vm}
    reference = train_single(plan(tmp_path / "one", **kw))
    start = train_single(plan(tmp_path / "one", **kw), iterations=0)
    assert max_diff(reference, start) > 1e-2  # training moved the parameters
    sharded = plan(tmp_path / "run", **kw)
    rank_pool.train(sharded)
    info = sharded_summary(sharded.checkpoint_path)
    assert info is not None and (info.iteration, info.world) == (3, len(batches))
    assert info.strategy == strategy and not Path(sharded.checkpoint_path).exists()
    assert max_diff(sharded_params(sharded), reference) < 1e-12


@pytest.mark.slow
def test_sigterm_stops_every_rank_after_a_sharded_checkpoint(
    tmp_path: Path, rank_pool: RankPool
) -> None:
    """One of 3 worker processes gets SIGTERM (a preemption notice): the ranks agree to
    stop, all write their shards of the step they stopped at, and exit ``EXIT_STOPPED``.
    2 ranks resume from those shards (DCP reshards) and run the rest once: the progress
    log holds 1..N once, the last checkpoint N, and the parameters (momentum included)
    are those of a straight run."""
    n = 12
    first = plan(tmp_path / "run", iterations=n, checkpoint_every=100, step_sleep_s=0.05)
    path = first.save(tmp_path / "plan.json")
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "srifty_core.worker.worker", str(path)],
            env={
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": "3",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
            stderr=subprocess.DEVNULL,
        )
        for r in range(3)
    ]
    try:
        end = time.monotonic() + 60
        while len(read_progress(first.progress_path)) < 3 and time.monotonic() < end:
            time.sleep(0.02)
        procs[1].send_signal(signal.SIGTERM)
        codes = [p.wait(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [EXIT_STOPPED] * 3
    stopped = checkpoint_iteration(first.checkpoint_path)
    assert stopped is not None and 3 <= stopped < n
    assert read_progress(first.progress_path)[-1].iteration == stopped
    rest = plan(tmp_path / "run", iterations=n, local_batches=(6, 4), config_id="c1")
    rank_pool.train(rest)
    assert [r.iteration for r in read_progress(rest.progress_path)] == list(range(1, n + 1))
    info = sharded_summary(rest.checkpoint_path)
    assert info is not None and (info.iteration, info.world, info.config_id) == (n, 2, "c1")
    assert info.samples == n * 10
    _, folder = sharded_paths(rest.checkpoint_path)
    assert [p.name for p in Path(folder).iterdir()] == [Path(info.folder).name]  # old gone
    straight = train_single(plan(tmp_path / "one", iterations=n))
    assert max_diff(sharded_params(rest), straight) < 1e-12


@pytest.mark.slow
def test_ddp_and_sharded_checkpoints_cross_over(tmp_path: Path, rank_pool: RankPool) -> None:
    """A job re-planned ddp -> fsdp -> ddp: the sharded ranks load the one-file checkpoint
    (a full state dict, each keeping its shards), the replicas load the sharded one (DCP
    into full tensors); each time the run folder's checkpoint is the later one and the job
    ends with a straight run's parameters."""
    straight = train_single(plan(tmp_path / "one", iterations=6))
    run = tmp_path / "run"
    rank_pool.train(plan(run, iterations=2, local_batches=(4, 6), strategy="ddp"))
    p = plan(run, iterations=4)
    assert latest(p.checkpoint_path) == ("file", 2)
    rank_pool.train(p)
    assert latest(p.checkpoint_path) == ("sharded", 4)
    assert not Path(p.checkpoint_path).exists()  # the superseded one-file checkpoint
    last = plan(run, iterations=6, local_batches=(7, 3), strategy="ddp", config_id="c2")
    rank_pool.train(last)
    assert latest(last.checkpoint_path) == ("file", 6)
    ck = load_checkpoint(last.checkpoint_path)
    assert ck is not None and max_diff(ck.model, straight) < 1e-12
    assert [r.iteration for r in read_progress(p.progress_path)] == list(range(1, 7))


@pytest.mark.parametrize("where", ["local", "object storage"])
def test_a_kill_while_writing_leaves_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """The shards of a new checkpoint are written but its summary never published (the
    process dies between the two): the run folder still resumes from the previous one,
    whose folder is untouched; in a local folder and at a URI (fsspec's ``memory://``,
    as a run folder on S3 is written)."""
    from srifty_core.runs import store
    from srifty_core.worker import sharded_checkpoint as sc

    with one_sharded_rank() as (model, opt):
        ck: Path | str = tmp_path / "checkpoint.pt"
        if where != "local":
            ck = f"memory://{tmp_path.name}/run/checkpoint.pt"
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        kept = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
        sc.save_sharded(ck, model=model, optimizer=opt, iteration=1, global_batch=3,
                        config_id="c0", strategy="fsdp", extra={"epoch": 7})  # fmt: skip
        model(torch.randn(3, 4)).sum().backward()
        opt.step()

        def killed(location: object, data: bytes) -> None:
            raise KeyboardInterrupt("killed before the summary was published")

        monkeypatch.setattr(store, "publish", killed)
        with pytest.raises(KeyboardInterrupt):
            sc.save_sharded(ck, model=model, optimizer=opt, iteration=2, global_batch=3,
                            config_id="c0", strategy="fsdp")  # fmt: skip
        monkeypatch.undo()
        _, folder = sharded_paths(ck)
        assert len(store.names(folder, "*")) == 2  # the new shards, unpublished
        assert checkpoint_iteration(ck) == 1
        resumed = sc.load_latest(ck, model, opt, global_batch=3)
        assert resumed is not None and (resumed.iteration, resumed.extra) == (1, {"epoch": 7})
        now = {k: v.full_tensor() for k, v in model.state_dict().items()}
        assert max_diff(now, kept) == 0.0
        with pytest.raises(ConfigError, match="same global batch"):
            sc.load_latest(ck, model, opt, global_batch=4)
        sc.save_sharded(ck, model=model, optimizer=opt, iteration=2, global_batch=3,
                        config_id="c0", strategy="fsdp")  # fmt: skip
        assert checkpoint_iteration(ck) == 2 and len(store.names(folder, "*")) == 1
        sc.save_sharded(ck, model=model, optimizer=None, iteration=3, global_batch=3,
                        config_id="c0", strategy="fsdp")  # fmt: skip
        resumed = sc.load_latest(ck, model, opt, global_batch=3)  # the model alone
        assert resumed is not None and resumed.iteration == 3


@contextlib.contextmanager
def one_sharded_rank() -> Iterator[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    """A small model sharded by FSDP2 over a gloo group of this one process, and its
    optimizer."""
    import torch.distributed as dist

    from srifty_core.sharding.memory import Layout
    from srifty_core.sharding.wrap import wrap
    from srifty_core.training_settings import TrainingSettings

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)  # fmt: skip
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        wrap(model, Layout("fsdp", 1), TrainingSettings(), torch.device("cpu"))
        yield model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    finally:
        dist.destroy_process_group()


def test_a_run_folder_with_a_sharded_checkpoint_resumes_from_it(tmp_path: Path) -> None:
    """``check_resumable`` (what ``srifty train`` runs first) counts a sharded checkpoint:
    the log is cut back to it; a damaged summary is an error, moved aside by restart."""
    from srifty_core.runs.progress import ProgressLog, ProgressRecord
    from srifty_core.worker.checkpoint import CheckpointError, check_resumable
    from srifty_core.worker.sharded_checkpoint import save_sharded

    ck, log = tmp_path / "checkpoint.pt", tmp_path / "progress.jsonl"
    with ProgressLog(log) as out:
        for i in range(1, 6):
            out.append(ProgressRecord(i, float(i), 0.1, 3, "c0"))
    with one_sharded_rank() as (model, opt):
        save_sharded(ck, model=model, optimizer=opt, iteration=3, global_batch=3,
                     config_id="c0", strategy="fsdp")  # fmt: skip
    assert check_resumable(ck, log, restart=False) == 3
    assert [r.iteration for r in read_progress(log)] == [1, 2, 3]
    summary, _ = sharded_paths(ck)
    Path(summary).write_text('{"iteration": "three"')
    with pytest.raises(CheckpointError, match=r"sharded checkpoint summary .* cannot be read"):
        check_resumable(ck, log, restart=False)
    assert check_resumable(ck, log, restart=True) == 0
    assert not Path(summary).exists() and read_progress(log) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("strategy", "zero"),
        ("strategy", 3),
        ("strategy", None),
        ("ranks_per_vm", 2),  # 3 ranks are not VMs of 2
        ("ranks_per_vm", -1),
        ("ranks_per_vm", 4),
        ("ranks_per_vm", 1.5),
        ("ranks_per_vm", "2"),
    ],
)
def test_a_bad_strategy_or_ranks_per_vm_is_one_line_naming_the_field(
    tmp_path: Path, field: str, value: object
) -> None:
    good = plan(tmp_path).to_dict()
    with pytest.raises(ConfigError, match=f"^{field}: ") as err:
        TrainPlan.from_dict({**good, field: value})
    assert "\n" not in str(err.value)


def test_strategy_round_trips_and_old_plans_are_ddp(tmp_path: Path) -> None:
    p = plan(tmp_path, strategy="hsdp", ranks_per_vm=1)
    again = TrainPlan.load(p.save(tmp_path / "plan.json"))
    assert again == p and again.layout.shard_degree == 1 and again.sharded
    old = {k: v for k, v in p.to_dict().items() if k not in ("strategy", "ranks_per_vm")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    legacy = TrainPlan.load(tmp_path / "old.json")
    assert legacy.strategy == "ddp" and not legacy.sharded
    assert legacy.layout.ranks_per_vm == 3  # every rank on one VM


def test_a_planned_strategy_reaches_the_training_plan() -> None:
    from srifty_core.jobs.job import Launch
    from srifty_core.jobs.planning import train_plan_for

    four = Launch("g5.12xlarge", "on-demand", 2, 4, 4)
    kw = {"model": "dlrm", "size": "tiny", "global_batch": 32, "iterations": 5, "run_dir": "r"}
    plan = train_plan_for([four], strategy="hsdp", **kw)  # type: ignore[arg-type]
    assert (plan.strategy, plan.ranks_per_vm, plan.world_size) == ("hsdp", 4, 8)
    plan = train_plan_for([four], strategy="fsdp", **kw)  # type: ignore[arg-type]
    assert (plan.strategy, plan.ranks_per_vm) == ("fsdp", 0)
    assert train_plan_for([four], **kw).strategy == "ddp"  # type: ignore[arg-type]
    one = Launch("g5.xlarge", "spot", 8, 1, 4)
    with pytest.raises(ConfigError, match=r"^strategy: hsdp needs the same GPUs per VM"):
        train_plan_for([four, one], strategy="hsdp", **{**kw, "global_batch": 64})  # type: ignore[arg-type]
