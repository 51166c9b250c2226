"""Joining the VMs of one configuration into one process group: torchrun's elastic agent
with its c10d rendezvous.

One rendezvous per configuration: its endpoint is the first VM's private address and a
port (``DEFAULT_PORT``), its id ``run_id(config_id, run_dir)``, and it waits for exactly
``nnodes`` VMs (``--nnodes=N``, not elastic: a plan is made for those VMs). Each VM runs
``torchrun --nproc-per-node=R`` with R its ranks (one per GPU; 1 on a CPU VM); the first VM
hosts the rendezvous store (``is_host=true``), the others connect to it.

Rank order. c10d numbers the VMs in the order of its participant records (address, pid),
not in the plan's order, so torchrun's ``RANK`` is not the plan's rank. The plan's
``local_batches`` are in its VM order (``planning``: launches in order, VMs within a
launch, ranks within a VM), so each VM is told where its ranks start in that order
(``SRIFTY_RANK_OFFSET``) and the worker takes ``offset + LOCAL_RANK`` as its rank
(``placement.plan_rank``): a VM with 4 GPUs at offset k runs the plan's ranks k..k+3, whatever
order the VMs joined in. (``--node-rank`` would only order a static rendezvous; c10d
ignores it.)

VMs launched together (one EC2 ``run_instances`` call) get the same user data, so a
``NodeGroup`` describes them together and each VM computes its index from its launch
index (EC2's ``ami-launch-index``). The first VM is launched alone, before the others:
its private address (in ``run_instances``' answer) is the endpoint the others are given;
the others are launched right after it, without waiting for it to run.

Network. The security group must allow all TCP between the configuration's VMs (a rule
whose source is the group itself), not only ``DEFAULT_PORT``: the rank-0 VM's agent
opens the workers' store on an ephemeral port, and gloo and NCCL connect on ephemeral
ports too. The worker joins its process group at ``MASTER_ADDR:MASTER_PORT`` with the
plan's rank; that works because torchrun's agent store makes every worker a client of
that store (``TORCHELASTIC_USE_AGENT_STORE=True``, kept on by
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0`` in the start script; ``placement.plan_rank``
refuses a rank offset without it).

Exit. torchrun ends (done, a join timeout, a crash, a lost peer): the start script writes
``exit-<config>-<node>.json`` (``{"code": N, "at": ...}``, ``write_exit_marker``) into the
run folder and shuts the VM down, which EC2 turns into a termination (the VMs are launched
with ``InstanceInitiatedShutdownBehavior=terminate``): a dead run stops billing, and the
monitor reads the markers (``exit_markers``) and fails the run on a non-zero code.

``start_script`` is the shell script a VM runs once the worker is installed (the EC2 user
data embeds it verbatim); it holds the plan (no secret: a plan names a model, batches and
a run folder) and reads what only the VM knows (its launch index and private address) from
the instance metadata service, unless the environment already has them.

Light: no torch import.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.errors import ConfigError
from srifty_core.runs import store as run_store

DEFAULT_PORT = 29400
"""torchrun's usual c10d port (the security group must allow all TCP inside the group)."""
JOIN_TIMEOUT_S = 900
"""How long the VMs wait for each other by default (EC2 VMs boot and install minutes
apart; ``EC2Provider`` gives its launch wait plus the install time, or ``join_timeout_s``)."""
RANK_OFFSET_ENV = "SRIFTY_RANK_OFFSET"
"""The plan's first rank on this VM (``placement.plan_rank``)."""
NODE_INDEX_ENV = "SRIFTY_NODE_INDEX"
"""This VM's index in the configuration (0 hosts the rendezvous)."""
LAUNCH_INDEX_ENV = "SRIFTY_LAUNCH_INDEX"
"""This VM's index among those launched with it (EC2's ``ami-launch-index``)."""
ADDRESS_ENV = "SRIFTY_PRIVATE_ADDRESS"
"""This VM's private address (EC2's ``local-ipv4``)."""
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
_IMDS = "http://169.254.169.254/latest"
_CURL = "curl -sf --retry 5 --retry-connrefused --max-time 5"
EXIT_PREFIX = "exit-"
TRAINING_MODULE = "srifty_core.worker.launch"
"""What a training VM's ranks run: the plan's entrypoint, or the built-in worker."""


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """VMs launched together: VM ``first_node + k`` (``k``: its launch index, ``< count``)
    runs ``ranks_per_vm`` ranks, the plan's ranks from ``first_rank + k * ranks_per_vm``."""

    first_node: int
    count: int
    ranks_per_vm: int
    first_rank: int

    def __post_init__(self) -> None:
        if self.first_node < 0 or self.first_rank < 0:
            raise ConfigError("first_node and first_rank: must be >= 0")
        if self.count < 1 or self.ranks_per_vm < 1:
            raise ConfigError(
                f"a node group needs >= 1 VM of >= 1 rank, got {self.count} x {self.ranks_per_vm}"
            )

    def node(self, launch_index: int) -> tuple[int, int]:
        """``(node index, first plan rank)`` of the VM with ``launch_index``."""
        if not 0 <= launch_index < self.count:
            raise ConfigError(f"launch index {launch_index} is not in 0..{self.count - 1}")
        return self.first_node + launch_index, self.first_rank + launch_index * self.ranks_per_vm


