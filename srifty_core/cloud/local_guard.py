"""The guard of one local allocation: releases it when the process that runs its workers
dies without releasing it (``python -m srifty_core.cloud.local_guard STATE_DIR ID``).

``LocalProvider.run`` starts one for an allocation whose workers are tied to their caller
(``lifetime.caller_env``), with a pipe from the caller on its standard input and in a
session of its own (a signal to the caller's process group leaves it running). The pipe
ends when the caller ends, however it ends (the kernel closes it, even after SIGKILL): if
the caller said ``keep`` first (it released the allocation itself), the guard just exits;
otherwise it releases the allocation (``LocalProvider.release``: SIGTERM to the workers,
SIGKILL to what still runs after the grace period, the instances marked terminated in the
state file). The workers' own parent-death signal (``lifetime.die_with_caller``) is
SIGTERM, which a rank stuck in a long step or a script that ignores it outlives; this is
what stops those.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from srifty_core.cloud.local import GUARD_KEEP, LocalProvider


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m srifty_core.cloud.local_guard STATE_DIR ALLOCATION_ID",
              file=sys.stderr)  # fmt: skip
        return 2
    state_dir, alloc_id = args
    for sig in (signal.SIGINT, signal.SIGHUP):  # a terminal's Ctrl-C or hang-up is the caller's
        signal.signal(sig, signal.SIG_IGN)
    said = sys.stdin.buffer.read().split()  # until the caller closes the pipe or dies
    if said[-1:] == [GUARD_KEEP]:
        return 0
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"{stamp} guard: the caller ended without releasing {alloc_id}; releasing it",
          flush=True)  # fmt: skip
    LocalProvider(Path(state_dir)).release(alloc_id)
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')} guard: released {alloc_id}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
