"""What a profiling VM runs: its start script (``vm_script``: the profiler on the GPU, then
``finish``, then shut down) and ``finish`` (``python -m srifty_core.jobs.vm_script
finish``), which hands the profile and the profiler's exit code to the VM's run-storage
folder (``PROFILE_FILE``, ``EXIT_FILE``), where the collect step looks for them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from srifty_core.jobs.cloud_request import CloudProfileRequest
from srifty_core.runs import store as run_store

PROFILE_FILE = "profile.json"
EXIT_FILE = "exit.json"
VM_HOME = "/opt/srifty"
VM_PROFILE = f"{VM_HOME}/profile.json"
VM_LOG = f"{VM_HOME}/profile.log"


def vm_script(request: CloudProfileRequest, run_dir: str) -> str:
    """The VM's start script (bash): the profiler on the GPU, then ``finish`` (profile and
    exit code into ``run_dir``), then shut down (the VM terminates and stops billing)."""
    import shlex

    profile = " ".join(shlex.quote(a) for a in request.profiler_argv(VM_PROFILE))
    finish = [
        f"{VM_HOME}/bin/python", "-m", "srifty_core.jobs.vm_script", "finish",
        "--run-dir", run_dir, "--profile", VM_PROFILE, "--log", VM_LOG,
    ]  # fmt: skip
    lines = [
        "#!/bin/bash",
        f"# srifty: profile {request.model}/{request.size} on this VM's GPU",
        "set -uo pipefail",
        f"export SRIFTY_DATA_DIR={VM_HOME}/data",
        "code=0",
        f"{VM_HOME}/bin/srifty {profile} >{VM_LOG} 2>&1 || code=$?",
        f"cat {VM_LOG}",
        " ".join(shlex.quote(a) for a in finish) + ' --code "$code"',
        "shutdown -h now",
    ]
    return "\n".join(lines) + "\n"


def finish(run_dir: str, code: int, profile: Path, log: Path | None = None) -> int:
    """On the VM, after the profiler: its profile (when it succeeded) and then
    ``exit.json`` (the code and the log's last lines) into ``run_dir``."""
    tail = ""
    if log is not None and log.is_file():
        tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
    if code == 0 and profile.is_file():
        run_store.write_text(run_store.join(run_dir, PROFILE_FILE), profile.read_text("utf-8"))
    elif code == 0:
        code, tail = 1, f"{tail}\nno profile at {profile}"
    done = {"code": code, "tail": tail, "at": datetime.now(UTC).isoformat()}
    run_store.write_text(run_store.join(run_dir, EXIT_FILE), json.dumps(done))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m srifty_core.jobs.vm_script")
    sub = parser.add_subparsers(dest="command", required=True)
    fin = sub.add_parser("finish", help="on a profiling VM: hand the profile to the run storage")
    fin.add_argument("--run-dir", required=True)
    fin.add_argument("--profile", required=True, type=Path)
    fin.add_argument("--log", type=Path)
    fin.add_argument("--code", required=True, type=int)
    args = parser.parse_args(argv)
    return finish(args.run_dir, args.code, args.profile, args.log)


if __name__ == "__main__":
    sys.exit(main())