def node_groups(vms: Sequence[tuple[int, int]]) -> tuple[NodeGroup, ...]:
    """The configuration's VMs as ``(count, ranks_per_vm)`` per launch, in the plan's order,
    with the first VM in a group of its own (it is launched first: its address is the
    endpoint)."""
    out: list[NodeGroup] = []
    node = rank = 0
    for k, (count, per) in enumerate(vms):
        parts = [1, count - 1] if k == 0 and count > 1 else [count]
        for n in parts:
            out.append(NodeGroup(node, n, per, rank))
            node, rank = node + n, rank + n * per
    if not out:
        raise ConfigError("a configuration needs at least one VM")
    return tuple(out)


def run_id(config_id: str, run_dir: str) -> str:
    """The rendezvous id of one configuration of one run folder (the same on every VM;
    another configuration, or another job, never joins it)."""
    digest = hashlib.sha256(run_dir.encode()).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9_.-]", "-", config_id).strip("-.") or "c"
    return f"srifty-{digest}-{safe}"[:128]


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """The rendezvous of one configuration: ``nnodes`` VMs, ``world_size`` ranks in all."""

    run_id: str
    nnodes: int
    world_size: int
    host: str = ""
    """The first VM's private address; empty on the first VM itself (it reads its own)."""
    port: int = DEFAULT_PORT
    join_timeout_s: int = JOIN_TIMEOUT_S

    def __post_init__(self) -> None:
        if not _RUN_ID.fullmatch(self.run_id):
            raise ConfigError(f"rendezvous id: letters, digits, '_.-', got {self.run_id!r}")
        if self.host and not _HOST.fullmatch(self.host):
            raise ConfigError(f"rendezvous host: an IPv4 address or host name, got {self.host!r}")
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"rendezvous port: 1..65535, got {self.port}")
        if self.nnodes < 1 or self.world_size < self.nnodes:
            raise ConfigError(f"{self.nnodes} VM(s) cannot hold {self.world_size} rank(s)")
        if self.join_timeout_s < 1:
            raise ConfigError(f"join timeout: >= 1 s, got {self.join_timeout_s}")


