"""``benchmarks/gpu_op_split.py`` on the CPU (the real check needs a GPU): a step's
operator time by census class is measured and written, and bad arguments are one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from srifty_core import paths

MLP = "tests/workload_fixtures/factories.py:sized"


def _bench() -> ModuleType:
    path = paths.REPO_ROOT / "benchmarks" / "gpu_op_split.py"
    spec = importlib.util.spec_from_file_location("bench_gpu_op_split", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_split_is_measured_by_class_and_written(tmp_path: Path) -> None:
    bench = _bench()
    argv = ["--device", "cpu", "--models", MLP, "--size", "small", "--batch", "8"]
    assert bench.main([*argv, "--steps", "2", "--warmup", "1", "--out", str(tmp_path)]) == 0
    [rec] = json.loads((tmp_path / "op_split.json").read_text())
    assert rec["status"] == "ok" and rec["device_type"] == "cpu"
    # one step's products, averaged over the two timed: 2 forward, 3 backward (no input
    # gradient for the first layer); times are not compared (this host's noise decides them)
    assert rec["measured_ms"]["matmul"] > 0 and rec["measured_ops"]["matmul"] == 5
    assert set(rec["measured_ms"]) == {"conv", "matmul", "other", "norm"}
    assert min(rec["measured_ms"].values()) >= 0 and rec["step_ms_wall"] > 0
    assert rec["predicted_ms"] is None  # no sheet for a CPU


def test_a_model_that_fails_is_recorded_and_bad_arguments_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = _bench()
    out = str(tmp_path)
    argv = ["--device", "cpu", "--size", "small", "--steps", "1", "--warmup", "0", "--out", out]
    assert bench.main([*argv, "--models", f"{MLP},no_such_model"]) == 1
    ok, failed = json.loads((tmp_path / "op_split.json").read_text())
    assert ok["status"] == "ok" and failed["status"] == "failed" and failed["error"]
    with pytest.raises(SystemExit) as bad:
        bench.main([*argv, "--models", MLP, "--precision", "bf17"])
    assert bad.value.code == 2
    assert "precision: must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit) as zero:
        bench.main([*argv, "--models", MLP, "--batch", "0"])
    assert zero.value.code == 2
    if not __import__("torch").cuda.is_available():
        with pytest.raises(SystemExit) as gpu:
            bench.main([*argv[2:], "--models", MLP])  # --device cuda, the default
        assert gpu.value.code == 2 and "no CUDA device" in capsys.readouterr().err
