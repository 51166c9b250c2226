"""Read the shipped catalog CSVs into ``InstanceType`` values.

Pure parsing with the standard library's ``csv`` (the files are small, and importing the
catalog must stay light). The rules, one place each:

- **Zone spot prices**: from the newer snapshot (``skypilot_2026``) wherever it has the type in
  that region, else from the older one (``skypilot_v7``). Local Zones are left out (they are
  not where training fleets are placed). An empty price is *missing*, never 0. Duplicate
  rows for one zone (the older snapshot lists p4de twice) keep the lowest price.
- **Dates**: every price carries the observation date of its source from
  ``price_sources.csv`` (an upper bound; ``srifty_core/shipped/SOURCES.md`` explains each).
- **Rated network**: Karpenter's baseline Gbps where present, else the number in AWS's rating
  text; "up to" ratings also keep their burst figure.
- **GPU memory per GPU**: AWS's usable GiB where present, else Vantage's total / GPU count.
- **GPU spec**: joined by instance family (``gpu_specs.csv``'s ``aws_families``); its device
  type names the variant where the catalog has several of one model (``device_type_name``).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

from srifty_core.catalog.devices import GPU_FILE, device_type_name
from srifty_core.catalog.types import GpuSpec, InstanceType, Price, RegionalSpot
from srifty_core.errors import ConfigError

CATALOG_FILE = "ec2_gpu_catalog.csv"
SPOT_FILE = "ec2_spot_prices.csv"
SOURCES_FILE = "price_sources.csv"

# Which price_sources.csv key each row of the spot CSV comes from (by its `source` prefix).
_SPOT_SOURCE_KEYS = (("anycloud-sh/catalog", "skypilot_2026"), ("skypilot-org/", "skypilot_v7"))
_SPOT_PREFERENCE = ("skypilot_2026", "skypilot_v7")


def _rows(path: Path) -> Iterator[dict[str, str]]:
    if not path.is_file():
        raise ConfigError(f"catalog file missing: {path}")
    with path.open(newline="", encoding="utf-8") as fh:
        yield from csv.DictReader(fh)


def _opt_float(text: str) -> float | None:
    text = text.strip()
    return float(text) if text else None


def _req_float(row: dict[str, str], column: str, path: Path) -> float:
    value = _opt_float(row.get(column, ""))
    if value is None:
        raise ConfigError(f"{path.name}: column {column!r} is empty for {row.get('instance_type')}")
    return value


def load_price_sources(catalog_dir: Path) -> dict[str, date]:
    """Source key -> observation date (upper bound)."""
    return {
        r["source_key"]: date.fromisoformat(r["observed_on"])
        for r in _rows(catalog_dir / SOURCES_FILE)
    }


def load_gpu_specs(catalog_dir: Path) -> dict[str, GpuSpec]:
    """Instance family -> GPU spec."""
    by_family: dict[str, GpuSpec] = {}
    rows = list(_rows(catalog_dir / GPU_FILE))
    variants: dict[str, int] = {}
    for r in rows:
        variants[r["gpu_model"]] = variants.get(r["gpu_model"], 0) + 1
    for r in rows:
        families = [f.strip() for f in r["aws_families"].split(";")]
        fp16 = _opt_float(r["fp16_tensor_dense_tflops"]) or _opt_float(r["fp16_nontensor_tflops"])
        spec = GpuSpec(
            model=r["gpu_model"],
            variant=r["gpu_variant"],
            architecture=r["architecture"],
            fp32_tflops=float(r["fp32_tflops"]),
            fp16_tflops=fp16,
            memory_gb=float(r["memory_gb"]),
            memory_bw_gbs=_opt_float(r["memory_bw_gbs"]),
            nvlink=r["nvlink"].strip().lower() == "yes",
            nvlink_bw_gbs=_opt_float(r["nvlink_bw_gbs_per_gpu_total"]),
            host_interface=r["host_interface"],
            tf32_tflops=_opt_float(r["tf32_tensor_dense_tflops"]),
            device_type=device_type_name(
                r["gpu_model"], float(r["memory_gb"]), variants[r["gpu_model"]]
            ),
        )
        for fam in families:
            if re.fullmatch(r"[a-z0-9]+", fam):
                by_family[fam] = spec
    return by_family


def _spot_source_key(source: str) -> str:
    for prefix, key in _SPOT_SOURCE_KEYS:
        if source.startswith(prefix):
            return key
    raise ConfigError(f"{SPOT_FILE}: unknown price source {source[:60]!r}")


def load_zone_spot_prices(
    catalog_dir: Path, sources: dict[str, date]
) -> dict[tuple[str, str], tuple[tuple[str, Price], ...]]:
    """(instance type, region) -> sorted ((zone, price), ...) by the rules above."""
    # (type, region) -> source key -> zone -> lowest price
    found: dict[tuple[str, str], dict[str, dict[str, float]]] = {}
    for r in _rows(catalog_dir / SPOT_FILE):
        if r["is_local_zone"].strip().lower() == "yes":
            continue
        key = _spot_source_key(r["source"])
        per_zone = found.setdefault((r["instance_type"], r["region"]), {}).setdefault(key, {})
        price = _opt_float(r["spot_usd_hr"])
        if price is None or price <= 0:
            continue
        zone = r["availability_zone_id"]
        per_zone[zone] = min(price, per_zone.get(zone, price))
    out: dict[tuple[str, str], tuple[tuple[str, Price], ...]] = {}
    for type_region, by_source in found.items():
        for key in _SPOT_PREFERENCE:
            zones = by_source.get(key)
            if zones:
                out[type_region] = tuple(
                    (z, Price(p, sources[key], key)) for z, p in sorted(zones.items())
                )
                break
    return out


_NUM = re.compile(r"(\d+(?:\.\d+)?)")


def parse_network_rating(rating: str) -> tuple[float | None, float | None]:
    """(baseline, burst) Gbps from a rating text.

    ``"10.0 / 25.0 (baseline/burst Gbps)"`` -> (10, 25); ``"Up to 10 Gbps"`` -> (None, 10);
    ``"4x 100 Gigabit"`` -> (400, None); ``"25 Gbps"`` -> (25, None).
    """
    text = rating.strip()
    nums = [float(n) for n in _NUM.findall(text)]
    if not nums:
        return None, None
    if "baseline/burst" in text and len(nums) >= 2:
        return nums[0], nums[1]
    if text.lower().startswith("up to"):
        return None, nums[0]
    multi = re.match(r"\s*(\d+)\s*x\s+(\d+(?:\.\d+)?)", text)
    if multi:
        return float(multi.group(1)) * float(multi.group(2)), None
    return nums[0], None


def load_instance_types(catalog_dir: Path) -> list[InstanceType]:
    """Every (instance type, region) row of the shipped catalog, prices and GPU joined."""
    sources = load_price_sources(catalog_dir)
    gpus = load_gpu_specs(catalog_dir)
    zone_prices = load_zone_spot_prices(catalog_dir, sources)
    vantage_day = sources["vantage"]
    path = catalog_dir / CATALOG_FILE
    out: list[InstanceType] = []
    for r in _rows(path):
        name, region = r["instance_type"], r["region"]
        rating = r["network_awsdoc"] or r["network_performance"]
        baseline, burst = parse_network_rating(rating)
        karpenter = _opt_float(r["baseline_bandwidth_gbps_karpenter"])
        network = karpenter if karpenter is not None else (baseline or burst)
        if network is None:
            raise ConfigError(f"{path.name}: no rated network for {name} in {region}")
        gpus_per_vm = int(r["gpu_count"])
        per_gpu = _opt_float(r["gpu_memory_per_gpu_gib_awsdoc"])
        if per_gpu is None:
            per_gpu = _req_float(r, "gpu_memory_total_gb_vantage", path) / gpus_per_vm
        ondemand = _opt_float(r["ondemand_usd_hr"])
        smin, savg, smax = (
            _opt_float(r["spot_min_usd_hr"]),
            _opt_float(r["spot_avg_usd_hr"]),
            _opt_float(r["spot_max_usd_hr"]),
        )
        regional = (
            RegionalSpot(smin, savg, smax, vantage_day, "vantage")
            if smin is not None and savg is not None and smax is not None
            else None
        )
        out.append(
            InstanceType(
                name=name,
                family=r["family"],
                region=region,
                vcpus=int(r["vcpus"]),
                memory_gib=float(r["memory_gib"]),
                gpu_model=r["gpu_model"],
                gpus_per_vm=gpus_per_vm,
                gpu_memory_gib=per_gpu,
                network_gbps=network,
                network_burst_gbps=burst if burst is not None and burst != network else None,
                network_rating=rating,
                efa_supported=r["efa_supported_awsdoc"].strip().lower() in ("yes", "true"),
                ondemand=Price(ondemand, vantage_day, "vantage") if ondemand else None,
                spot_zones=zone_prices.get((name, region), ()),
                spot_regional=regional,
                spot_interrupt_freq=r["spot_interrupt_freq"] or None,
                gpu=gpus.get(r["family"]),
            )
        )
    return out
