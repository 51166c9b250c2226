"""``srifty train --job JOB.yaml --provider emulated --preempt TYPE@SECONDS``: the job
file's provider overridden, one spot VM taken back, the re-plan's configuration and the
emulator's summary printed."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs.test_emulated_job import PARAMS, PREEMPT, SPOT


def test_srifty_train_job_on_the_emulated_ec2(
    ready_to_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from srifty_core.cli import main

    job = ready_to_plan / "job.yaml"
    job.write_text(yaml.safe_dump({**PARAMS, "provider": "local"}))
    argv = ["train", "--job", str(job), "--provider", "emulated", "--preempt", PREEMPT]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.startswith(("c0:", "c1:"))]
    assert len(lines) == 2 and "replan" in lines[0] and "finished" in lines[1], out
    assert SPOT not in lines[1] and "released" in out, out


def test_preempt_needs_the_emulated_provider(
    ready_to_plan: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from srifty_core.cli import main

    job = ready_to_plan / "job.yaml"
    job.write_text(yaml.safe_dump({**PARAMS, "provider": "local"}))
    assert main(["train", "--job", str(job), "--preempt", PREEMPT]) == 2
    assert "--preempt: only on the emulated EC2" in capsys.readouterr().err
