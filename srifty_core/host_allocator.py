"""One heap behaviour for every process that trains or is profiled: glibc's malloc with
fixed thresholds.

A training step frees and reallocates the same large tensors every iteration (gradients
when ``zero_grad(set_to_none=True)``, activations, DLRM's dense embedding gradients).
glibc's malloc serves a block above ``M_MMAP_THRESHOLD`` with a fresh ``mmap`` (each page
zero-faulted on first touch) and returns it with ``munmap`` when freed, and it *moves* that
threshold as the process frees mmapped blocks (the "dynamic" threshold). So the same step
costs what the process's history says: DLRM (small) on one CPU thread measured 3 ms per
step in one process and 12 ms in another, and a profile taken after the B_max search (large
blocks freed) differed from the training process that never ran one. ``steady()`` sets both
thresholds once (``mallopt``, which also switches the dynamic adjustment off): blocks up to
``MMAP_THRESHOLD_BYTES`` come from the heap and stay mapped for reuse, and the heap is
trimmed only above ``TRIM_THRESHOLD_BYTES``. The profiler and every training worker call
it first, so the profile measures the allocator training runs with (and CPU steps stop
paying for page faults). The GPU's memory is the CUDA caching allocator's and is not
affected.

``SRIFTY_STEADY_MALLOC=0`` leaves the allocator as the C library starts it (a benchmark's
"before" arm). A C library other than glibc (musl, macOS) is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path

from srifty_core.errors import ConfigError

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024**2
"""glibc's largest accepted mmap threshold on 64-bit hosts (``HEAP_MAX_SIZE / 2``)."""
TRIM_THRESHOLD_BYTES = 1024**3
"""Free memory at the heap's top kept for reuse before it is returned to the system."""
ENV = "SRIFTY_STEADY_MALLOC"
ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

_applied: bool | None = None


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def trim() -> None:
    """Return the heap's free memory to the system (glibc's ``malloc_trim``), so that the
    resident set is what the process holds: before measuring a peak against it."""
    libc = _libc()
    fn = getattr(libc, "malloc_trim", None)
    if fn is not None:
        fn.argtypes = (ctypes.c_size_t,)
        fn(0)


def steady() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (idempotent). Returns whether
    they are set: False where the C library is not glibc or ``SRIFTY_STEADY_MALLOC=0``."""
    global _applied
    if _applied is not None:
        return _applied
    value = os.environ.get(ENV, "1").strip().lower()
    if value not in ON + OFF:
        raise ConfigError(f"{ENV}={os.environ[ENV]!r}: use 1 (the default) or 0")
    _applied = False
    if value in OFF:
        return False
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:  # not Linux, or a C library without it
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    _applied = bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    return _applied


def available_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The memory this host can give a new process now (``MemAvailable``); None where the
    kernel does not say (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes(field: str = "VmRSS") -> int | None:
    """This process's resident set (``VmRSS``) or its peak since the last
    ``reset_peak_resident`` (``VmHWM``), from ``/proc/self/status``; None where the kernel
    does not offer it (not Linux)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_peak_resident() -> bool:
    """Start ``VmHWM`` again from the resident set now (``/proc/self/clear_refs``); False
    where the kernel does not offer it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        return False
    return True
