"""`srifty plan` end to end: a request file, profiles and probes in the data folder."""

from __future__ import annotations

import dataclasses
import json
import shlex
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from srifty_core.cli import main
from srifty_core.cli.parser import build_parser
from srifty_core.probing.store import records_to_table, write_partition
from srifty_core.profiling.store import ProfileStore
from tests.probing.rows import make_rows
from tests.profiling.test_profile_contract import make_profile
from tests.simulator.test_estimator import steady


def _probes(instance_type: str, gpu: str, scale: float) -> list[dict[str, Any]]:
    rows = []
    for world in (2, 4, 8, 16):
        for size in (1024, 1024**2, 64 * 1024**2):
            for c in (1, 2):
                r = make_rows(1, provider="ec2-emulated", instance_type=instance_type)[0]
                t = (50e-6 + size / (scale * 1e9)) * c
                r |= {
                    "cloud": "aws", "region": "us-east-1", "zone": "use1-az1", "gpu_model": gpu,
                    "gpus_per_vm": 1, "world_size": world, "buffer_bytes": size, "concurrent": c,
                    "backend": "nccl", "time_s": t, "busbw": 2 * size * (world - 1) / (world * t),
                }  # fmt: skip
                rows.append(r)
    return rows


@pytest.fixture
def planning_data(data_dir: Path) -> Path:
    return write_planning_data(data_dir)


