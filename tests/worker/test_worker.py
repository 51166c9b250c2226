"""Heterogeneous DDP: reweighted gradients equal one process on the global batch; resuming
a checkpoint on another world size gives the parameters of a straight run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from srifty_core.errors import ConfigError
from srifty_core.lifetime import free_port
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.worker.checkpoint import load_checkpoint
from srifty_core.worker.worker import loss_scale, run_rank, split_batch, train_single

from .rank_pool import RankPool


def plan(tmp: Path, **kw: object) -> TrainPlan:
    base: dict[str, object] = {
        "model": "dlrm",
        "size": "tiny",
        "global_batch": 8,
        "iterations": 1,
        "local_batches": (1, 3, 4),
        "run_dir": str(tmp),
        "dtype": "float64",
        "lr": 1.0,
        "momentum": 0.0,
    }
    base.update(kw)
    return TrainPlan(**base)  # type: ignore[arg-type]


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def test_loss_scale_and_split() -> None:
    assert loss_scale((1, 3, 4), 0) == pytest.approx(3 * 1 / 8)
    assert sum(loss_scale((1, 3, 4), r) / 3 * 8 for r in range(3)) == pytest.approx(8)
    assert split_batch(10, 3) == (4, 3, 3)
    with pytest.raises(ConfigError, match="local_batches"):
        plan(Path("."), local_batches=(3, 4))


def test_reweighted_ddp_gradient_is_the_global_batch_gradient(
    tmp_path: Path, rank_pool: RankPool
) -> None:
    batches = (1, 3, 4)
    # One SGD step with lr=1 and no momentum: parameters move by exactly the gradient.
    reference = train_single(plan(tmp_path, local_batches=batches))
    p0 = train_single(plan(tmp_path, local_batches=batches), iterations=0)
    step = max(float((reference[k] - p0[k]).abs().max()) for k in p0)
    assert step > 1e-3  # the gradient is not trivially zero

    weighted = plan(tmp_path / "w", local_batches=batches)
    rank_pool.train(weighted)
    ck = load_checkpoint(weighted.checkpoint_path)
    assert ck is not None and ck.iteration == 1
    assert max_diff(ck.model, reference) < 1e-10

    plain = plan(tmp_path / "u", local_batches=batches, reweight=False)
    rank_pool.train(plain)
    ck_plain = load_checkpoint(plain.checkpoint_path)
    assert ck_plain is not None
    assert max_diff(ck_plain.model, reference) > 1e-4


def test_resume_on_another_world_size_matches_a_straight_run(
    tmp_path: Path, rank_pool: RankPool
) -> None:
    kw: dict[str, object] = {"lr": 0.05, "momentum": 0.9, "global_batch": 12}
    straight = train_single(plan(tmp_path, iterations=6, local_batches=(12,), **kw))
    first = plan(tmp_path / "run", iterations=3, local_batches=(4, 8), **kw)
    rank_pool.train(first)
    ck = load_checkpoint(first.checkpoint_path)
    assert ck is not None and ck.iteration == 3 and ck.samples == 36
    second = plan(tmp_path / "run", iterations=6, local_batches=(2, 5, 5), config_id="c1", **kw)
    rank_pool.train(second)
    ck = load_checkpoint(second.checkpoint_path)
    assert ck is not None and ck.iteration == 6 and ck.config_id == "c1"
    assert max_diff(ck.model, straight) < 1e-10
    # Not trivially equal: training moved the parameters.
    p0 = train_single(plan(tmp_path, local_batches=(12,), **kw), iterations=0)
    assert max_diff(ck.model, p0) > 1e-3


def test_resume_needs_the_same_global_batch(tmp_path: Path) -> None:
    # One rank in this process (no spawn): a checkpoint of global batch 8, a plan of 6.
    first = plan(tmp_path, local_batches=(8,))
    assert run_rank(first, 0, 1, "127.0.0.1", free_port()) == 0
    with pytest.raises(ConfigError, match="same global batch"):
        run_rank(plan(tmp_path, global_batch=6, local_batches=(6,)), 0, 1, "127.0.0.1", free_port())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lr", float("nan")),
        ("lr", 0.0),
        ("lr", "0.1"),
        ("momentum", 1.0),
        ("momentum", float("inf")),
        ("local_batches", [8.9, 7.1]),
        ("local_batches", "16"),
        ("iterations", True),
        ("iterations", 2.5),
        ("global_batch", float("nan")),
        ("threads", 0),
        ("timeout_s", -1),
        ("step_sleep_s", -0.5),
        ("reweight", "yes"),
    ],
)
def test_a_bad_plan_field_is_named(tmp_path: Path, field: str, value: object) -> None:
    good = {"model": "resnet18", "size": "tiny", "global_batch": 16, "iterations": 2,
            "local_batches": [8, 8], "run_dir": str(tmp_path)}  # fmt: skip
    TrainPlan.from_dict(good)
    with pytest.raises(ConfigError, match=field):
        TrainPlan.from_dict({**good, field: value})


def test_a_non_finite_loss_stops_the_job_and_keeps_the_last_finite_weights(
    tmp_path: Path,
) -> None:
    """A diverging run (a learning rate of 1e30): the built-in worker stops at the first
    non-finite loss with one clear reason for the monitor, and neither logs nor saves that
    step, so the checkpoint holds finite weights (issue 48 item 6, as scripts get)."""
    from srifty_core.runs.progress import read_progress, refused_report
    from srifty_core.worker.worker import NonFiniteLoss

    p = plan(tmp_path, local_batches=(8,), iterations=40, lr=1e30, checkpoint_every=1)
    with pytest.raises(NonFiniteLoss, match="not finite") as err:
        run_rank(p, 0, 1, "127.0.0.1", free_port())
    records = read_progress(p.progress_path)
    assert records and all(r.loss is None or math.isfinite(r.loss) for r in records)
    stopped_at = int(str(err.value).split("iteration ")[1].split(" ")[0])
    assert records[-1].iteration == stopped_at - 1
    ck = load_checkpoint(p.checkpoint_path)
    assert ck.iteration == stopped_at - 1
    assert all(bool(torch.isfinite(t).all()) for t in ck.model.values())
    assert refused_report(p.run_dir, p.config_id, since=0.0) == str(err.value)
