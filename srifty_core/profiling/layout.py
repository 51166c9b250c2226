"""Where a model's files live in a profile store: one folder per model and size, holding
a profile per device (``profiling.store``) and the operator census beside them
(``profiling.census``). Both read the layout here, so neither imports the other."""

from __future__ import annotations

import re
from pathlib import Path

from srifty_core.workloads import model_key

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe(part: str) -> str:
    """``part`` with every character a file name should not hold replaced by ``_``."""
    return _SAFE.sub("_", part)


def model_folder(root: Path, model: str, size: str) -> Path:
    """The folder of ``model``/``size`` in the store ``root``."""
    return root / safe(model_key(model)) / safe(size)
