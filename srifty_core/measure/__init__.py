"""Procedures that measure hardware, on this machine or on any ``cloud.Provider``'s VMs
(above the cloud: they start work on a provider's allocations).

Importing this package loads nothing; each module loads what it needs:

- ``measure.sweep``: the allreduce probe sweep on a provider, committed to the probe store
  (``probe_sweep``, ``sweep_on_allocation``, ``launch_for_sweep``, ``SweepResult``)
- ``measure.mix_sweep``: the same for a mixed-type ring, one allocation per member type as
  one process group (``probe_mix_sweep``, ``launch_ring``, ``sweep_on_ring``)
- ``measure.checks``: a sweep's config checked against the provider and the allocation
- ``measure.runner``: one allocation's (or a ring's) points run on its workers (``run_points``)
- ``measure.partials``: a sweep's partial files and their commit into the probe store
- ``measure.probe_worker``: one rank of a probe sweep,
  ``python -m srifty_core.measure.probe_worker PLAN.json`` (torch)
"""
