"""The profile store: one JSON file per (model, size, device type) under the data folder.

Layout: ``<data dir>/profiles/<model>/<size>/<device type>.json``. Writes are atomic
(temporary file, then rename): a reader never sees half a profile, and a rerun replaces it.
"""

from __future__ import annotations

import re
from pathlib import Path

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.profiling.profile import ComputeProfile

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


class ProfileNotFoundError(SriftyError, LookupError):
    def __str__(self) -> str:
        return str(self.args[0])


def _safe(part: str) -> str:
    return _SAFE.sub("_", part)


class ProfileStore:
    """Read and write compute profiles in ``root`` (default ``<data dir>/profiles``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or paths.profiles_dir()

    def path(self, model: str, size: str, device_type: str) -> Path:
        return self.root / _safe(model) / _safe(size) / f"{_safe(device_type)}.json"

    def save(self, profile: ComputeProfile) -> Path:
        """Write ``profile`` to its place in the store."""
        return self.save_to(profile, self.path(profile.model, profile.size, profile.device_type))

    @staticmethod
    def save_to(profile: ComputeProfile, path: Path) -> Path:
        """Write ``profile`` to ``path`` atomically."""
        return write_text_atomic(path, profile.to_json())

    def load(self, model: str, size: str, device_type: str) -> ComputeProfile:
        path = self.path(model, size, device_type)
        if not path.is_file():
            have = [f"{p.parent.parent.name}/{p.parent.name}/{p.stem}" for p in self.list_paths()]
            raise ProfileNotFoundError(
                f"no compute profile for {model}/{size} on {device_type} in {self.root} "
                f"(have: {', '.join(have) or 'none'}); run `srifty profile --model {model}` or "
                f"the srifty_profile_model DAG"
            )
        return ComputeProfile.from_json(path.read_text(encoding="utf-8"))

    def list_paths(self) -> list[Path]:
        return sorted(self.root.glob("*/*/*.json")) if self.root.is_dir() else []

    def vm_spreads(self) -> dict[str, tuple[float, int]]:
        """``{"model/size/device": (vm_cv, VMs profiled)}`` of every stored profile taken
        on two VMs or more: what the store knows about how much one VM's speed differs from
        the next (``Workload.vm_evidence``). A file that does not read as a profile is
        named in the error."""
        out: dict[str, tuple[float, int]] = {}
        for path in self.list_paths():
            try:
                p = ComputeProfile.from_json(path.read_text(encoding="utf-8"))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(f"{path}: not a compute profile ({exc})") from exc
            if p.profiled_vms >= 2:
                out[p.store_key] = (p.vm_cv, p.profiled_vms)
        return out
