"""EC2 VMs "booted" on this machine, for tests against moto (which runs no VM): each
instance moto launches runs the start script its user data carries (the wheel's install
left out) as a local process, its torchrun on loopback instead of the VMs' private
addresses, and is terminated when the script ends, as EC2 terminates a VM that shut
itself down (``InstanceInitiatedShutdownBehavior=terminate``)."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from srifty_core import lifetime
from srifty_core.lifetime import free_port

ENDPOINT = re.compile(r"--rdzv-endpoint=([^\s\"']*):29400")
START = re.compile(r"<<'SRIFTY_START_SCRIPT'\n(.*?)\nSRIFTY_START_SCRIPT\n", re.S)


class BootedVMs:
    """Runs the start script of every instance moto launches (see the module doc)."""

    def __init__(self, aws: Any, folder: Path, env: dict[str, str] | None = None) -> None:
        self.aws, self.folder, self.extra = aws, folder, env or {}
        self.ports: dict[str, int] = {}  # the rendezvous ports: 29400 may be taken here
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.scripts: dict[str, str] = {}
        self.ended: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> BootedVMs:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)

    def _loop(self) -> None:
        while not self.stop.is_set():
            resp = self.aws.describe_instances(
                Filters=[{"Name": "instance-state-name", "Values": ["running"]}]
            )
            for r in resp["Reservations"]:
                for i in r["Instances"]:
                    if i["InstanceId"] not in self.procs:
                        self._boot(i)
            for iid, p in self.procs.items():
                if p.poll() is not None and iid not in self.ended:
                    self.ended.add(iid)
                    self.aws.terminate_instances(InstanceIds=[iid])  # it shut itself down
            time.sleep(0.05)

    def _boot(self, instance: dict[str, Any]) -> None:
        iid = instance["InstanceId"]
        attr = self.aws.describe_instance_attribute(InstanceId=iid, Attribute="userData")
        user_data = base64.b64decode(attr["UserData"]["Value"]).decode()
        (script,) = START.findall(user_data)
        self.scripts[iid] = script
        vm = self.folder / iid
        vm.mkdir(parents=True)
        script = script.replace("/opt/srifty/run", str(vm / "run"))
        script = script.replace("/opt/srifty/", f"{sys.prefix}/")
        # one port per ring, keyed by its first VM's private address (the one it hosts the
        # rendezvous on; the others are told it): rings launched together stay apart
        (host,) = ENDPOINT.findall(script)
        key = instance["PrivateIpAddress"] if "SRIFTY_PRIVATE_ADDRESS" in host else host
        port = self.ports.setdefault(key, free_port())
        script = ENDPOINT.sub(f"--rdzv-endpoint=127.0.0.1:{port}", script)
        script = script.replace("shutdown -h now", "true")  # the loop terminates it
        (vm / "start.sh").write_text(script)
        env = {k: v for k, v in os.environ.items() if k != lifetime.ENV_VAR}
        env.update(
            SRIFTY_LAUNCH_INDEX=str(instance.get("AmiLaunchIndex", 0)),
            SRIFTY_PRIVATE_ADDRESS="127.0.0.1",
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
            **self.extra,
        )
        with (vm / "log").open("wb") as log:
            self.procs[iid] = subprocess.Popen(
                ["bash", str(vm / "start.sh")], env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=Path(__file__).resolve().parents[2],
            )  # fmt: skip

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in self.folder.glob("*/log"))
