"""Output paths a person names (issue 48): ``--write-plan``, ``--frontier``, ``profile
--out`` and ``--plot`` go through one check (``srifty_core.outputs``). Nothing but a
regular file or a new file in a folder that is there is written; ``-`` is standard
output; a full disk is one line."""

from __future__ import annotations

import errno
import io
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from srifty_core import atomic
from srifty_core.cli import main
from srifty_core.cli.training import read_train_plan
from srifty_core.errors import ConfigError
from srifty_core.outputs import output
from srifty_core.planner.schema.train_plan import TrainPlan
from tests.planner.test_cli_plan import write_planning_data


@pytest.fixture
def request_file(data_dir: Path) -> Path:
    """``test_cli_plan``'s planning data, its model a zoo name (a train plan's model must
    be one Srifty can build)."""
    import dataclasses

    import yaml

    from srifty_core.profiling.store import ProfileStore

    request = write_planning_data(data_dir)
    store = ProfileStore()
    for gpu in ("T4", "M60"):
        store.save(dataclasses.replace(store.load("m", "full", gpu), model="dlrm"))
    request.write_text(yaml.safe_dump(yaml.safe_load(request.read_text()) | {"model": "dlrm"}))
    return request


def _plan(request: Path, *extra: str) -> int:
    return main(["plan", str(request), "--bandwidth", "probes", *extra])


def _one_line(err: str, *words: str) -> None:
    (line,) = err.strip().splitlines()
    assert all(w in line for w in words), line


def test_a_fifo_or_a_device_is_refused_not_replaced(
    request_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As root a rename replaced a device node (and a FIFO) with a regular file."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert _plan(request_file, "--write-plan", str(fifo)) == 2
    _one_line(capsys.readouterr().err, "--write-plan", "FIFO", "not a regular file")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    sock = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(sock))
        assert _plan(request_file, "--frontier", str(sock)) == 2
        _one_line(capsys.readouterr().err, "--frontier", "socket")
    try:  # a copy of /dev/null's node: only root may make one
        os.mknod(tmp_path / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        return
    assert _plan(request_file, "--write-plan", str(tmp_path / "null")) == 2
    _one_line(capsys.readouterr().err, "--write-plan", "character device")
    assert stat.S_ISCHR(os.stat(tmp_path / "null").st_mode)


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("", ("--write-plan", "empty path")),
        (".", ("--write-plan", "is a folder")),
        ("missing/plan.json", ("--write-plan", "missing does not exist")),
    ],
)
def test_an_empty_name_a_folder_or_a_missing_folder_is_named(
    request_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    name: str,
    words: tuple[str, ...],
) -> None:
    """``--write-plan ""`` was silently ignored."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    assert _plan(request_file, "--write-plan", name) == 2
    _one_line(capsys.readouterr().err, *words)
    assert list(work.iterdir()) == []


def test_a_dash_is_standard_output_and_the_answer_goes_to_stderr(
    request_file: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    capfdbinary: pytest.CaptureFixture[bytes],
) -> None:  # fmt: skip
    """``-`` became a file named '-'."""
    monkeypatch.chdir(tmp_path)
    assert _plan(request_file, "--write-plan", "-") == 0
    out, err = capfdbinary.readouterr()
    plan = json.loads(out)
    assert sum(plan["local_batches"]) == 512 and b"objective: minimize cost" in err
    assert not (tmp_path / "-").exists()
    assert _plan(request_file, "--frontier", "-", "--json") == 0
    out, err = capfdbinary.readouterr()
    assert out[:4] == b"\x89PNG" and json.loads(err)["feasible"]
    assert _plan(request_file, "--frontier", "-", "--write-plan", "-") == 2
    _one_line(capfdbinary.readouterr()[1].decode(), "--write-plan", "standard output")


def test_what_if_writes_the_base_plan(
    request_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``--what-if`` the plan and the frontier were silently not written."""
    written, png = tmp_path / "plan.json", tmp_path / "f.png"
    argv = ["--what-if", "budget_usd=15", "--write-plan", str(written), "--frontier", str(png)]
    assert _plan(request_file, *argv) == 0
    assert f"training plan: {written}" in capsys.readouterr().out
    assert sum(read_train_plan(written).local_batches) == 512
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_a_link_to_a_file_writes_the_file_and_keeps_the_link(
    request_file: Path, tmp_path: Path
) -> None:
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    target.chmod(0o640)
    link.symlink_to(target)
    assert _plan(request_file, "--write-plan", str(link)) == 0
    assert link.is_symlink() and json.loads(target.read_text())["global_batch"] == 512
    assert stat.S_IMODE(target.stat().st_mode) == 0o640  # the file's own permissions kept
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="symbolic link to nothing"):
        output(str(tmp_path / "dangling"), "--write-plan")


class _FullDisk(io.RawIOBase):
    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_is_one_line_and_leaves_the_old_file(
    request_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It was a traceback."""
    (tmp_path / "out").mkdir()
    written = tmp_path / "out" / "plan.json"
    written.write_text("the plan before")
    real_fdopen = os.fdopen

    def fdopen(fd: int, mode: str = "r", *a: Any, **k: Any) -> Any:
        if "w" in mode:
            os.close(fd)
            return io.BufferedWriter(_FullDisk())
        return real_fdopen(fd, mode, *a, **k)

    monkeypatch.setattr(atomic.os, "fdopen", fdopen)
    assert _plan(request_file, "--write-plan", str(written)) == 2
    _one_line(capsys.readouterr().err, "--write-plan", str(written), "No space left on device")
    assert written.read_text() == "the plan before"
    assert [p.name for p in written.parent.iterdir()] == ["plan.json"]  # no temporary left


def test_a_full_disk_under_any_atomic_write_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(atomic.os, "fdopen", lambda fd, *a, **k: io.BufferedWriter(_FullDisk()))
    with pytest.raises(OSError, match="No space left") as err:
        atomic.write_text_atomic(tmp_path / "x.json", "{}")
    assert err.value.filename == str(tmp_path / "x.json") and err.value.errno == errno.ENOSPC


_PLAN: dict[str, Any] = {"model": "dlrm", "size": "tiny", "global_batch": 4, "iterations": 2,
                         "local_batches": (2, 2), "run_dir": "runs/r"}  # fmt: skip


@pytest.mark.parametrize("config_id", ["../../outside", "a/b", "..", ".hidden", "", "x" * 65])
def test_a_config_id_that_is_no_file_name_is_refused(config_id: str) -> None:
    """A plan's ``config_id`` with ``../`` wrote ``plan-<id>.json`` outside the run folder
    before the run crashed."""
    with pytest.raises(ConfigError, match="config_id: must be letters"):
        TrainPlan(**_PLAN, config_id=config_id)
    assert TrainPlan(**_PLAN, config_id="c1.b-2_x").config_id
