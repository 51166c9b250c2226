"""Progress of long commands, one convention for all of them (``srifty profile``,
``srifty probe``, ``srifty train``).

On a terminal: a live bar with the current stage, its detail (``B_max search: batch 512``),
the count where there is one and a clock that keeps running between updates. Anywhere else
(a log, a pipe, CI): one line when a stage starts, one more at most every ``heartbeat_s``
while it goes on, and one when the command ends; no control characters.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Iterator
from typing import IO, Any


class StageProgress:
    """``progress(stage, done, total)`` for a long command titled ``title``; ``stage`` may
    carry a detail after a colon (``"latency sweep: batch 64"``); ``total`` 0: no count.
    Use as a context manager, or call ``close``."""

    def __init__(
        self,
        title: str,
        *,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        heartbeat_s: float = 30.0,
        disable: bool = False,
    ) -> None:
        self.title = title
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.heartbeat_s = heartbeat_s
        self.disable = disable
        self.started = time.monotonic()
        self._stage = ""
        self._last_line = -float("inf")
        self._bar: Any = None
        self._ticker: threading.Thread | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()

    def __enter__(self) -> StageProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close(ok=exc[0] is None)

    def elapsed(self) -> str:
        s = time.monotonic() - self.started
        return f"{s:.0f}s" if s < 120 else f"{s // 60:.0f}m{s % 60:02.0f}s"

    def __call__(self, stage: str, done: int = 0, total: int = 0) -> None:
        if self.disable:
            return
        with self._lock:
            if self.tty:
                self._draw(stage, done, total)
                return
            name = stage.split(":", 1)[0]
            now = time.monotonic()
            if name != self._stage.split(":", 1)[0] or now - self._last_line >= self.heartbeat_s:
                count = f" ({done}/{total})" if total else ""
                print(f"{self.title}: {stage}{count} [{self.elapsed()}]", file=self.stream)
                self.stream.flush()
                self._last_line = now
            self._stage = stage

    def _draw(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if self._bar is None:
            self._bar = tqdm(total=total or None, file=self.stream, leave=False, unit="step")
            self._ticker = threading.Thread(target=self._tick, daemon=True)
            self._ticker.start()
        self._bar.set_description_str(f"{self.title}: {stage}", refresh=False)
        self._bar.total = total or None
        self._bar.n = done
        self._bar.refresh()
        self._stage = stage

    def _tick(self) -> None:
        while not self._done.wait(1.0):  # the clock runs while a step takes its time
            with self._lock:
                if self._bar is not None:
                    self._bar.refresh()

    def close(self, ok: bool = True) -> None:
        self._done.set()
        with self._lock:
            if self._bar is not None:
                self._bar.close()
                self._bar = None
            if not self.disable and not self.tty and self._stage and ok:
                print(f"{self.title}: done [{self.elapsed()}]", file=self.stream)
                self.stream.flush()


@contextlib.contextmanager
def still_running(
    text: str, after_s: float = 30.0, stream: IO[str] | None = None
) -> Iterator[None]:
    """Say ``text`` on ``stream`` (standard error) if the block is still running after
    ``after_s`` seconds, once, with how to stop it: for a step that runs someone's code
    and may never return (a model factory that hangs), which would otherwise print
    nothing. A block that ends sooner prints nothing (its error stays one line)."""
    out = stream or sys.stderr
    done = threading.Event()

    def notice() -> None:
        if not done.wait(after_s):
            print(f"srifty: {text}: still running after {after_s:g} s (Ctrl-C stops it)", file=out)
            out.flush()

    ticker = threading.Thread(target=notice, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()