@dataclass(frozen=True)
class TrainingStart:
    """What the VMs of one training configuration run: the workers' plan (its JSON) and
    the rendezvous id and port; ``start_script`` gives each node group its script (what
    ``cloud.ec2.EC2Provider(training=...)`` puts in the VMs' user data)."""

    plan_json: str
    run_id: str
    port: int = DEFAULT_PORT
    module: str = TRAINING_MODULE
    """What torchrun runs on each rank, given the plan's path (a probe ring: the probe
    worker, ``jobs.probe_vms``)."""

    @property
    def world_size(self) -> int:
        return plan_world_size(json.loads(self.plan_json))

    def start_script(
        self, vms: Sequence[tuple[int, int]], group: int, host: str, join_timeout_s: int
    ) -> str:
        """The start script of node group ``group`` of ``vms`` (``(count, ranks per VM)``
        per launch, in the plan's order: ``node_groups``), with ``host`` the rendezvous
        endpoint (empty on the first VM)."""
        nnodes = sum(count for count, _ in vms)
        world = sum(count * per for count, per in vms)
        rdzv = Rendezvous(self.run_id, nnodes, world, host, self.port, join_timeout_s)
        return start_script(self.plan_json, node_groups(vms)[group], rdzv, module=self.module)

    @classmethod
    def for_plan(cls, plan_path: str | Path, config_id: str) -> TrainingStart:
        """The training of the plan file at ``plan_path`` (one configuration). Its run
        folder must be on run storage: the VMs write their progress, checkpoints and exit
        markers there, where the monitor reads them (a local folder would be each VM's own
        disk)."""
        text = run_store.read_text(plan_path)  # a path, or a URI on the run storage
        if text is None:
            raise ConfigError(f"no such plan: {plan_path}")
        d = json.loads(text)
        if not run_store.is_remote(str(d["run_dir"])):
            raise ConfigError(
                f"EC2 training needs its run folder on run storage, got {d['run_dir']}: set "
                f"{paths.RUN_STORAGE_ENV} (an s3:// URI the VMs' instance profile can write)"
            )
        return cls(text, run_id(str(d.get("config_id", config_id)), str(d["run_dir"])))


def torchrun_argv(
    rdzv: Rendezvous,
    *,
    ranks: int,
    host: str,
    local_addr: str,
    is_host: str,
    plan_path: str,
    torchrun: str = "torchrun",
    module: str = TRAINING_MODULE,
) -> list[str]:
    """torchrun's command line on one VM (``ranks`` processes of ``module`` on
    ``plan_path``); ``host``, ``local_addr`` and ``is_host`` (``true``/``false``) may be
    shell expansions that ``start_script`` fills in on the VM."""
    return [
        torchrun,
        f"--nnodes={rdzv.nnodes}",
        f"--nproc-per-node={ranks}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={host}:{rdzv.port}",
        f"--rdzv-id={rdzv.run_id}",
        f"--rdzv-conf=is_host={is_host},join_timeout={rdzv.join_timeout_s}",
        f"--local-addr={local_addr}",
        "--max-restarts=0",  # a lost VM ends the group; the monitor re-plans
        "--module",
        module,
        plan_path,
    ]


def plan_world_size(plan: Mapping[str, Any]) -> int:
    """The ranks a plan runs: one per local batch (a training), else its ``world_size``
    (a probe ring)."""
    if "local_batches" in plan:
        return len(plan["local_batches"])
    world = plan.get("world_size")
    if not isinstance(world, int) or world < 1:
        raise ConfigError(f"a plan needs local_batches or a world_size >= 1, got {world!r}")
    return world


def _sh(arg: str) -> str:
    """Shell-quote ``arg``, leaving ``${SRIFTY_...}`` expansions (ours) expandable."""
    if "${" in arg:
        if '"' in arg or "`" in arg or "\\" in arg or "$(" in arg:
            raise ConfigError(f"cannot quote {arg!r}")
        return f'"{arg}"'
    return shlex.quote(arg)


