"""Headless matplotlib for the plots jobs write (profiles, frontiers, fits, timelines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from srifty_core.atomic import replacing


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display needed); imported on use."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: Path, *, dpi: int = 110) -> Path:
    """Lay out ``fig``, write it to ``path`` (folders made; in the format its suffix names,
    png by default) through a temporary file renamed over it, so that a failed or killed
    write leaves the previous picture whole, and close it; returns ``path``."""
    try:
        fig.tight_layout()
        with replacing(path) as fh:
            fig.savefig(fh, dpi=dpi, format=path.suffix.lstrip(".").lower() or "png")
    finally:
        pyplot().close(fig)
    return path
