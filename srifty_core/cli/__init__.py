"""The ``srifty`` command: ``main`` parses the arguments (``cli.parser``), runs the
subcommand and turns the errors a user can fix (a ``SriftyError``, a file the machine
refused, Ctrl-C) into one line and an exit code (2, 2, 130).

Each subcommand is a thin shell over a library call, in a module per concern:
``cli.inputs`` (catalog, profile, probe, fit-bandwidth), ``cli.planning`` (plan),
``cli.training`` (train, monitor), ``cli.apps`` (ui, airflow, demo). Heavy libraries are
imported inside the subcommand that needs them, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from srifty_core import paths
from srifty_core.cli.parser import build_parser
from srifty_core.errors import ConfigError, SriftyError


def _airflow_args(words: list[str]) -> list[str] | None:
    """The words after ``airflow`` when it is the command (``srifty [--data-dir D]
    airflow ...``), or None: they go to airflow untouched (its own options included)."""
    k = 0
    while k < len(words) and words[k].startswith("--data-dir"):
        k += 1 if "=" in words[k] else 2
    return words[k + 1 :] if k < len(words) and words[k] == "airflow" else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    passthrough = _airflow_args(words)
    if passthrough is not None:  # `srifty airflow ARGS`: ARGS are airflow's, as given
        words = words[: len(words) - len(passthrough)]
    elif "train" in words and "--" in words[words.index("train") :]:
        cut = words.index("--", words.index("train"))
        words, command = words[:cut], words[cut + 1 :]
    args = parser.parse_args(words)
    if passthrough is not None:
        args.airflow_args = passthrough
    args.command = command  # `srifty train PLAN -- COMMAND`: the script every rank runs
    args.as_program = argv is None  # the `srifty` command, not a caller in its own process
    if args.as_program:
        # MLflow's INFO lines ("Creating initial MLflow database tables...") on stderr would
        # make a one-line error three; its warnings still show. Only the command does this.
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if args.data_dir:
        # One place decides where data lives: paths.data_dir() reads this variable, and
        # child processes (Airflow tasks, workers) inherit it.
        os.environ[paths.ENV_VAR] = str(paths.data_dir(args.data_dir))
    try:
        code: int = args.func(args)
    except SriftyError as exc:
        # A bad setting or field is one line (its message starts with the field's path).
        text = " ".join(str(exc).split()) if isinstance(exc, ConfigError) else str(exc)
        print(f"srifty: error: {text}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `srifty catalog | head`
        return 0
    except KeyboardInterrupt:
        # Ctrl-C (a model factory that hangs, a long search): one line, the shell's 130
        if not args.as_program:
            raise
        print("srifty: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        # The machine refused a file: a read-only or full data folder, a file where a folder
        # should be, no permission. One line naming the path, not a traceback; an OSError
        # without a path is no such case and stays a traceback.
        if exc.filename is None or exc.strerror is None:
            raise
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
        print(f"srifty: error: {where}: {exc.strerror}", file=sys.stderr)
        return 2
    return code
