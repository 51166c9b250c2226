"""The instance catalog: EC2 GPU instance types, GPU specs, on-demand and spot prices.

``Catalog.load()`` reads the shipped files in ``srifty_core/shipped/catalog/`` (provenance in
``srifty_core/shipped/SOURCES.md``) and merges any price overlays found in ``<data dir>/prices/``.
"""

from srifty_core.catalog.catalog import Catalog, MissingPriceError
from srifty_core.catalog.overlay import PriceObservation, read_overlay, write_overlay
from srifty_core.catalog.types import GpuSpec, InstanceType, Market, Price, SpotSummary
from srifty_core.catalog.validate import Finding, Severity, validate

__all__ = [
    "Catalog",
    "Finding",
    "GpuSpec",
    "InstanceType",
    "Market",
    "MissingPriceError",
    "Price",
    "PriceObservation",
    "Severity",
    "SpotSummary",
    "read_overlay",
    "validate",
    "write_overlay",
]