def start_script(
    plan: Mapping[str, Any] | str,
    group: NodeGroup,
    rdzv: Rendezvous,
    *,
    venv: str = "/opt/srifty",
    workdir: str = "/opt/srifty/run",
    shutdown: bool = True,
    module: str = TRAINING_MODULE,
) -> str:
    """The shell script that starts this configuration's worker (``module``, given the
    plan's path: a training's ``worker.launch``, or a probe ring's probe worker) on a VM
    of ``group`` (installed in ``venv``): it writes the plan to ``workdir``, works out the
    VM's index and its first rank from its launch index, and runs torchrun. However the script ends
    (torchrun's exit, or a failure before it), it writes the exit marker into the plan's
    run folder (``write_exit_marker``; node ``g<first node>`` when the VM's index is not
    known yet) and, with ``shutdown``, shuts the VM down (EC2 then terminates it).
    ``SRIFTY_LAUNCH_INDEX`` and ``SRIFTY_PRIVATE_ADDRESS`` come from the environment when
    set, else from the instance metadata service (IMDSv2)."""
    text = plan if isinstance(plan, str) else json.dumps(plan)
    parsed = json.loads(text)
    world = plan_world_size(parsed)
    if world != rdzv.world_size:
        raise ConfigError(f"the plan has {world} ranks, the rendezvous {rdzv.world_size}")
    if group.first_rank + group.count * group.ranks_per_vm > world:
        raise ConfigError(f"node group {group} does not fit the plan's {world} ranks")
    if group.first_node + group.count > rdzv.nnodes:
        raise ConfigError(f"node group {group} does not fit {rdzv.nnodes} VMs")
    run_dir, config_id = str(parsed.get("run_dir", "")), str(parsed.get("config_id", "c0"))
    if not run_dir:
        raise ConfigError("the plan has no run_dir (where the VMs report their exit)")
    compact = json.dumps(parsed, separators=(",", ":"))
    plan_path = f"{workdir}/plan-{rdzv.run_id}.json"
    argv = torchrun_argv(
        rdzv,
        ranks=group.ranks_per_vm,
        host=rdzv.host or f"${{{ADDRESS_ENV}}}",
        local_addr=f"${{{ADDRESS_ENV}}}",
        is_host="${SRIFTY_IS_HOST}",
        plan_path=plan_path,
        torchrun=f"{venv}/bin/torchrun",
        module=module,
    )
    marker = " ".join(
        [
            shlex.quote(f"{venv}/bin/python"),
            "-m srifty_core.worker.rendezvous exit-marker",
            shlex.quote(run_dir),
            shlex.quote(config_id),
            f'"${{{NODE_INDEX_ENV}:-g{group.first_node}}}"',
            '"$code"',
        ]
    )
    token = "X-aws-ec2-metadata-token"
    lines = [
        "#!/bin/bash",
        f"# srifty worker start: rendezvous {rdzv.run_id}, VMs {group.first_node}.."
        f"{group.first_node + group.count - 1} of {rdzv.nnodes}",
        "set -euo pipefail",
        "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0  # workers use the agent's store",
        "finish() {",
        "  local code=$?",
        "  trap - EXIT",
        '  echo "srifty: worker start ended with code $code" >&2',
        f'  {marker} || echo "srifty: could not write the exit marker" >&2',
        *(["  shutdown -h now || echo 'srifty: shutdown failed' >&2"] if shutdown else []),
        '  exit "$code"',
        "}",
        "trap finish EXIT",
        "imds() {  # one metadata item; a clear error when the service gives none",
        "  local t v",
        f"  t=$({_CURL} -X PUT {_IMDS}/api/token -H '{token}-ttl-seconds: 300') || t=''",
        f'  v=$({_CURL} -H "{token}: $t" "{_IMDS}/meta-data/$1") || v=""',
        '  if [ -z "$v" ]; then',
        '    echo "srifty: the instance metadata service (169.254.169.254) gave no $1" >&2',
        "    return 3",
        "  fi",
        "  printf '%s' \"$v\"",
        "}",
        f'if [ -z "${{{LAUNCH_INDEX_ENV}:-}}" ]; then',
        f"  {LAUNCH_INDEX_ENV}=$(imds ami-launch-index) || exit 3",
        "fi",
        f'if [ -z "${{{ADDRESS_ENV}:-}}" ]; then {ADDRESS_ENV}=$(imds local-ipv4) || exit 3; fi',
        f'case "${LAUNCH_INDEX_ENV}" in',
        "  [0-9]|[1-9][0-9]|[1-9][0-9][0-9]) ;;",
        f"  *) echo \"srifty: bad launch index '${LAUNCH_INDEX_ENV}'\" >&2; exit 2 ;;",
        "esac",
        f'if [ "${LAUNCH_INDEX_ENV}" -ge {group.count} ]; then',
        f'  echo "srifty: launch index ${LAUNCH_INDEX_ENV} of {group.count} VM(s)" >&2; exit 2',
        "fi",
        f'case "${ADDRESS_ENV}" in',
        f'  ""|*[!A-Za-z0-9.-]*) echo "srifty: bad address ${ADDRESS_ENV}" >&2; exit 2 ;;',
        "esac",
        f"export {NODE_INDEX_ENV}=$(({group.first_node} + {LAUNCH_INDEX_ENV}))",
        f"export {RANK_OFFSET_ENV}=$(({group.first_rank} + {LAUNCH_INDEX_ENV} * "
        f"{group.ranks_per_vm}))",
        f'if [ "${NODE_INDEX_ENV}" -eq 0 ]; then SRIFTY_IS_HOST=true;',
        "else SRIFTY_IS_HOST=false; fi",
        f"mkdir -p {shlex.quote(workdir)}",
        f"printf '%s\\n' {shlex.quote(compact)} > {shlex.quote(plan_path)}",
        " ".join(_sh(a) for a in argv),  # not exec: finish() reports its exit code
    ]
    return "\n".join(lines) + "\n"


