"""What a process that runs user code on this host inherits: an allow-listed part of the
caller's environment, never its secrets.

Local training and probe workers, and the child that takes a user model's operator census
for ``srifty plan`` (``profiling.census``), run code the caller did not write. They get
only the variables they need (``scrubbed``), whatever else the caller's environment holds
(Airflow connections, database URLs with their passwords, cloud credentials, personal
access tokens, an SSH agent's socket, an MLflow tracking URI):

- ``ALLOWED_NAMES``: the interpreter and the host (``PATH``, ``HOME``, ``USER``, ``SHELL``,
  ``TERM``, ``TZ``, ``LANG``, ``LANGUAGE``, ``TMPDIR``/``TMP``/``TEMP``,
  ``LD_LIBRARY_PATH``, ``VIRTUAL_ENV``), the rendezvous torchrun sets (``MASTER_ADDR``,
  ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ...), Hugging Face's cache and
  offline switches, and the proxies;
- ``ALLOWED_PREFIXES``: ``LC_*``, ``XDG_*`` (where the data folder defaults to),
  ``PYTHON*``, the thread pools' (``OMP_*``, ``MKL_*``, ``OPENBLAS_*``, ``KMP_*``,
  ``GOMP_*``), PyTorch's and the accelerators' (``TORCH*``, ``PYTORCH_*``, ``CUDA_*``,
  ``CUDNN_*``, ``CUBLAS*``, ``NCCL_*``, ``GLOO_*``, ``NVIDIA_*``, ``TRITON_*``) and
  Srifty's own ``SRIFTY_*``, except a name that says it holds a secret (``is_secret``:
  ``SRIFTY_JWT_SECRET``, ``NCCL_..._TOKEN``);
- the names the deployment lists in ``SRIFTY_WORKER_ENV`` (comma-separated, e.g.
  ``MLFLOW_TRACKING_URI,WANDB_MODE``), passed as they are: the deployment's decision.

A kept variable whose value holds a URL with a password (``http://user:pass@proxy``) is
dropped all the same. What a launcher passes explicitly (a rank's ``RANK`` and
``SRIFTY_*`` settings) is added after the scrub.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

EXTRA_ENV = "SRIFTY_WORKER_ENV"
"""Deployment setting: more variable names (comma-separated) that workers get."""

ALLOWED_NAMES: frozenset[str] = frozenset(
    {
        # the interpreter and the host
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "SHELL",
        "TERM",
        "TZ",
        "LANG",
        "LANGUAGE",
        "TMPDIR",
        "TMP",
        "TEMP",
        "LD_LIBRARY_PATH",
        "VIRTUAL_ENV",
        # the rendezvous (torchrun's and the launcher's)
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_NAME",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        # Hugging Face: caches and offline switches (never HF_TOKEN)
        "HF_HOME",
        "HF_HUB_CACHE",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "TRANSFORMERS_OFFLINE",
        "TRANSFORMERS_CACHE",
        "TOKENIZERS_PARALLELISM",
        # proxies (dropped when the value holds a password: ``_CREDENTIALS``)
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "no_proxy",
    }
)
ALLOWED_PREFIXES: tuple[str, ...] = (
    "LC_",
    "XDG_",
    "PYTHON",
    "OMP_",
    "MKL_",
    "OPENBLAS_",
    "KMP_",
    "GOMP_",
    "TORCH",
    "PYTORCH_",
    "CUDA_",
    "CUDNN_",
    "CUBLAS",
    "NCCL_",
    "GLOO_",
    "NVIDIA_",
    "TRITON_",
    "SRIFTY_",
)

SECRET_PATTERNS: tuple[str, ...] = (
    r"^AIRFLOW_CONN_",
    r"^AIRFLOW_VAR_",
    r"^AIRFLOW__.*(SECRET|FERNET|PASSWORD|_CONN$|SQL_ALCHEMY_CONN|RESULT_BACKEND|BROKER_URL)",
    r"^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN)$",
    r"^GOOGLE_APPLICATION_CREDENTIALS$",
    r"^AZURE_(CLIENT_SECRET|STORAGE_KEY|STORAGE_CONNECTION_STRING)$",
    r"^MLFLOW_TRACKING_(PASSWORD|TOKEN)$",
    r"^MLFLOW_AUTH_ADMIN_PASSWORD$",
    r"(PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|PRIVATE_KEY|API_KEY|FERNET|_PAT$|_KEY$)",
)
"""Names that say they hold a secret: never passed on by a prefix in
``ALLOWED_PREFIXES`` (the allow-list decides; these only narrow it)."""
_SECRET = re.compile("|".join(f"(?:{p})" for p in SECRET_PATTERNS), re.IGNORECASE)
_CREDENTIALS = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/@\s]*:[^/@\s]*@")
"""A URL with a password in it (``scheme://user:password@host``)."""


def is_secret(name: str) -> bool:
    """Whether the name says the variable holds a secret."""
    return bool(_SECRET.search(name))


def is_passed(name: str, value: str, extra: frozenset[str] = frozenset()) -> bool:
    """Whether a worker gets the variable ``name`` (see the module doc)."""
    if _CREDENTIALS.search(value):
        return False
    if name in ALLOWED_NAMES or name in extra:
        return True
    return name.startswith(ALLOWED_PREFIXES) and not is_secret(name)


def scrubbed(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The part of ``environ`` (default: this process's) a worker gets."""
    env = os.environ if environ is None else environ
    extra = frozenset(n.strip() for n in env.get(EXTRA_ENV, "").split(",") if n.strip())
    return {k: v for k, v in env.items() if is_passed(k, v, extra)}
