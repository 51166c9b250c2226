"""Planning counts a user's factory (a file or a module) in a child process with a worker's
environment: the caller's secrets never reach the model's code (``profiling.census``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from srifty_core.errors import ConfigError
from srifty_core.profiling.census import load_census
from srifty_core.profiling.store import ProfileStore

SPY = """
import json, os
from pathlib import Path

from torch import nn

Path({seen!r}).write_text(json.dumps({{
    "pid": os.getpid(),
    "leaked": sorted(k for k in ("AIRFLOW_CONN_AWS_DEFAULT", "DATABASE_URL", "GH_PAT",
                                 "AIRFLOW__API_AUTH__JWT_SECRET") if k in os.environ),
}}))


def build():
    import torch

    def batch(b, gen):
        return torch.randn(b, 8, generator=gen), torch.randint(0, 3, (b,), generator=gen)

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    return nn.Linear(8, 3), batch, loss
"""

SECRETS = {
    "AIRFLOW_CONN_AWS_DEFAULT": "aws://AKIAEXAMPLE:hunter2@",
    "DATABASE_URL": "postgresql://app:hunter2@db/app",
    "GH_PAT": "ghp_example",
    "AIRFLOW__API_AUTH__JWT_SECRET": "jwt",
}


@pytest.fixture
def secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)


def _spy(tmp_path: Path) -> tuple[str, Path]:
    seen = tmp_path / "seen.json"
    path = tmp_path / "spy.py"
    path.write_text(SPY.format(seen=str(seen)))
    return f"{path}:build", seen


def test_a_factory_is_counted_in_a_child_without_the_callers_secrets(
    tmp_path: Path, secrets: None
) -> None:
    model, seen = _spy(tmp_path)
    census = load_census(model, "tiny", root=tmp_path / "store")
    imported = json.loads(seen.read_text())
    assert imported["pid"] != os.getpid() and imported["leaked"] == []
    assert census.n_parameters == 8 * 3 + 3 and census.model == model
    seen.unlink()  # kept in the store: the next plan reads it and runs nothing
    assert load_census(model, "tiny", root=tmp_path / "store") == census
    assert not seen.exists()


def test_planning_on_an_estimate_runs_the_factory_only_in_the_child(
    tmp_path: Path, secrets: None
) -> None:
    """What ``srifty plan`` does for a GPU without a profile of the model."""
    model, seen = _spy(tmp_path)
    profile = ProfileStore(tmp_path / "store").load_or_estimate(model, "tiny", "T4")
    assert profile.estimate
    imported = json.loads(seen.read_text())
    assert imported["pid"] != os.getpid() and imported["leaked"] == []


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def build():\n    raise RuntimeError('no driver')\n", r"raised RuntimeError: no driver"),
        ("import os\nos._exit(0)\n", r"in a child process failed \(exit code 0, no census\)"),
    ],
)
def test_a_failing_factory_is_one_line_naming_the_model(
    tmp_path: Path, source: str, message: str
) -> None:
    path = tmp_path / "bad.py"
    path.write_text(source)
    with pytest.raises(ConfigError, match=message) as err:
        load_census(f"{path}:build", "tiny", root=tmp_path / "store")
    text = str(err.value)
    assert text.startswith("model: ") and "\n" not in text and str(path) in text
    assert not list((tmp_path / "store").glob("**/census*.json"))


def test_a_factory_of_the_wrong_type_is_the_childs_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the child (``python -m srifty_core.profiling.census``) says of a factory that
    returns no model, called here in-process: exit 2 and one line naming the model, which
    ``count_in_child`` passes on as it is (the ``raised RuntimeError`` case above takes
    that path through a real child)."""
    from srifty_core.profiling import census

    monkeypatch.setattr(census, "die_with_caller", lambda: None)  # this is no child
    path = tmp_path / "bad.py"
    path.write_text("def build():\n    return 7\n")
    out = tmp_path / "census.json"
    with pytest.raises(SystemExit) as exit_:
        census.main(["--model", f"{path}:build", "--size", "tiny", "--out", str(out)])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    prefix = "python -m srifty_core.profiling.census: error: "
    assert line.startswith(prefix + "model: ") and "returned int" in line and str(path) in line
    assert not out.exists()