def _marker_config(config_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]", "_", config_id) or "_"


def write_exit_marker(run_dir: str, config_id: str, node: str, code: int) -> str:
    """Write ``exit-<config>-<node>.json`` (``{"code": code, "at": <Unix time>}``) into the
    run folder (a path, or a URI on the run storage); returns where."""
    import time

    if not re.fullmatch(r"g?[0-9]{1,4}", node):
        raise ConfigError(f"exit marker: node must be an index (or g<index>), got {node!r}")
    where = run_store.join(run_dir, f"{EXIT_PREFIX}{_marker_config(config_id)}-{node}.json")
    payload = {"code": int(code), "at": time.time(), "node": node, "config_id": config_id}
    return str(run_store.write_text(where, json.dumps(payload) + "\n"))


def exit_markers(run_dir: str, config_id: str) -> dict[str, int]:
    """The exit codes the configuration's VMs reported (``write_exit_marker``), by node
    (``"0"``, ``"1"``, ..., or ``"g<first node>"`` for a VM that failed before it knew its
    index); empty while every VM still trains, or where workers are not started by
    ``start_script`` (the local provider)."""
    prefix = f"{EXIT_PREFIX}{_marker_config(config_id)}-"
    out: dict[str, int] = {}
    for name in run_store.names(run_dir, f"{prefix}*.json"):
        text = run_store.read_text(run_store.join(run_dir, name))
        if text is None:
            continue
        try:
            code = int(json.loads(text)["code"])
        except (ValueError, KeyError, TypeError):
            code = -1  # a marker that cannot be read still says the VM ended
        out[name[len(prefix) : -len(".json")]] = code
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m srifty_core.worker.rendezvous exit-marker RUN_DIR CONFIG NODE CODE``:
    what the start script runs once torchrun ends."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 5 or args[0] != "exit-marker" or not args[4].lstrip("-").isdigit():
        print(
            "usage: python -m srifty_core.worker.rendezvous exit-marker RUN_DIR CONFIG NODE CODE",
            file=sys.stderr,
        )
        return 2
    print(
        f"srifty: wrote {write_exit_marker(args[1], args[2], args[3], int(args[4]))}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
