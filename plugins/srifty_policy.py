"""What every Srifty DAG shares: the probe-store Asset (one definition, for the sweep that
produces it and the model refresh that consumes it), a tz-aware start date, the default
task arguments, the local host's pool (``LOCAL_HOST_POOL``, created with the metadata DB
by ``srifty_core.airflow_env.migrate``), and ``fails_fast``: a deterministic error (a bad
conf, a missing input) fails the task at once instead of being retried.

Light: imports no more of ``srifty_core`` than its error types and the probe store's and
the Airflow environment's constants.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from airflow.sdk import Asset
from airflow.sdk.exceptions import AirflowFailException

from srifty_core.airflow_env import LOCAL_HOST_POOL
from srifty_core.probing import PROBE_STORE_ASSET_NAME, PROBE_STORE_ASSET_URI

__all__ = [
    "LOCAL_HOST_POOL",
    "PROBE_STORE",
    "START_DATE",
    "default_args",
    "fail_fast",
    "fails_fast",
]

PROBE_STORE = Asset(name=PROBE_STORE_ASSET_NAME, uri=PROBE_STORE_ASSET_URI)
START_DATE = datetime(2026, 1, 1, tzinfo=UTC)
F = TypeVar("F", bound=Callable[..., Any])


def default_args(
    retry_delay: timedelta = timedelta(minutes=1),
    execution_timeout: timedelta = timedelta(hours=1),
    **extra: Any,
) -> dict[str, Any]:
    """One retry (for transient errors), a retry delay and an execution timeout."""
    return {
        "owner": "srifty",
        "retries": 1,
        "retry_delay": retry_delay,
        "execution_timeout": execution_timeout,
        **extra,
    }


def deterministic(exc: BaseException) -> bool:
    """Would a retry meet this error again? A bad conf or file (``ConfigError``), a missing
    input (named with the DAG that makes it), no feasible plan, workers that failed, probe
    data too few or malformed to fit on (the store changes only when a sweep runs)."""
    from srifty_core.errors import ConfigError
    from srifty_core.profiling.store import ProfileNotFoundError

    names = {
        "NoFeasiblePlan",
        "TrainingFailed",
        "NoChampionError",
        "BandwidthDataError",
        "ProbeSchemaError",
    }
    return isinstance(exc, (ConfigError, ProfileNotFoundError)) or type(exc).__name__ in names


def fail_fast(exc: Exception) -> Exception:
    """``exc`` as ``AirflowFailException`` (no retry) when deterministic, else unchanged."""
    if deterministic(exc):
        return AirflowFailException(f"{type(exc).__name__}: {exc}")
    return exc


def fails_fast(fn: F) -> F:
    """Decorate a task's function (under ``@task``) so deterministic errors skip retries."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except AirflowFailException:
            raise
        except Exception as exc:
            raised = fail_fast(exc)
            if raised is exc:
                raise
            raise raised from exc

    return wrapper  # type: ignore[return-value]
