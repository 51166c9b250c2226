"""Value objects of the instance catalog: markets, prices, GPU specs, instance types."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from datetime import date
from enum import StrEnum
from typing import Any

from srifty_core.errors import UnknownNameError


class Market(StrEnum):
    """How a VM is bought."""

    ON_DEMAND = "on-demand"
    SPOT = "spot"

    @classmethod
    def parse(cls, value: str | Market) -> Market:
        """Accept ``on-demand``/``ondemand``/``on_demand``/``spot`` (any case)."""
        if isinstance(value, Market):
            return value
        key = str(value).strip().lower().replace("_", "-")
        if key in ("ondemand", "on-demand", "od"):
            return cls.ON_DEMAND
        if key == "spot":
            return cls.SPOT
        raise UnknownNameError("market", str(value), [m.value for m in cls])


@dataclass(frozen=True, slots=True)
class Price:
    """An hourly price with the date it was observed and where it came from."""

    usd_per_hour: float
    observed_on: date
    source: str

    def __post_init__(self) -> None:
        if not (self.usd_per_hour > 0 and math.isfinite(self.usd_per_hour)):
            raise ValueError(f"price must be positive, got {self.usd_per_hour!r} ({self.source})")

    def age_days(self, today: date) -> int:
        return (today - self.observed_on).days


@dataclass(frozen=True, slots=True)
class RegionalSpot:
    """A regional spot-price aggregate (min/avg/max over zones) as a source published it."""

    min_usd_per_hour: float
    avg_usd_per_hour: float
    max_usd_per_hour: float
    observed_on: date
    source: str


@dataclass(frozen=True, slots=True)
class SpotSummary:
    """Summary of the zone-level spot prices of one instance type in one region."""

    n_zones: int
    min_usd_per_hour: float
    median_usd_per_hour: float
    max_usd_per_hour: float
    cheapest_zone: str
    oldest_observation: date


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One GPU model as EC2 exposes it. ``None`` where no source gave the number."""

    model: str
    variant: str
    architecture: str
    fp32_tflops: float
    fp16_tflops: float | None
    """Best FP16 dense throughput: tensor-core figure where published, else non-tensor."""
    memory_gb: float
    memory_bw_gbs: float | None
    nvlink: bool
    nvlink_bw_gbs: float | None
    """Total NVLink bandwidth per GPU, GB/s."""
    host_interface: str
    tf32_tflops: float | None = None
    """TF32 dense tensor-core throughput (Ampere and later), where published."""
    device_type: str = ""
    """The device type profiles, estimates and plans key this GPU by (``catalog.devices``):
    the model, or the model and memory where EC2 sells several variants of it
    (``A100-80GB``). Empty: the model."""


@dataclass(frozen=True, slots=True)
class InstanceType:
    """One EC2 instance type in one region, with its prices and GPU spec joined.

    Immutable: derive changed copies with ``dataclasses.replace``. Zone IDs are AWS AZ IDs
    (``use1-az1``), which are the same in every account (AZ names are not).
    """

    name: str
    family: str
    region: str
    vcpus: int
    memory_gib: float
    gpu_model: str
    gpus_per_vm: int
    gpu_memory_gib: float
    """Usable memory of one GPU."""
    network_gbps: float
    """Rated sustained (baseline) network bandwidth."""
    network_burst_gbps: float | None
    """Rated burst bandwidth for "up to" types, else ``None``."""
    network_rating: str
    """The provider's rating as written (e.g. ``"10.0 / 25.0 (baseline/burst Gbps)"``)."""
    efa_supported: bool
    ondemand: Price | None
    spot_zones: tuple[tuple[str, Price], ...] = ()
    """Zone-level spot prices, sorted by zone ID."""
    spot_regional: RegionalSpot | None = None
    spot_interrupt_freq: str | None = None
    gpu: GpuSpec | None = field(default=None, compare=False)

    @property
    def spot_by_zone(self) -> dict[str, Price]:
        return dict(self.spot_zones)

    @property
    def device_type(self) -> str:
        """The exact GPU variant this type carries, as profiles and plans name devices
        (``GpuSpec.device_type``); the GPU model where the catalog joins no spec."""
        return (self.gpu.device_type or self.gpu_model) if self.gpu is not None else self.gpu_model

    @property
    def total_gpu_memory_gib(self) -> float:
        return self.gpu_memory_gib * self.gpus_per_vm

    @property
    def spot_summary(self) -> SpotSummary | None:
        """Min/median/max over zones and the cheapest zone; ``None`` with no zone price."""
        if not self.spot_zones:
            return None
        values = [p.usd_per_hour for _, p in self.spot_zones]
        zone, _ = min(self.spot_zones, key=lambda zp: (zp[1].usd_per_hour, zp[0]))
        return SpotSummary(
            n_zones=len(values),
            min_usd_per_hour=min(values),
            median_usd_per_hour=statistics.median(values),
            max_usd_per_hour=max(values),
            cheapest_zone=zone,
            oldest_observation=min(p.observed_on for _, p in self.spot_zones),
        )

    def prices(self) -> list[Price]:
        """Every price this type carries (on-demand and per zone)."""
        out = [p for _, p in self.spot_zones]
        if self.ondemand is not None:
            out.append(self.ondemand)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready view (dates as ISO strings)."""
        summary = self.spot_summary
        return {
            "name": self.name,
            "family": self.family,
            "region": self.region,
            "vcpus": self.vcpus,
            "memory_gib": self.memory_gib,
            "gpu_model": self.gpu_model,
            "gpus_per_vm": self.gpus_per_vm,
            "gpu_memory_gib": self.gpu_memory_gib,
            "network_gbps": self.network_gbps,
            "network_burst_gbps": self.network_burst_gbps,
            "network_rating": self.network_rating,
            "efa_supported": self.efa_supported,
            "ondemand_usd_per_hour": self.ondemand.usd_per_hour if self.ondemand else None,
            "ondemand_observed_on": self.ondemand.observed_on.isoformat()
            if self.ondemand
            else None,
            "spot_by_zone": {
                z: {"usd_per_hour": p.usd_per_hour, "observed_on": p.observed_on.isoformat()}
                for z, p in self.spot_zones
            },
            "spot_min_usd_per_hour": summary.min_usd_per_hour if summary else None,
            "spot_median_usd_per_hour": summary.median_usd_per_hour if summary else None,
            "spot_max_usd_per_hour": summary.max_usd_per_hour if summary else None,
            "spot_cheapest_zone": summary.cheapest_zone if summary else None,
            "spot_interrupt_freq": self.spot_interrupt_freq,
            "gpu": None
            if self.gpu is None
            else {
                "variant": self.gpu.variant,
                "architecture": self.gpu.architecture,
                "fp32_tflops": self.gpu.fp32_tflops,
                "fp16_tflops": self.gpu.fp16_tflops,
                "memory_bw_gbs": self.gpu.memory_bw_gbs,
                "nvlink": self.gpu.nvlink,
                "nvlink_bw_gbs": self.gpu.nvlink_bw_gbs,
            },
        }
