"""Atomic file writes: a reader sees the old file or the new one, never half of one; and
append-only logs that a kill mid-line does not wedge."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[IO[bytes]]:
    """A binary file on a temporary beside ``path`` (folders made), renamed over ``path``
    when the block ends; on any failure the temporary file is removed and ``path``
    untouched. An ``OSError`` without a file name (a full disk while writing) is raised
    again naming ``path``, so that it reads as what it is (``srifty``: one line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.filename is None and exc.errno is not None:
            why = exc.strerror or os.strerror(exc.errno)
            raise OSError(exc.errno, why, str(path)) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, then rename
    it over ``path``; on any failure the temporary file is removed and ``path`` untouched.
    The text is written verbatim (UTF-8, no newline translation)."""
    with replacing(path) as fh:
        fh.write(text.encode("utf-8"))
    return path


def open_for_append(path: Path) -> IO[str]:
    """``path`` opened to append lines, after cutting a torn last line off (one a kill
    left without its newline): appending onto it would glue the next record to the broken
    one and make a line that is neither, which every later reader refuses. Whole lines
    are never touched."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError), open(path, "rb+") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size:
            fh.seek(size - 1)
            if fh.read(1) != b"\n":
                keep = _after_last_newline(fh, size)
                fh.truncate(keep)
    return open(path, "a", encoding="utf-8")


def _after_last_newline(fh: IO[bytes], size: int, chunk: int = 1 << 16) -> int:
    """The offset just after the last newline of a file of ``size`` bytes (0: none)."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        fh.seek(start)
        block = fh.read(end - start)
        k = block.rfind(b"\n")
        if k >= 0:
            return start + k + 1
        end = start
    return 0
