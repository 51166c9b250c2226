"""Files a person names on the command line for a command to write (``plan --write-plan``
and ``--frontier``, ``profile --out`` and ``--plot``): one check and one way to write for
all of them.

An output is ``-`` (standard output), a regular file that is there (replaced atomically:
``atomic.replacing``, or, through a symbolic link, the file it points to) or a new file in
a folder that is there. Anything else is a ``ConfigError`` naming the option, before the
command does its work: an empty name, a folder, a device, a FIFO or a socket (never
replaced by a regular file, as a rename would), a dangling link, a folder that is not
there. A write the machine refuses (a full disk, no permission) is a ``ConfigError``
naming the option and the path, one line, and leaves what was there untouched.
"""

from __future__ import annotations

import os
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from srifty_core.atomic import replacing
from srifty_core.errors import ConfigError

STDOUT = "-"
"""The name of standard output as an output path."""

_KINDS = (
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISFIFO, "FIFO (named pipe)"),
    (stat.S_ISSOCK, "socket"),
)


@dataclass(frozen=True, slots=True)
class Output:
    """Where one option's output goes: ``path``, or standard output where ``None``."""

    option: str
    path: Path | None

    @property
    def to_stdout(self) -> bool:
        return self.path is None

    def __str__(self) -> str:
        return "standard output" if self.path is None else str(self.path)

    def write(self, data: str | bytes) -> str:
        """Write ``data`` (text as UTF-8): to standard output, or to the path through a
        temporary file renamed over it (the path checked again first: what is there now).
        Returns where it went, for a message."""
        raw = data.encode("utf-8") if isinstance(data, str) else data
        if self.path is None:
            sys.stdout.flush()
            sys.stdout.buffer.write(raw)
            sys.stdout.buffer.flush()
            return str(self)
        target = check_path(self.path, self.option)
        try:
            with replacing(target) as fh:
                fh.write(raw)
                os.fchmod(fh.fileno(), _mode(target))
        except OSError as exc:
            why = exc.strerror or str(exc)
            raise ConfigError(f"{self.option}: cannot write {self.path}: {why}") from None
        return str(self)

    def write_with(self, make: Callable[[Path], object], suffix: str = ".png") -> str:
        """For a writer that takes a path (a figure): ``make`` writes into a temporary
        file (named like the output, so the suffix picks the format; ``suffix`` for
        standard output), whose bytes then go where ``write`` puts them."""
        name = self.path.name if self.path is not None else f"output{suffix}"
        with tempfile.TemporaryDirectory(prefix="srifty-output-") as tmp:
            made = Path(tmp) / name
            make(made)
            return self.write(made.read_bytes())


def output(value: str | None, option: str) -> Output | None:
    """The output an option names (``None`` when not given); ``ConfigError`` naming
    ``option`` for anything Srifty must not write to (see the module doc)."""
    if value is None:
        return None
    if value == STDOUT:
        return Output(option, None)
    if not value.strip():
        raise ConfigError(f"{option}: an empty path; name a file, or - for standard output")
    path = Path(value)
    check_path(path, option)
    return Output(option, path)


def answer_stream(*outs: Output | None) -> TextIO:
    """Where a command prints its answer: standard error when one of ``outs`` is standard
    output (so that what goes there is that output alone), else standard output. Two
    outputs to standard output is a ``ConfigError`` naming the second."""
    on = [o for o in outs if o is not None and o.to_stdout]
    if len(on) > 1:
        raise ConfigError(
            f"{on[1].option}: standard output already carries {on[0].option}; name a file"
        )
    return sys.stderr if on else sys.stdout


def check_path(path: Path, option: str) -> Path:
    """``path`` if it is a regular file or a new file in a folder that is there, the file a
    link points to if it is a link to a regular file; else a ``ConfigError`` naming
    ``option`` and what is there."""
    try:
        st = os.stat(path)  # through links: what a write would reach
    except FileNotFoundError:
        if os.path.lexists(path):
            raise ConfigError(
                f"{option}: {path} is a symbolic link to nothing; name a regular file"
            ) from None
        parent = path.parent
        if not parent.is_dir():
            what = "is not a folder" if parent.exists() else "does not exist"
            raise ConfigError(
                f"{option}: the folder {parent} {what}; a new file goes into a folder that is there"
            ) from None
        return path
    except NotADirectoryError:
        raise ConfigError(f"{option}: {path}: a part of the path is not a folder") from None
    except OSError as exc:
        raise ConfigError(f"{option}: {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{option}: {path} is a folder; name a file")
    if not stat.S_ISREG(st.st_mode):
        kind = next((name for test, name in _KINDS if test(st.st_mode)), "special file")
        raise ConfigError(
            f"{option}: {path} is a {kind}, not a regular file; outputs go to regular files "
            "(or - for standard output)"
        )
    return Path(os.path.realpath(path)) if path.is_symlink() else path


def _mode(path: Path) -> int:
    """The permissions a written output gets: those of the file it replaces, else what a
    new file gets under the umask (not the temporary file's 0600)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask
