"""What an EC2 VM runs at boot: its user data, a cloud-init shell script.

Workers start from the user data (``bootstrap_user_data``): it downloads the Srifty wheel
named by the deployment (``WorkerWheel``: ``SRIFTY_WORKER_WHEEL_URI``, an https:// or
s3:// URI, and ``SRIFTY_WORKER_WHEEL_SHA256``), checks its sha256, installs it with the
``worker`` extra in a venv and starts ``srifty probe|profile|train ...`` with its
arguments. Never ``pip install srifty`` from a package index (anyone can publish that
name there), and never a wheel a trigger conf names. A training VM's user data
(``training_user_data``) installs the wheel the same way, then writes and runs the start
script its caller gives (a ``TrainingStart``'s: ``worker.rendezvous``). The user data
holds no secret: it is readable from inside the VM.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from srifty_core.errors import ConfigError

WORKER_COMMANDS = ("probe", "profile", "train")
WHEEL_URI_ENV = "SRIFTY_WORKER_WHEEL_URI"
WHEEL_SHA256_ENV = "SRIFTY_WORKER_WHEEL_SHA256"
_WHEEL_NAME = re.compile(r"srifty-[0-9][A-Za-z0-9_.+!]*-py3-none-any\.whl")
_SHA256 = re.compile(r"[0-9a-f]{64}")
WHEEL_DIR = "/opt/srifty/wheel"
INSTALL_S = 600.0
"""What a VM's user data may take to install the wheel before torchrun starts (the
default join timeout is the launch wait plus this)."""


@dataclass(frozen=True)
class WorkerWheel:
    """The Srifty wheel the workers install: where it is (``https://`` or ``s3://``; the
    VM reads s3 with its instance profile) and its sha256, which the VM checks before
    installing. A deployment setting: ``from_env`` reads ``SRIFTY_WORKER_WHEEL_URI`` and
    ``SRIFTY_WORKER_WHEEL_SHA256``, never a trigger conf."""

    uri: str
    sha256: str
    extra: str = "worker"

    def __post_init__(self) -> None:
        scheme, sep, rest = self.uri.partition("://")
        if not sep or scheme not in ("https", "s3") or not rest:
            raise ConfigError(
                f"{WHEEL_URI_ENV}: an https:// or s3:// URI of a Srifty wheel, got {self.uri!r}"
            )
        if not _WHEEL_NAME.fullmatch(self.filename):
            raise ConfigError(
                f"{WHEEL_URI_ENV}: must end in a Srifty wheel's file name "
                f"(srifty-<version>-py3-none-any.whl), got {self.filename!r}"
            )
        if not _SHA256.fullmatch(self.sha256):
            raise ConfigError(
                f"{WHEEL_SHA256_ENV}: 64 lower-case hex digits (sha256sum's output), "
                f"got {self.sha256!r}"
            )
        if self.extra not in ("worker", "all"):
            raise ConfigError(f"extra: worker or all, got {self.extra!r}")

    @property
    def filename(self) -> str:
        return self.uri.rstrip("/").rsplit("/", 1)[-1]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> WorkerWheel | None:
        """The deployment's wheel, or ``None`` when neither variable is set."""
        env = os.environ if env is None else env
        uri, sha = env.get(WHEEL_URI_ENV, ""), env.get(WHEEL_SHA256_ENV, "")
        if not uri and not sha:
            return None
        if not uri or not sha:
            raise ConfigError(f"set both {WHEEL_URI_ENV} and {WHEEL_SHA256_ENV}, or neither")
        return cls(uri, sha.lower())

    def install_lines(self, venv: str = "/opt/srifty") -> list[str]:
        """Shell lines: download, check the sha256 (the script stops on a mismatch), install."""
        local = f"{WHEEL_DIR}/{self.filename}"
        if self.uri.startswith("s3://"):
            fetch = f"aws s3 cp --only-show-errors {shlex.quote(self.uri)} {shlex.quote(local)}"
        else:
            fetch = (
                "curl --fail --silent --show-error --location --proto =https --retry 3 "
                f"-o {shlex.quote(local)} {shlex.quote(self.uri)}"
            )
        return [
            f"mkdir -p {WHEEL_DIR}",
            fetch,
            f"echo {shlex.quote(f'{self.sha256}  {local}')} | sha256sum --check --strict -",
            f"{venv}/bin/pip install {shlex.quote(f'{local}[{self.extra}]')}",
        ]


