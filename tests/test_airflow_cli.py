"""`srifty airflow ARGS`: the airflow CLI on the data folder's Airflow, as the README's
walk-through uses it (the walk-through itself: tests/test_demo.py)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.airflow_env import MIGRATED_STAMP
from srifty_core.cli import _airflow_args
from tests.conftest import subprocess_env

SRIFTY = str(Path(sys.executable).with_name("srifty"))


def test_everything_after_airflow_goes_to_airflow_untouched() -> None:
    assert _airflow_args(["airflow", "dags", "trigger", "x", "--conf", "{}"]) == [
        "dags", "trigger", "x", "--conf", "{}",
    ]  # fmt: skip
    assert _airflow_args(["--data-dir", "d", "airflow", "--help"]) == ["--help"]
    assert _airflow_args(["--data-dir=d", "airflow"]) == []
    assert _airflow_args(["plan", "airflow"]) is None
    assert _airflow_args(["train", "p.json", "--", "airflow"]) is None


@dataclass(frozen=True)
class FreshFolder:
    """What ``srifty airflow`` did on a fresh data folder, in this order: a command that
    needs no DB, two first DB commands at once, and a command that fails."""

    home: Path
    config: subprocess.CompletedProcess[str]
    stamped_after_config: bool
    pools: list[tuple[int, str, str]]  # (exit code, stdout, stderr) of each
    trigger: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def fresh_folder(tmp_path_factory: pytest.TempPathFactory) -> FreshFolder:
    """One fresh data folder for the module's claims: each ``srifty airflow`` call starts
    the airflow CLI (seconds of CPU), and the first DB command migrates (more seconds)."""
    tmp = tmp_path_factory.mktemp("srifty-airflow")
    root = tmp / "fresh"
    # The caller's environment points elsewhere: the data folder's home wins.
    env = subprocess_env({paths.ENV_VAR: "", "AIRFLOW_HOME": str(tmp / "elsewhere")})

    def srifty_airflow(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SRIFTY, "--data-dir", str(root), "airflow", *args],
            capture_output=True, text=True, env=env, timeout=240, check=False,
        )  # fmt: skip

    config = srifty_airflow("config", "get-value", "core", "dags_folder")
    home = paths.airflow_home(root)
    stamped = (home / MIGRATED_STAMP).exists()
    # Two first DB commands at once on the fresh folder (the metadata DB made once).
    argv = [SRIFTY, "--data-dir", str(root), "airflow", "pools", "list", "-o", "plain"]
    procs = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(2)
    ]
    pools = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        pools.append((p.returncode, out, err))
    trigger = srifty_airflow("dags", "trigger", "no_such_dag")
    return FreshFolder(home, config, stamped, pools, trigger)


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_srifty_airflow_runs_the_cli_on_the_data_folder(fresh_folder: FreshFolder) -> None:
    # The repository's DAGs and the data folder's home, whatever the caller's environment.
    got = fresh_folder.config
    assert got.returncode == 0 and got.stdout.strip() == str(paths.DAGS_DIR), got.stderr
    assert not fresh_folder.stamped_after_config  # no DB needed, none made


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_a_db_command_on_a_fresh_folder_works_at_once(fresh_folder: FreshFolder) -> None:
    """The metadata DB is made first, so a DB command works at once (it said "Database
    migration required" before), with Srifty's pools, and without graphviz's warning."""
    home = fresh_folder.home
    for code, out, err in fresh_folder.pools:
        assert code == 0, out + err[-2000:]
        assert "srifty_local_host" in out  # Srifty's pools too
        assert "graphviz" not in err
    assert (home / "airflow.db").is_file() and (home / MIGRATED_STAMP).is_file()


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_two_first_calls_at_once_both_work(fresh_folder: FreshFolder) -> None:
    """Two `srifty airflow` on a fresh data folder at once: the metadata DB is made once,
    under a lock (before, the second failed with SQLite's "database is locked")."""
    assert len(fresh_folder.pools) == 2
    for code, out, err in fresh_folder.pools:
        assert code == 0, err[-2000:]
        assert "srifty_local_host" in out


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_airflows_own_exit_code_comes_back(fresh_folder: FreshFolder) -> None:
    assert fresh_folder.trigger.returncode != 0


@pytest.mark.airflow
@pytest.mark.timeout(300)
def test_a_session_runs_commands_in_turn_and_a_failure_names_it_with_its_output(
    airflow_home: Path,
) -> None:
    """``AirflowSession``: one interpreter for several commands; a failing command raises
    with its own output and exit status, and the session goes on to the next."""
    import os

    from srifty_core.airflow_env import AirflowSession
    from srifty_core.errors import SriftyError

    env = {k: v for k, v in os.environ.items() if k.startswith("AIRFLOW")}
    with AirflowSession(env) as airflow:
        pools = airflow.run(["pools", "list", "-o", "json"])
        with pytest.raises(SriftyError, match=r"(?s)dags test srifty_no_such_dag failed "
                           r"\(exit [1-9]\d*\):.*srifty_no_such_dag"):  # fmt: skip
            airflow.run(["dags", "test", "srifty_no_such_dag"])
        again = airflow.run(["pools", "list", "-o", "json"])
    assert "srifty_local_host" in pools and again == pools
