"""Gradient accumulation (issue 50 item 1): a plan's ``micro_batches`` splits each rank's
local batch, the gradients are exchanged once per step and the parameters stay those of
one process on the global batch, under ddp and fsdp with uneven local batches (local
gloo processes, float64)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from srifty_core.batches import micro_split
from srifty_core.errors import ConfigError
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.worker.checkpoint import load_checkpoint
from srifty_core.worker.worker import train_single

from .rank_pool import RankPool
from .test_sharded_training import max_diff, plan, sharded_params


@pytest.mark.parametrize(
    ("strategy", "k", "batches", "per_vm", "sync_each"),
    [
        ("ddp", 3, (5, 4, 3), 0, False),
        ("fsdp", 2, (5, 4, 3), 0, False),
        ("hsdp", 2, (5, 3, 2, 2), 2, False),
        ("fsdp", 2, (5, 4, 3), 0, True),
        ("hsdp", 2, (5, 3, 2, 2), 2, True),
    ],
)
def test_micro_batches_give_the_parameters_of_one_process(
    tmp_path: Path,
    rank_pool: RankPool,
    strategy: str,
    k: int,
    batches: tuple[int, ...],
    per_vm: int,
    sync_each: bool,
) -> None:
    """Local batches 5, 4, 3 in k micro-batches of unequal sizes (5 -> 3+2 or 2+2+1): the
    micro-batch shares ``m_j / b_rank`` and the rank's ``loss_scale`` make every sample
    weigh 1/B, so AdamW's steps equal one process on the whole batch of 12 (hsdp: 2 VMs
    of 2 ranks, the allreduce across them held back with the reduce-scatter). The same
    with every micro-batch reduce-scattering into the sharded gradients (``sync_each``)."""
    kw: dict[str, object] = {"optimizer": "adamw", "lr": 0.05, "iterations": 3}
    kw |= {"strategy": strategy, "local_batches": batches, "global_batch": 12}
    kw |= {"ranks_per_vm": per_vm}
    reference = train_single(plan(tmp_path / "one", **kw))
    assert max_diff(reference, train_single(plan(tmp_path / "one", **kw), iterations=0)) > 1e-2
    run = plan(tmp_path / "run", micro_batches=k, sync_each_micro_batch=sync_each, **kw)
    rank_pool.train(run)
    if strategy == "ddp":
        ck = load_checkpoint(run.checkpoint_path)
        assert ck is not None
        got = ck.model
    else:
        got = sharded_params(run)
    assert max_diff(got, reference) < 1e-12


def test_micro_split_is_as_equal_as_possible() -> None:
    assert micro_split(5, 2) == (3, 2) and micro_split(5, 3) == (2, 2, 1)
    assert micro_split(4, 1) == (4,) and sum(micro_split(97, 7)) == 97
    with pytest.raises(ConfigError, match=r"^micro_batches: "):
        micro_split(3, 4)


@pytest.mark.parametrize("value", [0, -1, 4, 1.5, "2", None, True])
def test_a_bad_micro_batches_is_one_line_naming_the_field(tmp_path: Path, value: object) -> None:
    good = plan(tmp_path, local_batches=(5, 3, 3), global_batch=11).to_dict()
    with pytest.raises(ConfigError, match=r"^micro_batches: ") as err:
        TrainPlan.from_dict({**good, "micro_batches": value})
    assert "\n" not in str(err.value)
    assert TrainPlan.from_dict({**good, "micro_batches": 3}).micro_batches == 3


@pytest.mark.parametrize(("strategy", "value"), [("ddp", True), ("fsdp", 1), ("fsdp", "yes")])
def test_a_bad_sync_each_micro_batch_is_one_line_naming_the_field(
    tmp_path: Path, strategy: str, value: object
) -> None:
    """ddp has no sharded gradients to reduce-scatter into; the flag is a JSON bool."""
    good = plan(tmp_path, strategy=strategy, micro_batches=2).to_dict()
    with pytest.raises(ConfigError, match=r"^sync_each_micro_batch: ") as err:
        TrainPlan.from_dict({**good, "sync_each_micro_batch": value})
    assert "\n" not in str(err.value)
    assert not TrainPlan.from_dict(good).sync_each_micro_batch  # a plan without it


def test_old_plans_load_with_one_micro_batch(tmp_path: Path) -> None:
    p = plan(tmp_path, micro_batches=2)
    assert TrainPlan.load(p.save(tmp_path / "plan.json")) == p
    old = {k: v for k, v in p.to_dict().items() if k != "micro_batches"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert TrainPlan.load(tmp_path / "old.json").micro_batches == 1


def _ranks_grads(rank: int, world: int, port: int, strategy: str, out: str) -> None:
    """Each rank's gradients after one backward pass with the exchange held back, then
    after one with it on (saved for the test to compare)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    try:
        # the model (DDP's reducer) is gone before its process group: a rank process of
        # the pool lives on, and DDP freed after the group was destroyed may hang
        torch.save(_two_passes(rank, world, strategy), f"{out}/{rank}.pt")
    finally:
        dist.destroy_process_group()


