"""Profiles of GPUs nobody profiled yet: what planning reads when the store has no measured
profile of a model on an offered GPU (``ProfileStore.load_or_estimate``).

The estimate comes from the model's operator census (``profiling.census``) and the GPU's
sheet in the catalog, through the roofline (``predictors.roofline``) fitted on every
measurement there is: the shipped H200 profiles, the store's measured GPU profiles of any
model, and the published single-GPU training throughput shipped with the package
(``shipped/reference/public_training_throughput.csv``, rows whose GPU variant the catalog's
sheet describes and whose network has a census). Where the store has a measured profile of
the same model on another GPU, the estimate is scaled from it; else it is from the specs.
The fit is kept in the store (``roofline.json``, keyed by a digest of its evidence), so
only the first plan after new evidence pays for it (about 2-3 s here).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from srifty_core.atomic import write_text_atomic
from srifty_core.errors import ConfigError
from srifty_core.predictors.roofline import DeviceSpec, Observation, Roofline, learn
from srifty_core.profiling.census import load_census
from srifty_core.profiling.census_count import counted_precision
from srifty_core.profiling.profile import ComputeProfile
from srifty_core.profiling.roofline_profile import (
    estimate_profile,
    nearest_measured,
    profile_observations,
)
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings

if TYPE_CHECKING:
    from srifty_core.catalog import Catalog
    from srifty_core.profiling.census import OpCensus
    from srifty_core.profiling.store import ProfileStore

SHIPPED = Path(__file__).resolve().parent.parent / "shipped"
PUBLIC_THROUGHPUT = SHIPPED / "reference" / "public_training_throughput.csv"
GPU_PROFILES = SHIPPED / "reference_profiles" / "gpu"
SQUAD = "srifty_core.profiling.reference_models:bert_base_squad"

PUBLIC_VARIANTS = {
    "V100 SXM2 16GB": "Tesla V100 SXM2 16GB",
    "V100 SXM2 16GB (DGX-1)": "Tesla V100 SXM2 16GB",
    "V100 SXM2 32GB (DGX-1)": "Tesla V100 SXM2 32GB",
    "V100 SXM3 32GB": "Tesla V100 SXM2 32GB",
    "V100 SXM3 32GB (DGX-2)": "Tesla V100 SXM2 32GB",
    "A100 SXM4 40GB (DGX A100)": "A100 SXM4 40GB",
    "A100 PCIe 40GB": "A100 SXM4 40GB",
    "A100 SXM4 80GB": "A100 SXM4 80GB",
    "A100 SXM4 80GB (DGX A100)": "A100 SXM4 80GB",
    "H100 SXM5 80GB": "H100 SXM5 80GB",
    "H200 SXM 141GB": "H200 SXM 141GB",
}
"""A published row's GPU variant -> the catalog's variant whose sheet (peaks, memory
bandwidth) it has: SXM3 V100s and the 40 GB PCIe A100 share their SXM siblings' figures.
Rows of GPUs the catalog does not carry use ``gpu_sheets.csv`` where it has their sheet
(A10, H100 PCIe, A100 PCIe 80GB); the rest (A6000, Ada, GH200, Blackwell) are not used."""


FUSED_IMPLEMENTATIONS = frozenset({"bert_base_squad"})
"""Published networks (the table's ``model``) whose implementation fuses the elementwise
operators that eager PyTorch, and so the census, runs one by one: NVIDIA's BERT
(``run_squad.py``: apex's fused LayerNorm, the fused bias-GELU, the fused softmax). Their
rows are ``Observation.fused``; how much traffic fusion saves is learned
(``Efficiencies.fused``)."""

GPU_SHEETS = SHIPPED / "reference" / "gpu_sheets.csv"
"""Sheets of GPUs with published rows that the catalog does not carry (evidence only)."""


def evidence_specs(catalog: Catalog, path: Path = GPU_SHEETS) -> dict[str, DeviceSpec]:
    """Per published GPU variant, its sheet: the catalog's (``PUBLIC_VARIANTS``) and the
    shipped extra sheets (``gpu_sheets.csv``) of GPUs the catalog does not carry."""
    specs = device_specs(catalog)
    out = {public: specs[ours] for public, ours in PUBLIC_VARIANTS.items() if ours in specs}
    with path.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            out[r["gpu_variant"]] = DeviceSpec(
                name=r["gpu"],
                fp32_flops=float(r["fp32_tflops"]) * 1e12,
                memory_bytes_per_s=float(r["memory_bw_gbs"]) * 1e9,
                memory_gib=float(r["memory_gb"]) * 1e9 / 2**30,
                tf32_flops=float(r["tf32_tflops"]) * 1e12,
                fp16_flops=float(r["fp16_tensor_tflops"]) * 1e12,
                variant=r["gpu_variant"],
            )
    return out


def device_specs(catalog: Catalog) -> dict[str, DeviceSpec]:
    """Per catalog GPU variant, its sheet with the smallest usable memory of the instance
    types that carry it."""
    out: dict[str, DeviceSpec] = {}
    for t in catalog.types:
        if t.gpu is None or t.gpu.memory_bw_gbs is None:
            continue
        spec = DeviceSpec.from_gpu(t.gpu, t.gpu_memory_gib)
        old = out.get(t.gpu.variant)
        if old is None or spec.memory_gib < old.memory_gib:
            out[t.gpu.variant] = spec
    return out


def device_spec(catalog: Catalog, device_type: str) -> DeviceSpec | None:
    """The sheet of device type ``device_type`` (``A100-80GB``, ``H100``...). A bare model
    that the catalog sells in several variants (``A100``: a profile taken before variants
    were told apart) gets the variant with the least memory (its local batch then fits
    either)."""
    specs = device_specs(catalog).values()
    found = [s for s in specs if s.name == device_type] or [
        s for s in specs if s.model == device_type
    ]
    return min(found, key=lambda s: s.memory_gib) if found else None


def census_settings(settings: TrainingSettings) -> TrainingSettings:
    """A census depends on the optimizer, and on the precision where the step runs other
    kernels: ``bf16-true`` (the model cast, every tensor at 2 bytes) and autocast's 16 bits
    (bf16 and fp16 share one ``bf16`` census: attention fused, ``census_attention``); the
    roofline applies the rest (TF32, autocast's widths)."""
    return TrainingSettings(
        optimizer=settings.optimizer, precision=counted_precision(settings.precision)
    )


def public_observations(
    specs: dict[str, DeviceSpec], census_of: Any, path: Path = PUBLIC_THROUGHPUT
) -> list[Observation]:
    """The published single-GPU rows the roofline can use (a sheet in ``specs``, keyed by
    the published variant: ``evidence_specs``; a network with a census), as observations
    of a whole step."""
    out = []
    with path.open(newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            spec = specs.get(r["gpu_variant"])
            if spec is None or not r["zoo_model"] or int(r["gpus"]) != 1:
                continue
            if r["zoo_model"] == "bert_base":
                if r["input"] != "seq384":
                    continue
                census = census_of(SQUAD, TrainingSettings(optimizer="adamw"))
            else:
                census = census_of(r["zoo_model"], DEFAULT_SETTINGS)
            b = int(r["batch_per_gpu"])
            out.append(
                Observation(
                    census,
                    spec,
                    r["precision"],
                    b,
                    b / float(r["throughput_per_s"]),
                    "step",
                    r["source_id"],
                    spec.chip,
                    r["model"] in FUSED_IMPLEMENTATIONS,
                )
            )
    return out


def measured_gpu_profiles(store: ProfileStore | None) -> list[ComputeProfile]:
    """The shipped H200 profiles and every measured (not estimated) GPU profile in
    ``store``."""
    paths = sorted(GPU_PROFILES.glob("*.json"))
    if store is not None:
        paths += store.list_paths()  # profiles only: censuses are not listed
    out, seen = [], set()
    for p in paths:
        try:
            prof = ComputeProfile.from_json(p.read_text(encoding="utf-8"))
        except (ValueError, KeyError, TypeError, ConfigError):
            continue
        if prof.device_type == "cpu" or prof.estimate or prof.store_key in seen:
            continue
        seen.add(prof.store_key)
        out.append(prof)
    return out


def evidence(
    catalog: Catalog, store: ProfileStore | None
) -> tuple[list[Observation], list[ComputeProfile]]:
    """Every observation the roofline learns from, and the measured GPU profiles."""
    root = store.root if store is not None else None
    cache: dict[tuple[str, str, str], OpCensus] = {}

    def census_of(model: str, settings: TrainingSettings, size: str = "full") -> OpCensus:
        counted = census_settings(settings)
        key = (model, size, counted.suffix)
        if key not in cache:
            cache[key] = load_census(model, size, counted, root=root)
        return cache[key]

    obs = public_observations(evidence_specs(catalog), census_of)
    profiles = measured_gpu_profiles(store)
    for prof in profiles:
        spec = device_spec(catalog, prof.device_type)
        if spec is None:
            continue
        try:
            census = census_of(prof.model, prof.settings, prof.size)
        except ConfigError:  # no census and no torch to take it: not evidence here
            continue
        obs += profile_observations(prof, census, spec)
    return obs, profiles


def _digest(observations: Iterable[Observation]) -> str:
    h = hashlib.sha256()
    for o in observations:
        h.update(
            f"{o.census.key}|{','.join(o.census.classes)}|{o.device.variant}|{o.mode}|"
            f"{o.batch}|{o.seconds!r}|{o.what}\n".encode()
        )
    return h.hexdigest()[:16]


def roofline_for(
    catalog: Catalog, store: ProfileStore | None
) -> tuple[Roofline, list[ComputeProfile]]:
    """The roofline fitted on ``evidence``, from the store's ``roofline.json`` when its
    digest matches, else fitted now (and kept there)."""
    obs, profiles = evidence(catalog, store)
    digest = _digest(obs)
    path = store.root / "roofline.json" if store is not None else None
    if path is not None and path.is_file():
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
            if d.get("digest") == digest:
                return Roofline.from_dict(d), profiles
        except (ValueError, KeyError, TypeError):
            pass
    fitted = _LEARNED.get(digest) or learn(obs)
    _LEARNED[digest] = fitted
    if path is not None:
        write_text_atomic(path, json.dumps({"digest": digest, **fitted.to_dict()}, indent=1))
    return fitted, profiles


_LEARNED: dict[str, Roofline] = {}
"""Rooflines this process fitted, by their evidence's digest (a fit is about a second of
CPU; the same evidence fits the same roofline, and a new data folder has no file yet)."""


def estimate(
    model: str,
    size: str,
    device_type: str,
    settings: TrainingSettings,
    *,
    catalog: Catalog,
    store: ProfileStore | None,
) -> ComputeProfile:
    """An estimated profile of ``model``/``size`` with ``settings`` on GPU ``device_type``:
    scaled from the store's measured profile of the same model on the nearest GPU, else
    from the specs (``profiling.roofline_profile.estimate_profile``)."""
    spec = device_spec(catalog, device_type)
    if spec is None:
        raise ConfigError(
            f"{device_type}: the catalog has no GPU sheet for it, so nothing can be estimated"
        )
    if spec.name != device_type:  # a bare model (``device_spec``): the profile keeps its key
        spec = dataclasses.replace(spec, name=device_type)
    root = store.root if store is not None else None
    census = load_census(model, size, census_settings(settings), root=root)
    census = _with(census, settings)
    fitted, profiles = roofline_for(catalog, store)
    same = []
    for prof in profiles:
        if (prof.model, prof.size, prof.settings) != (model, size, settings):
            continue
        other = device_spec(catalog, prof.device_type)
        if other is not None and prof.device_type != device_type:
            same.append((prof, other))
    near = nearest_measured(spec, same)
    jitter = step_jitter(profiles)
    if near is None:
        return estimate_profile(census, spec, fitted, relative_std=jitter)
    return estimate_profile(
        census, spec, fitted, source=near[0], source_device=near[1], relative_std=jitter
    )


def step_jitter(profiles: Iterable[ComputeProfile], default: float = 0.02) -> float:
    """The median spread (std/mean) of a pass over every batch of the measured GPU
    profiles: the step-to-step jitter an estimate's passes are given (``default`` with
    none)."""
    import numpy as np

    cvs = [float(c) for p in profiles for s in (p.fw, p.bw) for c in s.cv if np.isfinite(c)]
    return float(np.median(cvs)) if cvs else default


def _with(census: OpCensus, settings: TrainingSettings) -> OpCensus:
    """The census under the settings a plan asks for (the roofline reads the precision
    from them)."""
    from dataclasses import replace

    return replace(census, settings=settings)
