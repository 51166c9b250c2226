"""Compute profiling: runs ON the device it measures (CPU here, CUDA where present).

Light to import: the contract (``profile``) and the store need no torch; the profiler and
the DDP bucket check import torch when used. The models profiled are
``srifty_core.workloads`` (``MODEL_NAMES`` and ``SIZES`` are re-exported here for code
that imports them from this package).
"""

from srifty_core.workloads.names import MODEL_NAMES, SIZES

__all__ = ["MODEL_NAMES", "SIZES"]
