"""`srifty train PLAN.json` checks the plan against this machine before any rank starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.host_allocator import available_bytes
from srifty_core.jobs.preflight import (
    GIB,
    Host,
    RankMemory,
    _gpus,
    plan_problems,
    rank_memory,
)
from srifty_core.planner.schema.train_plan import TrainPlan

GPU_VMS = {
    "launches": [
        {"instance_type": "p3.8xlarge", "market": "spot", "count": 2, "ranks_per_vm": 4,
         "batch_per_rank": 128},
    ]
}  # fmt: skip
CPU_BOX = Host(cores=2, memory_available_bytes=22 * GIB, gpus=0)


def resnet_for_gpu_vms(run_dir: Path) -> TrainPlan:
    """The issue's plan: ResNet-50 made for two p3.8xlarge, 8 ranks at batch 128."""
    return TrainPlan(
        model="resnet50", size="full", global_batch=1024, iterations=100,
        local_batches=(128,) * 8, run_dir=str(run_dir), extra=GPU_VMS,
    )  # fmt: skip


def test_a_plan_for_gpu_vms_does_not_fit_a_cpu_machine_and_says_why(tmp_path: Path) -> None:
    plan = resnet_for_gpu_vms(tmp_path / "run")
    memory = rank_memory(plan)  # the shipped reference profile of ResNet-50
    assert memory is not None and memory.at(128) > 5 * GIB
    made_for, cores, ram = plan_problems(plan, CPU_BOX, memory)
    assert "made for GPU VMs (2 x p3.8xlarge, 8 GPU(s))" in made_for and "no GPU" in made_for
    assert cores == "8 CPU ranks x 1 thread(s) on 2 core(s) (at most 4 here)"
    assert ram.startswith("about ") and "22.0 GiB available" in ram
    # on the machine it was made for (its ranks run on GPUs) it fits
    assert plan_problems(plan, Host(cores=32, memory_available_bytes=None, gpus=8)) == []
    # with one GPU short, the ranks would run on the CPU
    assert len(plan_problems(plan, Host(cores=64, memory_available_bytes=None, gpus=7))) == 1


def test_ranks_against_cores_and_memory() -> None:
    def plan(batches: tuple[int, ...], threads: int = 1) -> TrainPlan:
        return TrainPlan(model="dlrm", size="tiny", global_batch=sum(batches), iterations=1,
                         local_batches=batches, run_dir="run", threads=threads)  # fmt: skip

    assert plan_problems(plan((2,) * 4), CPU_BOX) == []  # two per core: slower, allowed
    assert plan_problems(plan((2,) * 5), CPU_BOX) != []
    assert plan_problems(plan((2, 2), threads=3), CPU_BOX) != []
    per_rank = RankMemory(fixed_bytes=1 * GIB, per_sample_bytes=1 * GIB, source="p")
    assert plan_problems(plan((10, 10)), CPU_BOX, per_rank) == []  # 22 GiB: just fits
    assert plan_problems(plan((10, 11)), CPU_BOX, per_rank) != []
    assert plan_problems(plan((10, 11)), Host(2, None, 0), per_rank) == []  # unknown: no check


def test_this_machines_memory_and_gpus_are_read_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   2048 kB\n")
    assert available_bytes(meminfo) == 2048 * 1024
    assert available_bytes(tmp_path / "none") is None
    driver = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (driver / bus).mkdir(parents=True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert _gpus(driver) == 2 and _gpus(tmp_path / "none") == 0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert _gpus(driver) == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert _gpus(driver) == 0


def test_srifty_train_refuses_a_plan_for_gpu_vms_in_one_line_unless_forced(
    tmp_path: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({
        "model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 2,
        "local_batches": [2, 2], "run_dir": str(tmp_path / "run"), "device": "cpu",
        "extra": {"launches": [{"instance_type": "g5.xlarge", "count": 2}]},
    }))  # fmt: skip
    script = [sys.executable, "-c", "pass"]  # exits 0 at once: nothing to train here
    assert main(["train", str(plan), "--no-progress", "--", *script]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"srifty: error: {plan}: it was made for")
    assert "2 x g5.xlarge, 2 GPU(s)" in err and "--force" in err
    assert not list((data_dir / "cloud").rglob("*.json"))  # nothing was launched
    # forced, it trains (the built-in worker: a script must report what it trains); on one
    # rank of one such VM here, as the refusal is the subject, not the ranks
    plan.write_text(json.dumps({
        "model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 2,
        "local_batches": [4], "run_dir": str(tmp_path / "run"), "device": "cpu",
        "extra": {"launches": [{"instance_type": "g5.xlarge", "count": 1}]},
    }))  # fmt: skip
    assert main(["train", str(plan), "--no-progress", "--no-mlflow", "--force"]) == 0
    out, err = capsys.readouterr()
    assert err.startswith(f"srifty: warning: {plan}: it was made for GPU VMs")
    assert "finished" in out
    assert main(["train", "--job", str(plan), "--force"]) == 2
    assert "--force: only with a plan file" in capsys.readouterr().err