@pytest.fixture(scope="module")
def warm_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data folder as a first `srifty plan` leaves it, made once for the module: the
    model fitted on the shipped public nccl-tests tables (``public_model``'s cache), the
    MLflow store created (where a plan looks for a champion) and the roofline fitted on
    the shipped evidence (the store's ``roofline.json``). Each is a few seconds of CPU the
    tests below would otherwise pay again, each in its fresh data folder."""
    from srifty_core import paths
    from srifty_core.catalog import Catalog
    from srifty_core.planner.job import public_bandwidth
    from srifty_core.profiling.estimate import roofline_for
    from srifty_core.tracking.store import resolve_tracking_uri

    root = tmp_path_factory.mktemp("warm-data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(paths.ENV_VAR, str(root))
        mp.setenv("MLFLOW_TRACKING_URI", "")
        public_bandwidth()
        resolve_tracking_uri()
        roofline_for(Catalog.load(), ProfileStore())
    assert (root / "profiles" / "roofline.json").is_file()
    return root


@pytest.fixture
def warm(data_dir: Path, warm_template: Path) -> Path:
    """This test's data folder, started from ``warm_template``: the plan reads what a
    first plan kept (the same fits, from the folder's caches)."""
    import shutil

    shutil.copytree(warm_template, data_dir, dirs_exist_ok=True)
    return data_dir


def write_planning_data(data_dir: Path) -> Path:
    """Two profiles and two types' probes in ``data_dir`` (the current data folder), and
    a request for them; returns the request's path."""
    store = ProfileStore()
    store.save(dataclasses.replace(steady(make_profile(), "T4"), model="m", size="full"))
    store.save(dataclasses.replace(steady(make_profile(), "M60", 2.0), model="m", size="full"))
    for t, gpu, scale in (("g4dn.xlarge", "T4", 1.0), ("g3.4xlarge", "M60", 0.5)):
        write_partition(
            records_to_table(_probes(t, gpu, scale)),
            day=date(2026, 3, 1),
            provider="ec2-emulated",
            instance_type=t,
        )
    req = {
        "model": "m",
        "region": "us-east-1",
        "global_batch": 512,
        "iterations": 500,
        "time_limit_s": 3600,
        "budget_usd": 20,
        "objective": "cost",
        "offers": [
            {"type": "g4dn.xlarge", "market": "spot", "quota": 8},
            {"type": "g3.4xlarge", "market": "on-demand", "quota": 8},
        ],
    }
    path = data_dir / "req.yaml"
    path.write_text(yaml.safe_dump(req))
    return path


def test_plan_prints_the_choice_and_draws_the_frontier(
    planning_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "f.png"
    assert main(["plan", str(planning_data), "--bandwidth", "probes", "--frontier", str(png)]) == 0
    out = capsys.readouterr().out
    assert "objective: minimize cost" in out and "frontier" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_json(planning_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(planning_data), "--bandwidth", "probes", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["feasible"] and d["best"]["cost_usd"] <= 20
    assert sum(g["count"] * g["batch_per_vm"] for g in d["best"]["groups"]) == 512
    assert (
        main(["plan", str(planning_data), "--json", "--estimator", "apm", "--bandwidth", "probes"])
        == 0
    )


def test_plan_json_with_the_ilp_is_json_alone(planning_data: Path) -> None:
    # a fresh process: HiGHS prints its banner once, from native code, on first use
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [
            *(sys.executable, "-m", "srifty_core.cli", "plan", str(planning_data)),
            *("--bandwidth", "probes", "--json", "--method", "ilp"),
        ],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=True,
    ).stdout
    assert json.loads(out)["feasible"]


def test_impossible_limits_exit_1(planning_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = yaml.safe_load(planning_data.read_text()) | {"time_limit_s": 10}
    planning_data.write_text(yaml.safe_dump(req))
    assert main(["plan", str(planning_data), "--bandwidth", "probes"]) == 1
    assert "No configuration meets the limits" in capsys.readouterr().out


def test_bad_request_files(planning_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    req = yaml.safe_load(planning_data.read_text())
    planning_data.write_text(yaml.safe_dump(req | {"global_bach": 5}))
    assert main(["plan", str(planning_data)]) == 2
    assert "unknown request field 'global_bach'" in capsys.readouterr().err
    planning_data.write_text(yaml.safe_dump(req | {"offers": [{"type": "g4dn.xlarg"}]}))
    assert main(["plan", str(planning_data)]) == 2
    assert "did you mean 'g4dn.xlarge'" in capsys.readouterr().err
    planning_data.write_text(yaml.safe_dump(req | {"model": "nowhere/net.py:build"}))
    assert main(["plan", str(planning_data)]) == 2
    err = capsys.readouterr().err
    assert "no compute profile for nowhere/net.py:build/full on T4" in err
    assert "no estimate either" in err and "nowhere/net.py" in err


def test_a_gpu_nobody_profiled_is_planned_on_an_estimate_that_says_so(
    warm: Path, planning_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No vgg16 profile of T4 or M60 in the store: the shipped census and the GPUs' sheets
    give one (scaled from the shipped H200 profile of vgg16), and the plan says so, in
    the text and in JSON, with a p90 wider than the same plan's on measured profiles."""
    req = yaml.safe_load(planning_data.read_text())
    planning_data.write_text(yaml.safe_dump(req | {"model": "vgg16", "size": "full"}))
    assert main(["plan", str(planning_data), "--bandwidth", "probes", "--json"]) in (0, 1)
    out = json.loads(capsys.readouterr().out)
    best = out["best"] or out["nearest_misses"][0]
    assert any(
        e.startswith(("T4: scaled from H200", "M60: scaled from H200"))
        for e in best["compute_estimated"]
    )
    assert best["time_at_risk_s"] > best["time_s"]
    main(["plan", str(planning_data), "--bandwidth", "probes"])
    line = next(x for x in capsys.readouterr().out.splitlines() if "Compute estimated" in x)
    command = line.split("`")[1]  # what to run to plan on measurements: it parses
    args = build_parser().parse_args(shlex.split(command)[1:])
    assert args.model == "vgg16" and args.provider == "ec2"
    assert set(args.instance_type) <= {"g4dn.xlarge", "g3.4xlarge"}


def test_champion_is_the_default_and_its_absence_is_explained(
    warm: Path, planning_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No champion yet: the plan uses the model fitted on the shipped public nccl-tests
    tables and says why, naming the command that makes a champion."""
    assert main(["plan", str(planning_data)]) in (0, 1)
    out = capsys.readouterr().out
    assert "shipped public nccl-tests tables" in out
    assert "srifty fit-bandwidth" in out


@pytest.mark.slow
def test_the_readme_model_larger_than_one_gpu_plans_sharded_and_writes_its_strategy(
    warm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's GPT-2 XL request as written: a sharded plan, and `--write-plan` hands
    the strategy to the trainer (hsdp with the VM's ranks as its shard group)."""
    import re

    from srifty_core import paths
    from srifty_core.planner.schema.train_plan import TrainPlan

    readme = (paths.REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("**A model larger than one GPU.**") :]
    request = tmp_path / "gpt2-xl.yaml"
    request.write_text(re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0])
    out = tmp_path / "plan.json"
    assert main(["plan", str(request), "--write-plan", str(out)]) == 0
    said = capsys.readouterr().out
    strategy = re.search(r"Strategy (\w+) over (\d+) ranks", said)
    assert strategy is not None and strategy[1] in ("fsdp", "hsdp"), said
    assert "ddp: no offered GPU holds the model's training state" in said
    plan = TrainPlan.load(str(out))
    assert plan.strategy == strategy[1] and plan.world_size == int(strategy[2])
    if plan.strategy == "hsdp":
        assert 1 < plan.ranks_per_vm < plan.world_size
    # the plan the README names, in its micro-batches: one VM's GPUs in micro-batches
    # beat two VMs in one pass (the sharded search on fewer VMs, planner.strategies)
    named = re.search(r"answers `(\S+)`\s+with \"Strategy (\w+)", section)
    assert named is not None and said.startswith(named[1] + "/"), said
    assert named[2] == plan.strategy
    k = re.search(r"\d+ micro-batches per step on \d+ \S+, fewer than hold", said)
    assert k is not None and k[0] in " ".join(section.split()), said
    assert plan.micro_batches == int(k[0].split()[0]) and plan.sync_each_micro_batch


@pytest.mark.slow
def test_the_readme_model_in_bf16_true_fits_one_gpu_so_ddp_is_feasible(
    warm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's GPT-2 XL request with `precision: bf16-true`: 2-byte parameters,
    gradients and AdamW states (11.6 GiB) fit an A10G, so ddp is feasible (it was not in
    autocast), from the shipped bf16-true census (nothing counted); the plan is one VM's
    GPUs and the written plan keeps its precision and strategy."""
    import re

    from srifty_core import paths
    from srifty_core.planner.schema.train_plan import TrainPlan

    readme = (paths.REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("**A model larger than one GPU.**") :]
    text = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0]
    assert "precision: bf16\n" in text and "bf16-true" in section
    request = tmp_path / "gpt2-xl.yaml"
    request.write_text(text.replace("precision: bf16\n", "precision: bf16-true\n"))
    out = tmp_path / "plan.json"
    assert main(["plan", str(request), "--write-plan", str(out)]) == 0
    said = capsys.readouterr().out
    assert "no offered GPU holds" not in said, said
    strategy = re.search(r"Strategy (\w+) over (\d+) ranks", said)
    assert strategy is not None, said
    # ddp chosen, or compared with the sharded plan that won (the README says which)
    assert strategy[1] == "ddp" or "than the best ddp plan" in said, said
    assert f"`1xg5.12xlarge` with {strategy[1]}" in section, said
    assert said.startswith("1xg5.12xlarge/"), said  # the plan the README names
    plan = TrainPlan.load(str(out))
    assert plan.strategy == strategy[1] and plan.precision == "bf16-true"
    assert plan.world_size == int(strategy[2]) <= 4  # one g5.12xlarge
    assert not list(paths.profiles_dir().glob("hf-gpt2-xl-*/full/census*")), "counted anew"


@pytest.mark.slow
def test_the_readme_modern_decoder_is_counted_on_meta_and_planned_sharded(
    warm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's Llama 3 8B request as written (and T4s offered beside): its census
    (grouped-query attention, 8 B parameters) is counted here on meta and kept, and the
    plan is the README's: one p5.48xlarge under fsdp in micro-batches, each reduce-scattering
    its gradients, ddp refused for its state. In autocast bf16, where holding the unsharded
    gradients leaves no room, the README's plan in that mode."""
    import re

    from srifty_core import paths
    from srifty_core.planner.schema.train_plan import TrainPlan

    readme = (paths.REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("**A modern decoder.**") :]
    request = tmp_path / "llama.yaml"
    text = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0]
    # and T4s, where not even a sample's activations fit: estimated at B_max 0, not refused
    request.write_text(text + "  - {type: g4dn.12xlarge, market: on-demand, quota: 4}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", str(request), "--write-plan", str(out)]) == 0
    said = capsys.readouterr().out
    best = said.splitlines()[0].split(":")[0]
    strategy = re.search(r"Strategy (\w+) over (\d+) ranks", said)
    k = re.search(r"(\d+) micro-batches per step", said)
    assert strategy is not None and k is not None, said
    assert f"`{best.split('/')[0]}` with {strategy[1]} over its {strategy[2]} H100s in {k[1]}" in (
        " ".join(section.split())
    ), said
    assert "ddp: no offered GPU holds the model's training state" in said
    plan = TrainPlan.load(str(out))
    assert (plan.strategy, plan.precision, plan.micro_batches) == (
        strategy[1],
        "bf16-true",
        int(k[1]),
    )
    assert plan.sync_each_micro_batch and "each reduce-scattering its gradients" in said
    (census,) = paths.profiles_dir().glob("hf-llama-3-8b-*/full/census*")  # counted, kept
    counted = json.loads(census.read_text())
    assert counted["n_parameters"] == 8_030_261_248 and counted["device"] == "meta"
    request.write_text(request.read_text().replace("bf16-true", "bf16"))
    assert main(["plan", str(request), "--write-plan", str(out)]) == 0
    said = capsys.readouterr().out
    best = said.splitlines()[0].split(":")[0].split("/")[0]
    k = re.search(r"(\d+) micro-batches per step", said)
    assert k is not None and "each reduce-scattering its gradients" in said, said
    assert f"`{best}` in {k[1]} micro-batches" in " ".join(section.split()), said
    plan = TrainPlan.load(str(out))
    assert plan.precision == "bf16" and plan.sync_each_micro_batch


@pytest.mark.slow
def test_a_global_batch_held_only_in_micro_batches_writes_them_to_the_plan(
    warm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's GPT-2 XL request with a global batch of 2048: the quotas hold a few
    hundred samples at once, so the plan accumulates gradients, says so, and
    `--write-plan` hands its micro-batches to the trainer."""
    import re

    from srifty_core import paths
    from srifty_core.planner.schema.train_plan import TrainPlan

    readme = (paths.REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("**A model larger than one GPU.**") :]
    text = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0]
    request = tmp_path / "gpt2-xl.yaml"
    request.write_text(text.replace("global_batch: 32", "global_batch: 2048"))
    out = tmp_path / "plan.json"
    assert main(["plan", str(request), "--write-plan", str(out)]) == 0
    said = capsys.readouterr().out
    k = re.search(r"(\d+) micro-batches per step", said)
    assert k is not None and int(k[1]) > 1 and "Gradient accumulation" in said, said
    plan = TrainPlan.load(str(out))
    assert plan.micro_batches == int(k[1]) and plan.global_batch == 2048


@pytest.mark.slow
def test_the_readme_long_sequence_request_plans_at_its_length(
    warm: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's request with `model: hf:opt-125m,seq=2048`: planned from the census
    counted at 2048 tokens (small local batches), and the written plan keeps the length."""
    import re

    from srifty_core import paths
    from srifty_core.planner.schema.train_plan import TrainPlan

    readme = (paths.REPO_ROOT / "README.md").read_text()
    said_there = readme[readme.index("**Long sequences.**") :].split("\n\n")[0]
    section = readme[readme.index("**A model larger than one GPU.**") :]
    text = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)[0]
    text = re.sub(r"model: \S+", "model: hf:opt-125m,seq=2048", text)
    assert "model: hf:opt-125m,seq=2048" in text and "hf:opt-125m,seq=2048" in said_there
    request = tmp_path / "opt.yaml"
    request.write_text(text)
    out = tmp_path / "plan.json"
    assert main(["plan", str(request), "--write-plan", str(out)]) == 0
    said = capsys.readouterr().out
    assert "--model hf:opt-125m,seq=2048" in said  # the profiling hint keeps the length
    plan = TrainPlan.load(str(out))
    at_once = -(-max(plan.local_batches) // plan.micro_batches)  # a GPU's samples at once
    most = re.search(r"at most (\d+) samples an A10G holds at once", said_there)
    assert most is not None and int(most[1]) < 16  # 2048 tokens: a few samples, not 148
    assert plan.model == "hf:opt-125m,seq=2048" and at_once <= int(most[1]), said
