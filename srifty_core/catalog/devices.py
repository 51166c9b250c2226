"""Device types: how profiles, estimates and plans name a GPU.

A device type is the catalog's GPU model (``H100``, ``T4``) where EC2 sells one variant of
it, else the model and its memory (``A100-40GB`` on p4d, ``A100-80GB`` on p4de,
``V100-16GB`` on p3, ``V100-32GB`` on p3dn): variants differ in memory and bandwidth, so a
profile or an estimate of one is not the other's. ``gpu_specs.csv`` has one row per
variant; these functions read it.
"""

from __future__ import annotations

import csv
import re
from functools import cache
from pathlib import Path

from srifty_core import paths

GPU_FILE = "gpu_specs.csv"
GPU_MODELS = ("H100", "H200", "A100", "A10G", "L4", "T4", "V100", "M60", "K80")
"""GPU models as the catalog writes them; a CUDA device name is matched against these,
then its memory picks the variant."""


def device_type_name(model: str, memory_gb: float, variants: int) -> str:
    """The device type of a variant of ``model`` with ``memory_gb`` of memory, of
    ``variants`` the catalog has."""
    return model if variants <= 1 else f"{model}-{memory_gb:g}GB"


@cache
def _variants(catalog_dir: Path) -> dict[str, tuple[float, ...]]:
    """GPU model -> the memory (GB) of each of its variants in the catalog."""
    out: dict[str, list[float]] = {}
    for r in _rows(catalog_dir):
        out.setdefault(r["gpu_model"], []).append(float(r["memory_gb"]))
    return {m: tuple(v) for m, v in out.items()}


@cache
def _sxm_only(catalog_dir: Path) -> frozenset[str]:
    """GPU models whose every variant in the catalog is an SXM module (EC2 sells no PCIe
    card of them: a PCIe card is another, slower device)."""
    forms: dict[str, set[bool]] = {}
    for r in _rows(catalog_dir):
        forms.setdefault(r["gpu_model"], set()).add("SXM" in r["gpu_variant"].upper())
    return frozenset(m for m, f in forms.items() if f == {True})


def _rows(catalog_dir: Path) -> list[dict[str, str]]:
    with (catalog_dir / GPU_FILE).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def gpu_device_type(model: str, memory_gib: float, catalog_dir: Path = paths.CATALOG_DIR) -> str:
    """The device type of a GPU of catalog model ``model`` with ``memory_gib`` of memory (as
    CUDA reports it): the variant nearest in memory; ``model`` for one the catalog lacks."""
    sizes = _variants(catalog_dir).get(model)
    if not sizes:
        return model
    gb = memory_gib * 2**30 / 1e9
    return device_type_name(model, min(sizes, key=lambda m: abs(m - gb)), len(sizes))


def device_type_of_name(name: str, memory_gib: float | None = None) -> str | None:
    """The device type of a GPU called ``name`` (CUDA's ``NVIDIA A100-SXM4-80GB``) with
    ``memory_gib`` (else the memory the name states, ``80GB``); ``None`` where the name
    names no catalog model, a PCIe card of a model EC2 sells as SXM modules only
    (``NVIDIA H100 PCIe``: fewer FLOPs, less bandwidth), or a model with variants and no
    memory known."""
    upper = name.upper().replace("TESLA ", "")
    model = next((m for m in GPU_MODELS if m in upper), None)
    if model is None or ("PCIE" in upper and model in _sxm_only(paths.CATALOG_DIR)):
        return None
    if memory_gib is None:
        stated = re.search(r"(\d+)\s*GB", upper)
        if stated is None:
            return model if len(_variants(paths.CATALOG_DIR).get(model, ())) <= 1 else None
        memory_gib = float(stated.group(1)) * 1e9 / 2**30
    return gpu_device_type(model, memory_gib)


def model_of(device_type: str, catalog_dir: Path = paths.CATALOG_DIR) -> str | None:
    """The GPU model of a variant's device type (``A100-80GB`` -> ``A100``); ``None`` for a
    device type that names no variant (a model sold in one variant, a CPU)."""
    for model, sizes in _variants(catalog_dir).items():
        if len(sizes) > 1 and any(device_type_name(model, m, 2) == device_type for m in sizes):
            return model
    return None
