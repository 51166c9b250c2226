"""The emulated EC2 as one provider: ``EmulatedProvider``, a seeded cloud on a simulated
clock, for probes, profiles, training and preemptions at scale (tens of VMs, many
allocations) in seconds.

It implements the ``Provider`` interface over the real catalog (instance types, GPU specs,
on-demand and zone spot prices) and draws every measurement from ``cloud.emulator_truth``
(the ground-truth network and compute model, documented there). Its parts, each a class
over ``world.EmulatedWorld`` (clock, launches, interruptions: the behaviour listed there):
``probes`` (allreduce samples), ``training`` (iterations, runs as the clock moves) and
``profiles`` (what the profiler would measure).
"""

from srifty_core.cloud.emulated.probes import EmulatedProbes
from srifty_core.cloud.emulated.profiles import EmulatedProfiles
from srifty_core.cloud.emulated.training import EmulatedTraining


class EmulatedProvider(EmulatedProbes, EmulatedTraining, EmulatedProfiles):
    """The emulated EC2: ``EmulatedWorld``'s settings (``seed``, ``region``, ``start``,
    limits, preemptions...), with its probes, training and profiles."""
