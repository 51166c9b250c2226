"""The one progress convention of long commands: a live bar on a terminal, one plain line
per stage (and a heartbeat) anywhere else."""

from __future__ import annotations

import io
import time

from srifty_core.console import StageProgress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_each_stage_is_one_plain_line() -> None:
    out = io.StringIO()
    with StageProgress("profile m", stream=out, heartbeat_s=3600) as progress:
        progress("B_max search: batch 1 fits", 1, 0)
        progress("B_max search: batch 2 fits", 2, 0)
        progress("latency sweep: batch 1", 0, 4)
        progress("latency sweep: batch 8", 1, 4)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("profile m: B_max search: batch 1 fits [")
    assert lines[1].startswith("profile m: latency sweep: batch 1 (0/4) [")
    assert lines[2].startswith("profile m: done [") and len(lines) == 3
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_a_long_stage_gets_a_heartbeat_line() -> None:
    out = io.StringIO()
    progress = StageProgress("probe", stream=out, heartbeat_s=0.0)
    progress("sweep: 4 B", 1, 9)
    progress("sweep: 8 B", 2, 9)
    progress.close()
    assert len(out.getvalue().splitlines()) == 3  # two heartbeats and the end


def test_a_failed_command_prints_no_done_line() -> None:
    out = io.StringIO()
    try:
        with StageProgress("train", stream=out) as progress:
            progress("starting", 0, 0)
            raise ValueError("boom")
    except ValueError:
        pass
    assert "done" not in out.getvalue()


def test_on_a_terminal_the_clock_runs_between_updates() -> None:
    out = _Tty()
    progress = StageProgress("profile m", stream=out)
    progress("B_max search: batch 512", 3, 0)
    first = out.getvalue()
    time.sleep(2.2)
    later = out.getvalue()
    progress.close()
    assert "B_max search: batch 512" in first
    assert len(later) > len(first)  # redrawn by the ticker with a newer elapsed time
    assert "\r" in later
