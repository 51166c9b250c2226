"""When a measurement is too noisy to keep as it is: one rule for the profiler's batches and
the probe sweep's points.

The repeats of one measurement spread ``std / mean``; above ``NOISY_CV`` it is measured
again, up to ``NOISY_RETRIES`` times, and the quietest attempt is kept; one still above is
flagged (a profile's ``noisy``, a probe record's ``noisy``) and named in the command's
output. Light: the standard library only.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

NOISY_CV = 0.25
"""Repeats whose std/mean exceeds this are measured again (up to ``NOISY_RETRIES`` times,
the quietest kept) and, if still above, flagged (on a quiet host this CPU's steps spread
1-10%; a loaded one gave 949 ms at B=1 and 17 ms at B=2, and allreduce probes up to 138%)."""
NOISY_RETRIES = 2


def spread(values: Sequence[float]) -> float:
    """std/mean of ``values`` (0 for fewer than two, or a mean that is not positive)."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


def is_noisy(cv: float) -> bool:
    return cv > NOISY_CV
