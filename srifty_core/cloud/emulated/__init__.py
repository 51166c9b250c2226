"""The emulated EC2 (provider ``ec2-emulated``): a seeded cloud on a simulated clock.

``provider.EmulatedProvider`` is the provider, built of ``world`` (clock, catalog,
allocations, interruptions), ``probes``, ``training`` and ``profiles``;
``measurements`` takes datasets on a fresh one (a probe sweep, profiles, a training run).
Its ground truth is ``cloud.emulator_truth``.
"""
