"""Allreduce probes: the sweep's config and the Parquet probe store (the data; the sweep
driver and its worker, which measure, are ``srifty_core.measure``).

Importing this package stays light (no torch, no pyarrow): the config and size helpers
are plain Python; ``probing.store`` and ``probing.schema`` load the heavy libraries they
need.

- ``probing.config``: ``SweepConfig``, ``Point``, ``parse_sizes``, ``geometric_sizes``, ``busbw``
- ``probing.store``: ``write_partition``, ``read_probes``, ``age_weights``
- ``probing.schema``: ``PROBE_SCHEMA`` (the one schema), ``conform``
- ``probing.mix``: ``mix_label``, ``parse_mix``, ``is_mix`` (mixed-type rings in the store)
- ``probing.mix_choice``: ``choose_mixes`` (which mixes a sweep probes, within a budget)
"""

from srifty_core.probing.config import (
    MAX_BUFFER_BYTES,
    MIN_BUFFER_BYTES,
    Point,
    SweepConfig,
    busbw,
    format_size,
    geometric_sizes,
    parse_sizes,
)

PROBE_STORE_ASSET_NAME = "srifty_probe_store"
PROBE_STORE_ASSET_URI = "srifty://probe-store/"
"""The Airflow Asset the probe sweep DAG updates (the model refresh schedules on it)."""

__all__ = [
    "MAX_BUFFER_BYTES",
    "MIN_BUFFER_BYTES",
    "PROBE_STORE_ASSET_NAME",
    "PROBE_STORE_ASSET_URI",
    "Point",
    "SweepConfig",
    "busbw",
    "format_size",
    "geometric_sizes",
    "parse_sizes",
]