def _two_passes(rank: int, world: int, strategy: str) -> dict[str, list[torch.Tensor]]:
    from srifty_core.sharding.memory import Layout
    from srifty_core.sharding.wrap import gradient_sync, wrap
    from srifty_core.training_settings import TrainingSettings

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)).double()
    sync_each = strategy == "fsdp-sync-each"
    layout = Layout("fsdp" if sync_each else strategy, world)  # type: ignore[arg-type]
    model = wrap(model, layout, TrainingSettings(), torch.device("cpu"), sync_each)
    x = torch.full((2, 4), float(rank + 1), dtype=torch.float64)

    def grads() -> list[torch.Tensor]:
        gs = [p.grad for p in model.parameters()]
        return [
            (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().clone()
            for g in gs
            if g is not None
        ]

    with gradient_sync(model, False):
        model(x).pow(2).sum().backward()
    # FSDP2 keeps them unsharded and unset, unless each micro-batch reduce-scatters
    held = grads() if strategy != "fsdp" else []
    model(x).pow(2).sum().backward()
    return {"held": held, "synced": grads()}


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp-sync-each"])
def test_gradient_sync_off_keeps_the_gradients_local(
    tmp_path: Path, rank_pool: RankPool, strategy: str
) -> None:
    """Two ranks with different inputs: with the exchange off (ddp) each keeps its own
    gradient; the next backward pass with it on exchanges the accumulated sum: both ranks
    then hold the mean over ranks of 2x their own one-pass gradients. A module sharded to
    sync each micro-batch exchanges on the first pass too: the ranks already agree, and
    the second pass adds as much again."""
    from srifty_core.lifetime import free_port

    rank_pool.spawn(_ranks_grads, (2, free_port(), strategy, str(tmp_path)), nprocs=2)
    r0, r1 = (torch.load(tmp_path / f"{r}.pt") for r in range(2))
    if strategy == "ddp":
        assert any(not torch.allclose(a, b) for a, b in zip(r0["held"], r1["held"], strict=True))
        for a, b, s in zip(r0["held"], r1["held"], r0["synced"], strict=True):
            assert torch.allclose(s, a + b, atol=1e-12)  # (2a + 2b) / 2
    if strategy == "fsdp-sync-each":
        assert r0["held"] and len(r0["held"]) == len(r0["synced"])
        for a, b, s in zip(r0["held"], r1["held"], r0["synced"], strict=True):
            assert torch.allclose(a, b, atol=1e-12)  # exchanged on the first pass
            assert torch.allclose(s, 2 * a, atol=1e-12)  # the same inputs: as much again
    for a, b in zip(r0["synced"], r1["synced"], strict=True):
        assert torch.allclose(a, b, atol=1e-12)


def _marks(rank: int, world: int, port: int, plan_path: str, out: str) -> None:
    """Whether the built-in worker's model and a script's ``srifty.wrap`` model are
    sharded to reduce-scatter every micro-batch, as the plan at ``plan_path`` says."""
    import os
    import signal

    import torch.distributed as dist

    from srifty_core.sharding.wrap import SYNC_EACH
    from srifty_core.worker import user
    from srifty_core.worker.launch import PLAN_ENV
    from srifty_core.worker.worker import _build

    p = TrainPlan.load(plan_path)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)  # fmt: skip
    env = {PLAN_ENV: plan_path, "SRIFTY_PLAN_RANK": str(rank), "SRIFTY_WORLD_SIZE": str(world)}
    saved_env, saved_term = {k: os.environ.get(k) for k in env}, signal.getsignal(signal.SIGTERM)
    os.environ.update(env)
    user.plan.cache_clear()  # a script's process runs one plan: this pool's ranks run many
    try:
        workload, _ = _build(p, shard=True)
        user.init()
        model = user.wrap(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)))
        marks = [getattr(workload.module, SYNC_EACH, None), getattr(model, SYNC_EACH, None)]
        (Path(out) / f"{rank}.json").write_text(json.dumps(marks))
        del workload, model
    finally:
        user.plan.cache_clear()
        signal.signal(signal.SIGTERM, saved_term)
        for k, v in saved_env.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        dist.destroy_process_group()


@pytest.mark.parametrize("sync_each", [True, False])
def test_the_worker_and_a_script_shard_in_the_plans_mode(
    tmp_path: Path, rank_pool: RankPool, sync_each: bool
) -> None:
    """A plan's ``sync_each_micro_batch`` reaches the module both trainers shard: the
    built-in worker's and a script's ``srifty.wrap`` (``gradient_sync`` reads the mark)."""
    from srifty_core.lifetime import free_port

    run = plan(tmp_path / "run", local_batches=(4, 4), global_batch=8, micro_batches=2,
               sync_each_micro_batch=sync_each)  # fmt: skip
    path = str(run.save(tmp_path / "plan.json"))
    rank_pool.spawn(_marks, (2, free_port(), path, str(tmp_path)), nprocs=2)
    for r in range(2):
        assert json.loads((tmp_path / f"{r}.json").read_text()) == [sync_each, sync_each]


def test_the_script_api_reads_micro_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.worker import user
    from srifty_core.worker.launch import PLAN_ENV

    path = plan(tmp_path, micro_batches=2).save(tmp_path / "plan.json")
    monkeypatch.setenv(PLAN_ENV, str(path))
    user.plan.cache_clear()
    try:
        assert user.micro_batches() == 2
    finally:
        user.plan.cache_clear()


def test_survivors_keep_the_planned_micro_batch_size() -> None:
    from srifty_core.batches import micro_batches_for

    # 4 ranks of 8 in 2 micro-batches of 4; 2 survivors take 16 each: 4 of 4
    assert micro_batches_for((8, 8, 8, 8), 2, (16, 16)) == 4
    assert micro_batches_for((5, 4, 3), 3, (6, 6)) == 3  # ceil(5/3) = 2 per micro-batch
    assert micro_batches_for((2, 2), 2, (3, 2)) == 2  # 3 needed, the smallest batch is 2
    assert micro_batches_for((8, 8), 1, (16,)) == 1  # planned without: none added
