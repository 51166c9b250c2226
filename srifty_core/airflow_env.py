"""Airflow's environment for Srifty: one definition shared by the demo, the CLI and the tests.

Airflow reads its settings from ``AIRFLOW__SECTION__KEY`` variables and writes into
``AIRFLOW_HOME`` as soon as it is imported, so every process that imports Airflow must get
these variables first. Nothing here imports Airflow.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from srifty_core import paths
from srifty_core.errors import SriftyError

DEFAULT_PARALLELISM = 2
"""LocalExecutor starts this many workers up front: small, for a 2-core machine."""
LOCAL_HOST_POOL = "srifty_local_host"
"""The Airflow pool of the tasks that run local workers or time this host (the local
provider's probe sweeps, CPU profiling, local training): one slot, so they never overlap
and slow each other's measurements. Deferred tasks count (a deferred monitor of a local
job holds the slot while its workers train)."""
POOLS: dict[str, tuple[int, str]] = {
    LOCAL_HOST_POOL: (1, "Local workers and measurements on the shared local host"),
}
DEADLINE_ALERTS_ENV = "SRIFTY_DEADLINE_ALERTS"
"""``0``: the DAGs declare no deadline alerts. ``airflow_environment`` sets it for the
processes that run DAGs with ``dag.test()`` / ``airflow dags test`` (the demo, the tests):
Airflow 3.3.2's ``dag.test()`` cannot finish a successful run of a DAG that has a
deadline alert (it looks the alert definitions up as if they were their database ids).
A deployment (the scheduler, the compose file) leaves it unset: alerts on."""


def deadline_alerts_enabled(env: Mapping[str, str] | None = None) -> bool:
    return (os.environ if env is None else env).get(DEADLINE_ALERTS_ENV, "1") != "0"


def airflow_environment(
    home: Path,
    *,
    sql_alchemy_conn: str | None = None,
    parallelism: int = DEFAULT_PARALLELISM,
) -> dict[str, str]:
    """The variables that point Airflow at ``home`` and at the repository's DAGs and plugins.

    The metadata DB is SQLite in ``home`` unless ``sql_alchemy_conn`` is given (Postgres in
    production: ``postgresql+psycopg2://user@host/db``).
    """
    home.mkdir(parents=True, exist_ok=True)
    conn = sql_alchemy_conn or f"sqlite:///{home / 'airflow.db'}"
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(paths.DAGS_DIR),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(paths.PLUGINS_DIR),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": conn,
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API_AUTH__JWT_SECRET": _jwt_secret(home),
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        DEADLINE_ALERTS_ENV: "0",  # see DEADLINE_ALERTS_ENV
        # The repository root on sys.path so `plugins/` and `srifty_core` import in tasks.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(paths.REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p
        ),
    }


ADMIN_USER = "admin"
"""The one user of the local Airflow UI (Airflow's simple auth manager; ``srifty ui`` sets
its password)."""


def data_folder_environment(root: Path) -> dict[str, str]:
    """The environment of every Airflow process on the data folder ``root`` that is not a
    ``dag.test()`` run: ``srifty ui``'s servers and the ``airflow`` CLI through ``srifty
    airflow`` (so a DAG triggered there runs on the scheduler ``srifty ui`` started, with the
    same metadata DB, DAGs, plugins and data folder)."""
    return {
        **airflow_environment(paths.airflow_home(root)),
        DEADLINE_ALERTS_ENV: "1",  # a real scheduler runs the DAGs (no dag.test())
        paths.ENV_VAR: str(root),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{ADMIN_USER}:admin",
        # the CLI's dags commands warn on every call that graphviz (diagrams) is missing
        "PYTHONWARNINGS": ",".join(
            w for w in (os.environ.get("PYTHONWARNINGS", ""), GRAPHVIZ_WARNING) if w
        ),
        # components that start `airflow ...` find this interpreter's
        "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))),
    }


NO_DB_COMMANDS = frozenset({"version", "info", "config", "cheat-sheet"})
"""``airflow`` commands that need no metadata DB: ``srifty airflow`` runs them at once."""
GRAPHVIZ_WARNING = "ignore:Could not import graphviz:UserWarning"
MIGRATED_STAMP = "srifty-migrated"
"""In the Airflow home: the Airflow version and metadata DB the last ``migrate`` was for."""


def migrate_once(env: Mapping[str, str]) -> None:
    """``migrate`` unless the home's stamp says this Airflow version already migrated this
    metadata DB (the CLI wrapper runs on every call; ``airflow db migrate`` takes seconds).
    Under a file lock, as the MLflow store's first creation (``tracking._create_once``): two
    calls on a fresh home at once raced, and the second failed with "database is locked"."""
    from importlib.metadata import version

    from filelock import FileLock

    home = Path(env["AIRFLOW_HOME"])
    stamp = home / MIGRATED_STAMP
    want = f"{version('apache-airflow')} {env['AIRFLOW__DATABASE__SQL_ALCHEMY_CONN']}"

    def done() -> bool:
        try:
            return stamp.read_text() == want
        except OSError:
            return False

    if done():
        return
    with FileLock(str(home / f"{MIGRATED_STAMP}.lock")):
        if done():
            return
        migrate(env)
        stamp.write_text(want)


def airflow_cli(root: Path, args: list[str]) -> int:
    """``srifty airflow ARGS``: the ``airflow`` CLI of this interpreter on the data folder
    ``root`` (``data_folder_environment``; its metadata DB created or upgraded first), its
    exit code returned. ``dags test`` runs with deadline alerts off (``DEADLINE_ALERTS_ENV``)."""
    env = data_folder_environment(root)
    if args[:2] == ["dags", "test"]:
        env[DEADLINE_ALERTS_ENV] = "0"
    if args and args[0] not in NO_DB_COMMANDS and not {"-h", "--help"} & set(args):
        migrate_once(env)
    return subprocess.run(airflow_command(args), env={**os.environ, **env}, check=False).returncode


def _jwt_secret(home: Path) -> str:
    """A random secret kept in ``home`` so every Airflow process of this home agrees."""
    path = home / "jwt_secret"
    if not path.exists():
        with contextlib.suppress(FileExistsError):  # another process wrote it first
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_urlsafe(64))
    return path.read_text().strip()


def airflow_command(args: list[str]) -> list[str]:
    """The command line that runs the ``airflow`` CLI of this interpreter."""
    return [sys.executable, "-m", "airflow", *args]


def migrate(target: Mapping[str, str] | AirflowSession) -> None:
    """Create or upgrade the metadata DB (``airflow db migrate``) and create Srifty's pools
    (``POOLS``; the scheduler and ``dag.test()`` never run a task whose pool is missing);
    idempotent. ``target``: the environment (one interpreter is started for these
    commands: every test session and fresh data folder migrates) or a running session."""
    commands = [["db", "migrate"], *_pool_commands()]
    if isinstance(target, AirflowSession):
        for command in commands:
            target.run(command)
    else:
        run_airflow_commands(commands, target)


def ensure_pools(env: Mapping[str, str]) -> None:
    """``airflow pools set`` for each of ``POOLS`` (deferred tasks included)."""
    run_airflow_commands(_pool_commands(), env)


def _pool_commands() -> list[list[str]]:
    return [
        ["pools", "set", name, str(slots), description, "--include-deferred"]
        for name, (slots, description) in POOLS.items()
    ]


_SERVE = """
import json, os, sys, traceback
commands = os.fdopen(os.dup(0))         # the parent's command pipe; a command reads /dev/null
results = os.fdopen(os.dup(1), "w")     # the parent's result pipe; a command writes its file
null = os.open(os.devnull, os.O_RDONLY)
os.dup2(null, 0)
from airflow.__main__ import main
for line in commands:
    argv, out_path = json.loads(line)
    with open(out_path, "wb") as out:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(out.fileno(), 1); os.dup2(out.fileno(), 2)
        sys.argv = ["airflow", *argv]
        try:
            main(); code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if isinstance(e.code, str): print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc(); code = 1
        sys.stdout.flush(); sys.stderr.flush()
    results.write(json.dumps(code) + "\\n"); results.flush()
"""
"""What ``AirflowSession`` runs: Airflow's own CLI entry point, once per command it is sent."""


class AirflowSession:
    """One interpreter that runs ``airflow`` CLI commands in turn, each as ``airflow ARGS``
    would (its exit status, its output), with ``env`` added. Each ``airflow`` start imports
    Airflow, parses the DAGs and imports what their tasks import (seconds of CPU each); a
    session pays that once for all its commands. Use it as a context manager."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="srifty-airflow-")
        self._count = 0
        self._err = Path(self._dir.name) / "session.err"
        with self._err.open("wb") as err:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env={**os.environ, **env},
                text=True,
            )

    def run(self, args: list[str]) -> str:
        """Run ``airflow ARGS``; return what it printed; raise ``SriftyError`` with its
        output if it fails."""
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._count += 1
        out = Path(self._dir.name) / f"{self._count}.out"
        try:
            self._proc.stdin.write(json.dumps([args, str(out)]) + "\n")
            self._proc.stdin.flush()
            line = self._proc.stdout.readline()
        except BrokenPipeError:
            line = ""
        said = out.read_text(errors="replace") if out.is_file() else ""
        if not line:  # the interpreter ended without answering
            code = self._proc.wait()
            said += self._err.read_text(errors="replace")
            raise SriftyError(f"airflow {' '.join(args)} failed (exit {code}):\n{said[-4000:]}")
        status = json.loads(line)
        if status != 0:
            raise SriftyError(f"airflow {' '.join(args)} failed (exit {status}):\n{said[-4000:]}")
        return said

    def close(self) -> None:
        """End the interpreter (its commands have all returned) and remove the outputs."""
        if self._proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            self._proc.stdout.close()
        self._dir.cleanup()

    def __enter__(self) -> AirflowSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_airflow_commands(commands: list[list[str]], env: Mapping[str, str]) -> None:
    """Run several airflow CLI commands in turn in one interpreter (``AirflowSession``) with
    ``env`` added, their output dropped; the first that fails raises ``SriftyError``."""
    with AirflowSession(env) as airflow:
        for command in commands:
            airflow.run(command)


def run_airflow(args: list[str], env: Mapping[str, str], *, quiet: bool = False) -> str:
    """Run the airflow CLI with ``env`` added; raise ``SriftyError`` with its output on failure."""
    full_env = {**os.environ, **env}
    proc = subprocess.run(
        airflow_command(args),
        env=full_env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-4000:]
        raise SriftyError(f"airflow {' '.join(args)} failed (exit {proc.returncode}):\n{tail}")
    if not quiet:
        sys.stdout.write(proc.stdout)
    return proc.stdout


def start_airflow(args: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Start a long-running airflow command (``api-server``, ``scheduler``, ``celery worker``)
    with ``env`` added, in its own session (so ``stop_process_groups`` reaches its children),
    stdout and stderr appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            airflow_command(args),
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """Wait until ``url`` answers 200; raise ``SriftyError`` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SriftyError(f"the server for {url} exited (code {proc.returncode})")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # loopback only
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1.0)
    raise SriftyError(f"{url} did not answer within {timeout_s:.0f} s")


def stop_process_groups(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 20.0) -> None:
    """SIGTERM each process's group (each leads its own session), then SIGKILL the groups
    still alive after ``grace_s``."""
    procs = list(procs)
    for p in procs:
        if p.poll() is None:
            _signal_group(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        # The leader may be gone while children it forked (task runners) are not.
        _signal_group(p.pid, signal.SIGKILL)
        p.wait()


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
