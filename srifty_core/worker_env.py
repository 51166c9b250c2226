"""What a worker process started on this host inherits: the caller's environment without
its secrets.

Local training and probe workers run the user's model code; they need the interpreter's
and the libraries' settings (``PATH``, ``PYTHONPATH``, ``OMP_NUM_THREADS``, ``SRIFTY_*``,
proxy and locale variables), not the Airflow connections, database URLs or cloud
credentials of the process that launched them. ``scrubbed`` drops every variable whose name
says it holds one (``SECRET_PATTERNS``: Airflow connections, variables and secret settings,
SQLAlchemy URLs, AWS/Google/Azure credentials, MLflow's tracking password and token, and any
name containing PASSWORD, SECRET, TOKEN, CREDENTIAL, PRIVATE_KEY, API_KEY or FERNET), keeping
the rest as it is.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SECRET_PATTERNS: tuple[str, ...] = (
    r"^AIRFLOW_CONN_",
    r"^AIRFLOW_VAR_",
    r"^AIRFLOW__.*(SECRET|FERNET|PASSWORD|_CONN$|SQL_ALCHEMY_CONN|RESULT_BACKEND|BROKER_URL)",
    r"^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN)$",
    r"^GOOGLE_APPLICATION_CREDENTIALS$",
    r"^AZURE_(CLIENT_SECRET|STORAGE_KEY|STORAGE_CONNECTION_STRING)$",
    r"^MLFLOW_TRACKING_(PASSWORD|TOKEN)$",
    r"^MLFLOW_AUTH_ADMIN_PASSWORD$",
    r"(PASSWORD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY|FERNET)",
)
_SECRET = re.compile("|".join(f"(?:{p})" for p in SECRET_PATTERNS), re.IGNORECASE)


def is_secret(name: str) -> bool:
    """Whether a variable of this name is kept from workers."""
    return bool(_SECRET.search(name))


def scrubbed(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) without the variables ``is_secret`` names."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if not is_secret(k)}
