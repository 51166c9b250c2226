"""Start one rank of a plan: the built-in worker or your own training script.

``python -m srifty_core.worker.launch PLAN.json`` is what every launcher runs on every
rank (the local provider, ``srifty train``, the plan-and-train DAG, torchrun on a VM):
it reads the plan and the launcher's ``RANK``/``WORLD_SIZE`` (``placement.plan_rank``),
puts this rank's share of the plan in the environment (``rank_env``) and replaces itself
with the plan's ``entrypoint`` (your command, e.g. ``python train.py --lr 0.1``) or, when
the plan has none, the built-in worker (``python -m srifty_core.worker.worker PLAN``).
A leading ``python`` or ``python3`` runs as this interpreter, so a script sees the same
environment Srifty runs in. ``srifty_core.worker.user`` is the library side: it reads
these variables.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

from srifty_core.batches import loss_scale
from srifty_core.errors import ConfigError
from srifty_core.lifetime import die_with_caller
from srifty_core.planner.schema.train_plan import TrainPlan
from srifty_core.worker.placement import plan_rank

PLAN_ENV = "SRIFTY_PLAN"
"""The plan file's path (or URI)."""
ENV_NAMES = (
    PLAN_ENV,
    "SRIFTY_PLAN_RANK",
    "SRIFTY_WORLD_SIZE",
    "SRIFTY_LOCAL_BATCH",
    "SRIFTY_GLOBAL_BATCH",
    "SRIFTY_BATCH_OFFSET",
    "SRIFTY_LOSS_SCALE",
    "SRIFTY_ITERATIONS",
    "SRIFTY_RUN_DIR",
    "SRIFTY_CHECKPOINT",
    "SRIFTY_CHECKPOINT_EVERY",
    "SRIFTY_CONFIG_ID",
    "SRIFTY_SEED",
)
"""What a rank finds in its environment (``rank_env``)."""


def rank_env(plan: TrainPlan, plan_path: str, rank: int) -> dict[str, str]:
    """This rank's share of ``plan``: its local batch, where its slice of each global batch
    starts, the loss scale ``world_size * b_rank / B_global`` (after DDP's average over
    ranks every sample weighs ``1 / B_global``), the run folder and the checkpoint to
    resume from (it may not exist yet)."""
    if not 0 <= rank < plan.world_size:
        raise ConfigError(f"rank {rank} is outside the plan's {plan.world_size} local batches")
    return {
        PLAN_ENV: plan_path,
        "SRIFTY_PLAN_RANK": str(rank),
        "SRIFTY_WORLD_SIZE": str(plan.world_size),
        "SRIFTY_LOCAL_BATCH": str(plan.local_batches[rank]),
        "SRIFTY_GLOBAL_BATCH": str(plan.global_batch),
        "SRIFTY_BATCH_OFFSET": str(sum(plan.local_batches[:rank])),
        "SRIFTY_LOSS_SCALE": repr(loss_scale(plan.local_batches, rank) if plan.reweight else 1.0),
        "SRIFTY_ITERATIONS": str(plan.iterations),
        "SRIFTY_RUN_DIR": str(plan.run_dir),
        "SRIFTY_CHECKPOINT": str(plan.checkpoint_path),
        "SRIFTY_CHECKPOINT_EVERY": str(plan.checkpoint_every),
        "SRIFTY_CONFIG_ID": plan.config_id,
        "SRIFTY_SEED": str(plan.seed),
    }


def command(plan: TrainPlan, plan_path: str) -> list[str]:
    """What this rank runs: the plan's entrypoint, else the built-in worker."""
    if not plan.entrypoint:
        return [sys.executable, "-m", "srifty_core.worker.worker", plan_path]
    argv = list(plan.entrypoint)
    if argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    return argv


def launch_argv(plan_path: str) -> list[str]:
    """The launcher's command line for one rank (what providers start)."""
    return [sys.executable, "-m", "srifty_core.worker.launch", plan_path]


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m srifty_core.worker.launch PLAN.json", file=sys.stderr)
        return 2
    env = dict(os.environ if env is None else env)
    try:
        plan = TrainPlan.load(args[0])
        rank = plan_rank(env)
        extra = rank_env(plan, args[0], rank)
    except (ConfigError, FileNotFoundError) as exc:
        print(f"launch: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:
        print(f"launch: environment variable {exc.args[0]} is not set", file=sys.stderr)
        return 2
    cmd = command(plan, args[0])
    # SIGTERM when the launcher's caller dies; it survives the exec, so your script stops
    # (``worker.user`` checkpoints on SIGTERM) instead of training on as an orphan beside
    # a rerun of the job
    die_with_caller()
    try:
        os.execvpe(cmd[0], cmd, {**env, **extra})
    except OSError as exc:
        print(f"launch: cannot run {cmd[0]!r}: {exc.strerror}", file=sys.stderr)
        return 127
    return 0  # pragma: no cover - exec does not return


if __name__ == "__main__":
    sys.exit(main())