BOOTSTRAP_LOG = "/var/log/srifty-bootstrap.log"
INSTALL_FAILED = (
    'trap \'echo "srifty: the worker install failed (line $LINENO)"; '
    f"tail -n 40 {BOOTSTRAP_LOG} > /dev/console || true; shutdown -h now' ERR"
)
"""Whatever fails before the worker starts (the wheel's download, its sha256, pip) shuts
the VM down, which EC2 turns into a termination (VMs launch with
``InstanceInitiatedShutdownBehavior=terminate``): a VM that can never run its worker
stops billing at once instead of when its caller's wait runs out, and the end of its
log goes to the console (``get-console-output``), where the VM's disk no longer is."""


def _install_lines(wheel: WorkerWheel) -> list[str]:
    return [
        "#!/bin/bash",
        "set -euo pipefail",
        f"exec >>{BOOTSTRAP_LOG} 2>&1",
        INSTALL_FAILED,
        "python3 -m venv /opt/srifty",
        "/opt/srifty/bin/pip install --upgrade pip",
        *wheel.install_lines(),
    ]


def bootstrap_user_data(
    worker: Sequence[str],
    *,
    wheel: WorkerWheel,
    allocation_id: str = "",
    env: Mapping[str, str] | None = None,
) -> str:
    """A cloud-init shell script: install ``wheel`` (checked against its sha256) with its
    extra in ``/opt/srifty`` and start ``srifty <worker...>`` in the background, logging to
    ``/var/log/srifty-worker.log``.

    ``worker[0]`` is ``probe``, ``profile`` or ``train``; every argument is shell-quoted.
    Put no secret in ``env``: user data is readable from inside the VM.
    """
    if not worker or worker[0] not in WORKER_COMMANDS:
        raise ConfigError(f"worker: must start with one of {WORKER_COMMANDS}, got {list(worker)}")
    exports = {"SRIFTY_ALLOCATION_ID": allocation_id, **dict(env or {})}
    lines = [
        *_install_lines(wheel),
        *(f"export {k}={shlex.quote(v)}" for k, v in exports.items()),
        "export SRIFTY_INSTANCE_ID=$(cat /var/lib/cloud/data/instance-id 2>/dev/null || true)",
        "nohup /opt/srifty/bin/srifty "
        + " ".join(shlex.quote(a) for a in worker)
        + " >>/var/log/srifty-worker.log 2>&1 &",
    ]
    return "\n".join(lines) + "\n"


START_SCRIPT = "/opt/srifty/start-worker.sh"


def training_user_data(start: str, *, wheel: WorkerWheel, allocation_id: str = "") -> str:
    """A cloud-init shell script for a training VM: install ``wheel`` as
    ``bootstrap_user_data`` does, write ``start`` (``rendezvous.start_script``: the plan,
    this VM's place in the configuration and the torchrun command) to
    ``/opt/srifty/start-worker.sh`` and run it in the background, logging to
    ``/var/log/srifty-worker.log``."""
    if "\nSRIFTY_START_SCRIPT\n" in f"\n{start}\n":
        raise ConfigError("the start script may not contain its own end marker")
    lines = [
        *_install_lines(wheel),
        f"export SRIFTY_ALLOCATION_ID={shlex.quote(allocation_id)}",
        "export SRIFTY_INSTANCE_ID=$(cat /var/lib/cloud/data/instance-id 2>/dev/null || true)",
        f"cat > {START_SCRIPT} <<'SRIFTY_START_SCRIPT'",
        start.rstrip("\n"),
        "SRIFTY_START_SCRIPT",
        f"nohup bash {START_SCRIPT} >>/var/log/srifty-worker.log 2>&1 &",
    ]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TrainingUserData:
    """The user data of a VM that runs ``start`` (``training_user_data``), by allocation id."""

    start: str
    wheel: WorkerWheel

    def __call__(self, allocation_id: str) -> str:
        return training_user_data(self.start, wheel=self.wheel, allocation_id=allocation_id)
