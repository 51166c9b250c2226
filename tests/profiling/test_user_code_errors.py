"""A model's own code failing under `srifty profile` (issue 48): one line naming the model
and where, not a traceback, and never a silent exit 0; a factory that hangs says so."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.console import still_running
from srifty_core.errors import ConfigError
from srifty_core.profiling import profiler

MODELS = """
import torch
from srifty_core.workloads import Parts


def _batch(b, g):
    return torch.randn(b, 8, generator=g), torch.randn(b, 1, generator=g)


class Broken(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 1)

    def forward(self, x):
        return self.lin(x.view(-1, 9))


def forward_fails():
    return Parts(Broken(), _batch, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean())


def no_grad():
    lin = torch.nn.Linear(8, 1)
    return Parts(lin, _batch, lambda m, b: ((m(b[0]).detach() - b[1]) ** 2).mean())


def interrupted():
    raise KeyboardInterrupt


def fine():
    return Parts(torch.nn.Linear(8, 1), _batch, lambda m, b: ((m(b[0]) - b[1]) ** 2).mean())
"""

QUICK = ["--size", "tiny", "--no-mlflow", "--max-batch", "4", "--batch-sizes", "1,4",
         "--repeats", "2", "--warmup", "0", "--refine", "0", "--threads", "1",
         "--share-host", "1"]  # fmt: skip


@pytest.fixture
def models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text(MODELS)
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(0)\n\ndef build():\n    pass\n")
    return tmp_path


def _one_line(err: str) -> str:
    (line,) = err.strip().splitlines()
    return line


def test_a_forward_pass_that_fails_is_one_line_naming_the_model_and_where(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """143 lines of traceback before."""
    assert main(["profile", "--model", "models.py:forward_fails", *QUICK]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("srifty: error: model: models.py:forward_fails: a training step")
    assert "RuntimeError" in line and "(models.py:16, in forward)" in line


def test_a_loss_without_a_gradient_is_one_line_saying_so(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["profile", "--model", "models.py:no_grad", *QUICK]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "models.py:no_grad" in line and "does not require grad" in line
    assert "not detached, not under torch.no_grad" in line


def test_sys_exit_at_import_is_an_error_not_a_silent_success(
    models: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``sys.exit(0)`` in the model's file ended `srifty profile` with exit 0 and no
    profile."""
    assert main(["profile", "--model", "exits.py:build", *QUICK]) == 2
    line = _one_line(capsys.readouterr().err)
    assert "exits.py:build" in line and "sys.exit(0) called" in line
    assert not list(models.rglob("*.json"))


def test_a_slow_build_says_what_it_is_doing(
    models: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A factory that hangs printed nothing: the build runs under ``still_running``,
    which names the model (here at once, instead of after 30 s)."""
    said: list[str] = []

    def at_once(text: str) -> object:
        said.append(text)
        return still_running(text, after_s=0.0)

    monkeypatch.setattr(profiler, "still_running", at_once)
    assert main(["profile", "--model", "models.py:fine", *QUICK, "--out", "p.json"]) == 0
    assert said == ["building model models.py:fine"]


def test_still_running_speaks_once_after_its_delay_and_not_before() -> None:
    quiet = io.StringIO()
    with still_running("building model m", after_s=3600, stream=quiet):
        pass
    assert quiet.getvalue() == ""
    spoke = threading.Event()

    class Stream(io.StringIO):
        def flush(self) -> None:
            spoke.set()

    loud = Stream()
    with still_running("building model m", after_s=0.0, stream=loud):
        assert spoke.wait(60)
    assert loud.getvalue() == (
        "srifty: building model m: still running after 0 s (Ctrl-C stops it)\n"
    )


def test_ctrl_c_while_building_is_one_line_and_exit_130(models: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    p = subprocess.run(
        [sys.executable, "-m", "srifty_core.cli", "profile", "--model", "models.py:interrupted",
         *QUICK],
        cwd=models, env=env, capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    assert p.returncode == 130 and p.stderr.strip() == "srifty: interrupted", p.stderr


def test_entrypoint_null_in_a_train_plan_is_named(tmp_path: Path) -> None:
    from srifty_core.cli.training import read_train_plan

    plan = tmp_path / "plan.json"
    plan.write_text(
        '{"model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 2, '
        '"local_batches": [2, 2], "run_dir": "runs/r", "entrypoint": null}'
    )
    with pytest.raises(ConfigError, match="entrypoint: must be a list of strings"):
        read_train_plan(plan)


def test_a_seed_that_is_no_number_in_an_emulated_job_is_named() -> None:
    from srifty_core.jobs.emulated_job import make_provider

    with pytest.raises(ConfigError, match="seed: must be a whole number"):
        make_provider({"region": "us-east-1", "seed": "abc"})
