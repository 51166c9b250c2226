"""The profile store: one JSON file per (model, size, device type, training settings)
under the data folder.

Layout: ``<data dir>/profiles/<model key>/<size>/<device type><settings suffix>.json``: the
model key is ``workloads.model_key`` of the reference (a zoo name as it is, a factory or
``hf:`` reference as a stem and a digest), the suffix ``TrainingSettings.suffix`` (empty
for fp32 SGD, ``@adamw+bf16`` otherwise). Writes are atomic (temporary file, then rename):
a reader never sees half a profile, and a rerun replaces it.

The shipped reference profiles (``srifty_core/shipped/reference_profiles/``, one
``<model>.json`` and its ``<model>.meta.json`` each) are read with ``load_reference_profile``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.atomic import write_text_atomic
from srifty_core.catalog import Catalog, devices
from srifty_core.console import still_running
from srifty_core.errors import ConfigError, SriftyError
from srifty_core.profiling import estimate
from srifty_core.profiling.layout import model_folder, safe
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from srifty_core.workloads import parse_model


class ProfileNotFoundError(SriftyError, LookupError):
    def __str__(self) -> str:
        return str(self.args[0])


class ProfileStore:
    """Read and write compute profiles in ``root`` (default ``<data dir>/profiles``)."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or paths.profiles_dir()

    def path(
        self,
        model: str,
        size: str,
        device_type: str,
        settings: TrainingSettings = DEFAULT_SETTINGS,
    ) -> Path:
        name = f"{safe(device_type)}{settings.suffix}"  # the suffix's characters are fixed
        return model_folder(self.root, model, size) / f"{name}.json"

    def save(self, profile: ComputeProfile) -> Path:
        """Write ``profile`` to its place in the store."""
        return self.save_to(
            profile,
            self.path(profile.model, profile.size, profile.device_type, profile.settings),
        )

    @staticmethod
    def save_to(profile: ComputeProfile, path: Path) -> Path:
        """Write ``profile`` to ``path`` atomically."""
        return write_text_atomic(path, profile.to_json())

    def load(
        self,
        model: str,
        size: str,
        device_type: str,
        settings: TrainingSettings = DEFAULT_SETTINGS,
    ) -> ComputeProfile:
        path = self.path(model, size, device_type, settings)
        if not path.is_file():
            before = self._before_variants(model, size, device_type, settings)
            if before is not None:
                return before
            have = [f"{p.parent.parent.name}/{p.parent.name}/{p.stem}" for p in self.list_paths()]
            raise ProfileNotFoundError(
                f"no compute profile for {model}/{size} on {device_type}"
                f"{' (' + settings.label() + ')' if not settings.is_default else ''} in "
                f"{self.root} (have: {', '.join(have) or 'none'}); "
                f"{profile_hint(model, size, device_type, settings)}"
            )
        return self.read(path)

    def _before_variants(
        self, model: str, size: str, device_type: str, settings: TrainingSettings
    ) -> ComputeProfile | None:
        """A profile stored before GPU variants were told apart is named by the GPU model
        alone (``V100.json``): it serves the variant its device name states (``Tesla
        V100-SXM2-16GB`` is a ``V100-16GB``). One whose name does not say is an error naming
        the rename that keeps it; ``None`` where there is none, or it is another variant's."""
        gpu = devices.model_of(device_type)
        old = self.path(model, size, gpu, settings) if gpu is not None else None
        if old is None or not old.is_file():
            return None
        profile = self.read(old)
        variant = devices.device_type_of_name(profile.device_name)
        if variant is None:
            new = self.path(model, size, device_type, settings)
            raise ConfigError(
                f"{old}: a {gpu} profile from before GPU variants were told apart, and its "
                f"device name {profile.device_name!r} does not say which {gpu} it measured; "
                f"if a {device_type}, rename it to {new.name} and set its device_type to "
                f"{device_type!r}"
            )
        if variant != device_type:
            return None
        return dataclasses.replace(profile, device_type=device_type)

    def read(self, path: Path) -> ComputeProfile:
        """The profile in ``path``, checked: its numbers (``ComputeProfile.check``) and that
        it is the profile the store keeps there (model, size, device type and training
        settings agree with the path; a T4 profile copied to ``V100.json`` is refused). A
        file that is not one is a ``ConfigError`` naming it, one line."""
        profile = read_profile(path)
        try:
            home = self.path(profile.model, profile.size, profile.device_type, profile.settings)
        except ConfigError as exc:
            raise ConfigError(f"{path}: not a compute profile ({exc})") from exc
        if home != path:
            raise ConfigError(
                f"{path}: holds the profile of {profile.store_key} (device "
                f"{profile.device_type}, size {profile.size}), which belongs at {home}; "
                "a profile is used only for the device, model, size and settings it measured"
            )
        return profile

    def load_or_estimate(
        self,
        model: str,
        size: str,
        device_type: str,
        settings: TrainingSettings = DEFAULT_SETTINGS,
        *,
        catalog: Any = None,
    ) -> ComputeProfile:
        """The measured profile, or, where there is none and ``device_type`` is a GPU the
        catalog has a sheet for, one estimated from the model's operator census
        (``profiling.estimate``: scaled from a measured GPU profile of the model, else from
        the specs; ``ComputeProfile.estimate`` says which). A CPU or an unknown device
        without a profile is the ``load`` error with its hint."""
        try:
            return self.load(model, size, device_type, settings)
        except ProfileNotFoundError as missing:
            if device_type == "cpu" or device_type.startswith("local"):
                raise
            cat = catalog if catalog is not None else Catalog.load()
            if estimate.device_spec(cat, device_type) is None:
                raise
            try:
                # the census builds the model: a factory that hangs says so
                with still_running(f"estimating {model}/{size} on {device_type}"):
                    return estimate.estimate(
                        model, size, device_type, settings, catalog=cat, store=self
                    )
            except ConfigError as exc:
                raise ProfileNotFoundError(f"{missing}; no estimate either: {exc}") from exc

    def list_paths(self) -> list[Path]:
        """Every stored profile file (not the operator censuses kept beside them)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob("*/*/*.json") if not p.stem.startswith("census"))

    def vm_spreads(self) -> dict[str, tuple[float, int]]:
        """``{"model/size/device": (vm_cv, VMs profiled)}`` of every stored profile taken
        on two VMs or more: what the store knows about how much one VM's speed differs from
        the next (``Workload.vm_evidence``). A file that does not read as a profile is
        named in the error."""
        out: dict[str, tuple[float, int]] = {}
        for path in self.list_paths():
            p = self.read(path)
            if p.profiled_vms >= 2:
                out[p.store_key] = (p.vm_cv, p.profiled_vms)
        return out


def read_profile(path: Path) -> ComputeProfile:
    """The compute profile in the file ``path``, its numbers checked
    (``ComputeProfile.from_dict``); anything else (not UTF-8, not JSON, not a profile, a
    NaN or negative time, B_max 0, no gradient bucket) is a ``ConfigError`` naming the
    file, one line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text; not a compute profile") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the compute profile ({exc.strerror})") from None
    try:
        return ComputeProfile.from_json(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except ConfigError as exc:
        raise ConfigError(f"{path}: not a compute profile ({exc})") from None


def reference_profile_paths(model: str, directory: Path | None = None) -> tuple[Path, Path]:
    """``(<model>.json, <model>.meta.json)`` under ``directory`` (default the shipped
    ``srifty_core/shipped/reference_profiles/``)."""
    d = directory or paths.REFERENCE_PROFILES_DIR
    return d / f"{model}.json", d / f"{model}.meta.json"


def load_reference_profile(
    model: str, directory: Path | None = None
) -> tuple[ComputeProfile, dict[str, Any]]:
    """The model's reference compute profile, its numbers checked (``read_profile``: a bad
    file is a ``ConfigError`` naming it), and how it was made (its ``.meta.json``)."""
    path, meta_path = reference_profile_paths(model, directory)
    if not (path.is_file() and meta_path.is_file()):
        raise ConfigError(
            f"no reference profile of {model} in {path.parent} (make it with "
            "benchmarks/case_studies.py --reprofile)"
        )
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ConfigError(f"{meta_path}: not JSON ({exc})") from None
    return read_profile(path), meta


def profile_hint(
    model: str, size: str, device_type: str, settings: TrainingSettings = DEFAULT_SETTINGS
) -> str:
    """The command that would make the missing profile, where it must run."""
    try:
        parse_model(model)
    except ConfigError as exc:
        return (
            f"{model!r} is a stored name, not a model Srifty can build ({exc}); profile the "
            "model under its reference"
        )
    flags = profile_flags(model, size, settings)
    if device_type == "cpu":
        return f"run `srifty profile {flags} --device cpu` or the srifty_profile_model DAG"
    return (
        f"run `srifty profile {flags} --device cuda` on a machine with a {device_type} GPU "
        f"(and copy the file to {device_type}{settings.suffix}.json here), or the "
        "srifty_profile_model DAG on a worker with one"
    )


def profile_flags(model: str, size: str, settings: TrainingSettings = DEFAULT_SETTINGS) -> str:
    """``srifty profile``'s flags for this model, size and training settings."""
    flags = f"--model {model} --size {size}"
    if settings.optimizer != "sgd":
        flags += f" --optimizer {settings.optimizer}"
    if settings.precision != "fp32":
        flags += f" --precision {settings.precision}"
    if settings.compile:
        flags += " --compile"
    if settings.channels_last:
        flags += " --channels-last"
    if settings.tf32:
        flags += " --tf32"
    return flags


def cloud_profile_command(
    model: str, size: str, settings: TrainingSettings, instance_types: list[str]
) -> str:
    """The ``srifty profile`` command that profiles the model on one VM of each of
    ``instance_types`` on EC2 (``jobs.profile_vms``)."""
    types = " ".join(f"--instance-type {t}" for t in instance_types)
    return f"srifty profile {profile_flags(model, size, settings)} --provider ec2 {types}"
