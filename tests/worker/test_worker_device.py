"""The worker's device choice (CUDA + NCCL with one rank per GPU, else CPU + gloo) and
mixed precision, tested without a GPU: ``choose_device`` and ``choose_precision`` are pure,
``run_rank``'s CUDA wiring is checked with CUDA faked, and the autocast / GradScaler step
runs on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from srifty_core.errors import ConfigError
from srifty_core.lifetime import free_port
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.worker import worker
from srifty_core.worker.checkpoint import load_checkpoint
from srifty_core.worker.worker import (
    choose_device,
    choose_precision,
    local_batch,
    place,
    run_rank,
    train_step,
)
from srifty_core.workloads.zoo import build


def plan(tmp: Path, **kw: object) -> TrainPlan:
    base: dict[str, object] = {
        "model": "dlrm",
        "size": "tiny",
        "global_batch": 8,
        "iterations": 2,
        "local_batches": (8,),
        "run_dir": str(tmp),
        "lr": 0.5,
        "momentum": 0.0,
    }
    base.update(kw)
    return TrainPlan(**base)  # type: ignore[arg-type]


TORCHRUN_8_GPU_VM = {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}


def test_torchrun_on_a_gpu_vm_puts_each_rank_on_its_local_gpu_with_nccl() -> None:
    p = choose_device(TORCHRUN_8_GPU_VM, cuda_available=True, cuda_devices=8)
    assert (p.rank, p.world_size, p.local_rank, p.local_world_size) == (11, 16, 3, 8)
    assert (p.device, p.backend, p.is_cuda, p.note) == ("cuda:3", "nccl", True, "")
    assert p.torch_device == torch.device("cuda", 3)
    assert choose_device(TORCHRUN_8_GPU_VM, "cuda", cuda_available=True, cuda_devices=8) == p


def test_without_cuda_every_rank_runs_on_the_cpu_with_gloo() -> None:
    for gpus in (0, 8):  # no CUDA runtime: the device count does not matter
        p = choose_device(TORCHRUN_8_GPU_VM, cuda_available=False, cuda_devices=gpus)
        assert (p.device, p.backend, p.is_cuda, p.note) == ("cpu", "gloo", False, "")
        assert p.local_rank == 3
    with pytest.raises(ConfigError, match="one GPU per rank"):
        choose_device(TORCHRUN_8_GPU_VM, "cuda", cuda_available=False, cuda_devices=0)


def test_the_plan_can_keep_a_gpu_host_on_the_cpu() -> None:
    p = choose_device(TORCHRUN_8_GPU_VM, "cpu", cuda_available=True, cuda_devices=8)
    assert (p.device, p.backend) == ("cpu", "gloo")


def test_fewer_gpus_than_ranks_on_a_host() -> None:
    # auto: every rank of the host falls back to the CPU alike (never a mix of backends)
    for local in range(8):
        env = {**TORCHRUN_8_GPU_VM, "LOCAL_RANK": str(local)}
        p = choose_device(env, cuda_available=True, cuda_devices=4)
        assert (p.device, p.backend) == ("cpu", "gloo")
        assert "8 ranks on this host but 4 GPU(s)" in p.note
    with pytest.raises(ConfigError, match=r"8 rank.* on this host, 4 GPU"):
        choose_device(TORCHRUN_8_GPU_VM, "cuda", cuda_available=True, cuda_devices=4)


def test_a_plain_launcher_puts_every_rank_on_this_host() -> None:
    # The local provider sets LOCAL_RANK per instance (0 for each one-rank instance) but
    # no LOCAL_WORLD_SIZE: the ranks share this host, so rank r takes GPU r.
    env = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0"}
    p = choose_device(env, cuda_available=True, cuda_devices=4)
    assert (p.local_rank, p.local_world_size, p.device, p.backend) == (2, 4, "cuda:2", "nccl")
    assert choose_device(env, cuda_available=True, cuda_devices=2).device == "cpu"
    single = choose_device({"RANK": "0", "WORLD_SIZE": "1"}, cuda_available=True, cuda_devices=1)
    assert single.device == "cuda:0"


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"WORLD_SIZE": "2"}, "RANK is not set"),
        ({"RANK": "0"}, "WORLD_SIZE is not set"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK: a whole number"),
        ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK: must be >= 0"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "not in a world"),
        ({"RANK": "0", "WORLD_SIZE": "0"}, "not in a world"),
        ({**TORCHRUN_8_GPU_VM, "LOCAL_RANK": "8"}, "LOCAL_RANK 8 of LOCAL_WORLD_SIZE 8"),
        ({**TORCHRUN_8_GPU_VM, "LOCAL_WORLD_SIZE": "32"}, "does not fit a world of 16"),
    ],
)
def test_a_bad_launcher_environment_is_named(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        choose_device(env, cuda_available=True, cuda_devices=8)


def test_an_unknown_device_is_named() -> None:
    with pytest.raises(ConfigError, match="device"):
        choose_device(TORCHRUN_8_GPU_VM, "tpu", cuda_available=True, cuda_devices=8)


@pytest.mark.parametrize(
    ("asked", "device", "bf16_everywhere", "runs"),
    [
        ("fp32", "cuda", True, "fp32"),
        ("fp16", "cuda", True, "fp16"),
        ("fp16", "cuda", False, "fp16"),
        ("bf16", "cuda", True, "bf16"),
        ("bf16", "cuda", False, "fp16"),  # a GPU without bf16 somewhere: fp16 + scaler on all
        ("fp16", "cpu", True, "fp32"),  # the CPU path computes in the plan's dtype
        ("bf16", "cpu", True, "fp32"),
    ],
)
def test_choose_precision(asked: str, device: str, bf16_everywhere: bool, runs: str) -> None:
    assert choose_precision(asked, device, bf16_everywhere) == runs


def test_plan_device_and_precision_fields(tmp_path: Path) -> None:
    p = plan(tmp_path)
    assert (p.device, p.precision) == ("auto", "fp32")
    # a plan written before these fields existed still loads, with the defaults
    old = {k: v for k, v in p.to_dict().items() if k not in ("device", "precision")}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert TrainPlan.load(tmp_path / "old.json") == p
    q = plan(tmp_path, device="cuda", precision="bf16")
    assert TrainPlan.load(q.save(tmp_path / "q.json")) == q
    with pytest.raises(ConfigError, match="device"):
        plan(tmp_path, device="gpu")
    with pytest.raises(ConfigError, match="precision"):
        plan(tmp_path, precision="fp8")
    with pytest.raises(ConfigError, match=r"precision: fp16 .* float64"):
        plan(tmp_path, precision="fp16", dtype="float64")


def _one_step(p: TrainPlan, precision: str, scaler: torch.amp.GradScaler | None) -> Any:
    w = build(p.model, p.size, seed=p.seed)
    opt = torch.optim.SGD(w.module.parameters(), lr=p.lr)
    before = {k: v.clone() for k, v in w.module.state_dict().items()}
    train_step(w, local_batch(w, p, 0, 0), opt, 1.0, precision, scaler)
    return before, w.module.state_dict()


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_mixed_precision_step_is_close_to_the_fp32_step(tmp_path: Path, precision: str) -> None:
    p = plan(tmp_path)
    before, exact = _one_step(p, "fp32", None)
    scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
    _, mixed = _one_step(p, precision, scaler)
    moved = max(float((exact[k] - before[k]).abs().max()) for k in before)
    off = max(float((exact[k] - mixed[k]).abs().max()) for k in before)
    assert moved > 1e-3 and off < 0.05 * moved
    assert all(v.dtype == torch.float32 for v in mixed.values() if v.is_floating_point())


def test_the_scaler_skips_a_step_whose_fp16_gradients_overflow(tmp_path: Path) -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**100)
    before, after = _one_step(plan(tmp_path), "fp16", scaler)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert scaler.get_scale() < 2.0**100


def test_run_rank_wires_a_gpu_rank_to_its_device_and_nccl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: dict[str, Any] = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))
    monkeypatch.setattr(
        worker.dist, "init_process_group", lambda backend, **kw: calls.update(backend=backend)
    )
    monkeypatch.setattr(worker.dist, "destroy_process_group", lambda: calls.update(destroyed=1))

    def fake_train(p: TrainPlan, rank: int, world: int, device: torch.device) -> int:
        calls.update(rank=rank, world=world, device=device)
        return 0

    monkeypatch.setattr(worker, "train", fake_train)
    monkeypatch.setenv("LOCAL_RANK", "5")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    p = plan(tmp_path, global_batch=16, local_batches=(1,) * 16)
    assert run_rank(p, 13, 16, "127.0.0.1", 1) == 0
    assert calls == {
        "set_device": 5,
        "backend": "nccl",
        "rank": 13,
        "world": 16,
        "device": torch.device("cuda", 5),
        "destroyed": 1,
    }
    # the plan can keep it on the CPU: gloo, no set_device
    calls.clear()
    assert run_rank(TrainPlan.from_dict({**p.to_dict(), "device": "cpu"}), 13, 16, "h", 1) == 0
    assert calls["backend"] == "gloo" and calls["device"] == torch.device("cpu")
    assert "set_device" not in calls


def test_place_reads_the_local_rank_from_the_environment(tmp_path: Path) -> None:
    p = plan(tmp_path, global_batch=16, local_batches=(2,) * 8)
    where = place(p, 6, 8, {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4", "RANK": "99"})
    assert (where.rank, where.local_rank, where.local_world_size) == (6, 2, 4)


def test_mixed_precision_asked_on_the_cpu_trains_exactly_as_fp32(tmp_path: Path) -> None:
    # One rank in this process: the bf16 agreement allreduce runs on gloo, then the CPU
    # path computes in float32 and lands on the same bits as an fp32 plan.
    runs = {}
    for precision in ("fp32", "bf16", "fp16"):
        p = plan(tmp_path / precision, precision=precision, device="cpu")
        assert run_rank(p, 0, 1, "127.0.0.1", free_port()) == 0
        ck = load_checkpoint(p.checkpoint_path)
        assert ck is not None and ck.iteration == 2
        runs[precision] = ck.model
    for precision in ("bf16", "fp16"):
        assert all(torch.equal(runs[precision][k], runs["fp32"][k]) for k in runs["fp32"])


def test_the_fp16_loss_scale_survives_a_checkpoint(tmp_path: Path) -> None:
    """A resumed fp16 run continues with the loss scale it had reached (not 65536 again,
    which would skip steps until it relearned it)."""
    import torch

    from srifty_core.worker.checkpoint import load_checkpoint, save_checkpoint

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(torch.ones(()))  # the scale exists from the first scaled loss
    scaler.update(new_scale=512.0)
    path = save_checkpoint(
        tmp_path / "checkpoint.pt",
        model=model,
        optimizer=opt,
        iteration=3,
        global_batch=4,
        config_id="c0",
        scaler=scaler,
    )
    ck = load_checkpoint(path)
    assert ck is not None and ck.scaler is not None
    resumed = torch.amp.GradScaler("cpu")
    resumed.load_state_dict(ck.scaler)
    assert resumed.get_scale() == 512.0
    plain = save_checkpoint(
        tmp_path / "fp32.pt", model=model, optimizer=opt, iteration=3, global_batch=4,
        config_id="c0",
    )  # fmt: skip
    again = load_checkpoint(plain)
    assert again is not None and again.scaler is None
