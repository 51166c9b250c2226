"""The GPU check's code path on the CPU (the real check needs an NVIDIA GPU): a tiny
profile (alone: it times this host), then the training runs of plans launched as torchrun
would, preempted and resumed, and the FSDP2 check."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _check(tmp_path: Path, *args: str) -> dict:
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "gpu_check.py"),
        *("--device", "cpu", "--out", str(tmp_path / "out"), *args),
    ]
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    return json.loads((tmp_path / "out" / "gpu_check.json").read_text())


@pytest.mark.alone
@pytest.mark.slow
def test_the_gpu_check_profiles_on_the_cpu(tmp_path: Path, data_dir: Path) -> None:
    """The profiling half: a tiny profile, its dense sweep and the 4-probe MAPE."""
    result = _check(
        tmp_path,
        *("--models", "resnet18", "--size", "tiny", "--max-batch", "16", "--precisions", "fp32"),
        *("--budget-s", "20", "--no-event-check", "--no-train", "--no-fsdp"),
    )
    [model] = result["models"]
    assert model["status"] == "ok" and model["eval"]["mape_iter_all"] >= 0
    assert (tmp_path / "out" / model["profile_file"]).exists()
    assert model["profile_file"].endswith("_resnet18_fp32.json")


@pytest.mark.slow
def test_the_gpu_check_trains_preempts_and_resumes_on_the_cpu(
    tmp_path: Path, data_dir: Path
) -> None:
    """The training half: the worker and the digits script each stopped by SIGTERM and
    resumed to exactly their iterations, and the FSDP2 check's DDP-vs-FSDP losses (gloo)."""
    result = _check(
        tmp_path,
        *("--models", "", "--size", "tiny", "--workdir", str(tmp_path / "runs")),
        *("--train-model", "resnet18", "--train-batch", "8", "--train-iterations", "9"),
        *("--train-precisions", "fp32", "--fsdp-model", "hf:gpt2", "--fsdp-size", "tiny"),
    )
    assert result["models"] == []
    runs = {r["name"]: r for r in result["train"]}
    assert set(runs) == {"worker_fp32", "digits_fp32"}
    for r in runs.values():
        assert r["status"] == "ok", r
        assert r["stopped"]["exit_code"] == 3 and r["resumed"]["exit_code"] == 0
        assert 0 < r["stopped"]["checkpoint_iteration"] < r["iterations"]
        assert r["records"] == r["iterations"] and r["each_iteration_once"]
    assert "on cpu (gloo)" in runs["worker_fp32"]["stopped"]["log_tail"]
    assert runs["digits_fp32"]["result"]["accuracy"] > 0.9
    fsdp = result["fsdp"]
    assert fsdp["same_training"]["ok"] and len(fsdp["rows"]) == 4


def test_the_estimate_is_scored_on_a_measured_profile_it_never_saw() -> None:
    """``gpu_check_estimate``: the cut leaves the measured GPU (or only its network there)
    out of the evidence, and the score is (estimate - measured) / measured at each dense
    batch, from the run of 2026-12-04 on an H200."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import gpu_check_estimate as ge

    from srifty_core.catalog import Catalog
    from srifty_core.predictors.roofline import Efficiencies, Roofline
    from srifty_core.profiling import estimate
    from srifty_core.profiling.profile import ComputeProfile

    catalog = Catalog.load()
    observations, _ = estimate.evidence(catalog, store=None)
    on_h200 = [o for o in observations if o.device.name == "H200"]
    assert on_h200 and any(o.census.model == "resnet50" for o in on_h200)
    no_device = ge.cut_evidence(observations, "H200", None)
    no_model = ge.cut_evidence(observations, "H200", "resnet50")
    assert not any(o.device.name == "H200" for o in no_device)
    assert any(o.device.name == "H200" for o in no_model)
    assert not any(o.device.name == "H200" and o.census.model == "resnet50" for o in no_model)
    assert len(ge.cut_evidence(observations, "", "")) == len(observations)

    run = json.loads((ge.RESULTS / "gpu_check.json").read_text())
    [m] = [m for m in run["models"] if m["profile_file"] == "h200_resnet50_fp32.json"]
    measured = ComputeProfile.from_json((ge.RESULTS / m["profile_file"]).read_text())
    roof = Roofline(Efficiencies(), 1, ("A100",), specs_cv=0.2, scaled_cv=0.2)
    c = ge.compare(measured, m["dense"], roof, catalog)
    meas = [f + b for f, b in zip(m["dense"]["fw_mean_s"], m["dense"]["bw_mean_s"], strict=True)]
    for e, p, t in zip(c["signed_err_pct"], c["estimated_iter_ms"], meas, strict=True):
        assert e == pytest.approx((p / 1e3 - t) / t * 100, abs=0.06)
    assert c["batches"][0] == 1 and 1 in c["launch_bound_batches"]
    assert 512 not in c["launch_bound_batches"]
    assert 0.0 <= c["p90_band_coverage"] <= 1.0
    assert c["memory"]["measured_b_max"] == 512 and c["memory"]["estimated_b_max"] > 0
