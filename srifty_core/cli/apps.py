"""The ``srifty`` commands that start the apps: ``ui`` (the Airflow and MLflow UIs),
``airflow`` (the airflow CLI on the data folder) and ``demo`` (the main job through
Airflow). Each ``cmd_*`` takes the parsed arguments and returns the app's exit code; the
app is imported inside it, so ``srifty --help`` stays fast.
"""

from __future__ import annotations

import argparse

from srifty_core import paths


def cmd_ui(args: argparse.Namespace) -> int:
    from srifty_core.ui import run_ui

    return run_ui(
        airflow_port=args.airflow_port,
        mlflow_port=args.mlflow_port,
        password=args.password,
        once=args.once,
    )


def cmd_airflow(args: argparse.Namespace) -> int:
    from srifty_core.airflow_env import airflow_cli

    return airflow_cli(paths.data_dir(), list(args.airflow_args))


def cmd_demo(args: argparse.Namespace) -> int:
    from srifty_core.demo import run_demo

    return run_demo()
