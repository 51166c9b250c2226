"""Your own training script under a plan: each rank's share in its environment
(``worker.launch``), the script's library (``worker.user``), and the digits example
trained by three local ranks with unequal batches, one preempted: the job resumes on the
survivors and ends after exactly N iterations with the parameters one process gets from
the whole global batch."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from srifty_core.cloud.base import Allocation
from srifty_core.cloud.local import LocalProvider
from srifty_core.jobs.local_run import train_local
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.runs.progress import read_progress, read_state
from srifty_core.worker import launch
from srifty_core.worker.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = [sys.executable, str(ROOT / "examples" / "digits" / "train.py"), "--dtype", "float64"]
N = 30


def _plan(tmp_path: Path, batches: tuple[int, ...], name: str) -> TrainPlan:
    return TrainPlan(
        model="examples/digits/model.py:build", size="small", global_batch=sum(batches),
        iterations=N, local_batches=batches, run_dir=str(tmp_path / name), checkpoint_every=5,
        step_sleep_s=0.0, entrypoint=(*SCRIPT, "--lr", "0.1"),
    )  # fmt: skip


def test_each_rank_gets_its_share_and_the_scales_weigh_samples_equally(tmp_path: Path) -> None:
    plan = _plan(tmp_path, (24, 24, 16), "r")
    envs = [launch.rank_env(plan, "p.json", r) for r in range(3)]
    assert [e["SRIFTY_LOCAL_BATCH"] for e in envs] == ["24", "24", "16"]
    assert [e["SRIFTY_BATCH_OFFSET"] for e in envs] == ["0", "24", "48"]
    scales = [float(e["SRIFTY_LOSS_SCALE"]) for e in envs]
    # DDP averages over 3 ranks: scale_r / 3 = b_r / B, every sample weighs 1/B
    assert [s / 3 for s in scales] == pytest.approx([24 / 64, 24 / 64, 16 / 64])
    assert envs[0]["SRIFTY_CHECKPOINT"] == str(plan.checkpoint_path)
    with pytest.raises(Exception, match="rank 3 is outside"):
        launch.rank_env(plan, "p.json", 3)
    assert launch.command(plan, "p.json")[:2] == SCRIPT[:2]
    builtin = TrainPlan(**{**plan.to_dict(), "entrypoint": []})
    assert launch.command(builtin, "p.json")[1:] == ["-m", "srifty_core.worker.worker", "p.json"]


def test_sample_indices_do_not_depend_on_how_the_batch_is_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.worker import user

    def indices(batches: tuple[int, ...], it: int) -> list[int]:
        plan = _plan(tmp_path, batches, "r")
        out: list[int] = []
        for r in range(len(batches)):
            for k, v in launch.rank_env(plan, "p.json", r).items():
                monkeypatch.setenv(k, v)
            out += user.sample_indices(it, 100).tolist()
        return out

    for it in (0, 1, 7):  # 64 a step of 100 samples: iterations cross epochs
        whole = indices((64,), it)
        assert indices((24, 24, 16), it) == whole == indices((40, 24), it)
        assert len(set(whole)) == 64 or it > 0
    epoch = indices((64,), 0) + indices((64,), 1)[:36]
    assert sorted(epoch) == list(range(100))  # each epoch is a permutation


def test_outside_a_plan_the_library_says_how_to_run(monkeypatch: pytest.MonkeyPatch) -> None:
    from srifty_core.worker import user

    monkeypatch.delenv("SRIFTY_LOCAL_BATCH", raising=False)
    with pytest.raises(Exception, match=r"SRIFTY_LOCAL_BATCH is not set: run this script"):
        user.local_batch()


@pytest.mark.slow
def test_a_user_script_is_preempted_resumes_and_matches_one_process(tmp_path: Path) -> None:
    plan = _plan(tmp_path, (24, 24, 16), "run")
    provider = LocalProvider(tmp_path / "cloud")
    first: list[Allocation] = []
    interrupted_at: list[int] = []

    def remember(alloc: Allocation) -> None:
        if not first:
            first.append(alloc)

    def reclaim() -> None:
        end = time.monotonic() + 90
        while time.monotonic() < end:
            recs = read_progress(plan.progress_path)
            if recs and recs[-1].iteration >= 8 and first:
                interrupted_at.append(recs[-1].iteration)
                provider.interrupt(first[0].instance_ids[2])  # the 16-sample rank
                return
            time.sleep(0.005)

    slow = TrainPlan(**{**plan.to_dict(), "step_sleep_s": 0.05})  # so that it can be caught
    killer = threading.Thread(target=reclaim, daemon=True)
    killer.start()
    report = train_local(slow, provider, on_poll=remember, timeout_s=240)
    killer.join(timeout=5)

    assert interrupted_at and interrupted_at[0] < N
    pre, post = report.segments
    assert pre.outcome == "preempted" and pre.local_batches == (24, 24, 16)
    assert post.outcome == "finished" and post.local_batches == (32, 32)
    assert report.iterations == N
    recs = read_progress(plan.progress_path)
    assert sorted({r.iteration for r in recs}) == list(range(1, N + 1))
    assert recs[-1].iteration == N and all(r.loss is not None for r in recs)
    state = read_state(Path(plan.run_dir) / "state.json")
    assert state is not None and state.iteration == N and state.checkpoint_iteration == N
    ck = load_checkpoint(plan.checkpoint_path)
    assert ck is not None and ck.iteration == N

    alone = _plan(tmp_path, (64,), "alone")
    single = train_local(alone, LocalProvider(tmp_path / "cloud1"), timeout_s=240)
    assert single.iterations == N
    ref = load_checkpoint(alone.checkpoint_path)
    assert ref is not None
    for k, v in ref.model.items():
        assert torch.allclose(ck.model[k], v, rtol=0, atol=1e-10), k
    result = json.loads((Path(plan.run_dir) / "result.json").read_text())
    again = json.loads((Path(alone.run_dir) / "result.json").read_text())
    assert result["loss"] == pytest.approx(again["loss"], abs=1e-10)
    assert result["accuracy"] > 0.5  # it learned: chance is 0.1


@pytest.mark.slow
def test_the_digits_script_under_an_fsdp_plan_trains_and_resumes(tmp_path: Path) -> None:
    """The same script, unchanged, under an ``fsdp`` plan: ``srifty.wrap`` shards it,
    ``report`` writes DCP checkpoints from every rank; 3 ranks (24, 24, 16) stop at 4
    iterations, 2 ranks resume from their shards to 8, and the job ends at exactly 8 with
    the loss one process reaches on the whole global batch."""
    from srifty_core.worker.checkpoint import sharded_summary

    n = 8
    base = _plan(tmp_path, (24, 24, 16), "run").to_dict() | {"strategy": "fsdp"}
    first = TrainPlan(**base | {"iterations": 4, "checkpoint_every": 3})
    assert train_local(first, LocalProvider(tmp_path / "c0"), poll_s=0.1).iterations == 4
    rest = TrainPlan(**base | {"iterations": n, "local_batches": (32, 32), "config_id": "c1"})
    assert train_local(rest, LocalProvider(tmp_path / "c1"), poll_s=0.1).iterations == n
    recs = read_progress(rest.progress_path)
    assert [r.iteration for r in recs] == list(range(1, n + 1))
    info = sharded_summary(rest.checkpoint_path)
    assert info is not None and (info.iteration, info.world, info.strategy) == (n, 2, "fsdp")
    alone = TrainPlan(**_plan(tmp_path, (64,), "alone").to_dict() | {"iterations": n})
    train_local(alone, LocalProvider(tmp_path / "c2"), poll_s=0.1)
    result = json.loads((Path(rest.run_dir) / "result.json").read_text())
    again = json.loads((Path(alone.run_dir) / "result.json").read_text())
    assert result["loss"] == pytest.approx(again["loss"], rel=0, abs=1e-10)
    assert result["loss"] != pytest.approx(recs[0].loss, abs=1e-3)  # it trained
