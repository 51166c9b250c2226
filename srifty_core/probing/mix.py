"""Mixed-type allocations in the probe store: one allreduce ring over the VMs of several
instance types (a heterogeneous job's ring), stored with the ONE probe schema under an
``instance_type`` label that names the mix.

**Label.** ``mix_<count>x<type>_<count>x<type>...``: every member type once, sorted by
name, at least two of them, each with its VM count (>= 1), e.g.
``mix_1xg4dn.12xlarge_3xg4dn.xlarge`` for one g4dn.12xlarge and three g4dn.xlarge (the
method's ``<num><instance>`` notation). The label names a partition folder of the store,
whose names admit only letters, digits, ``.``, ``_`` and ``-`` (``store.partition_dir``);
instance type names never hold ``_``, so ``_`` separates the members and the label parses
back unambiguously (``parse_mix``). One spelling per mix: ``parse_mix`` rejects any other.

**The other columns of a mix row** describe the ring, since no single VM does:

- ``gpu_model``: ``mixed``;
- ``gpus_per_vm``, ``vcpus``: the smallest member's (the counts are in the label, and each
  member type's own probe rows carry its size);
- ``network_gbps``: the slowest rated member's (a ring runs at its slowest link); null
  when no member is rated;
- ``zone``: the members' zone when they share one, else their zones sorted and joined by
  ``+``; ``allocation_id``: the members' allocation ids joined by ``+`` (one group of
  repeated samples); ``placement_group``: every member in one;
- ``world_size``: ranks of the ring (every rank of every member).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from srifty_core.errors import ConfigError

MIX_PREFIX = "mix_"
MIXED_GPU = "mixed"
"""``gpu_model`` of a mix row."""
_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_MEMBER_RE = re.compile(r"^([1-9][0-9]*)x([A-Za-z0-9][A-Za-z0-9.-]*)$")


def is_mix(label: str) -> bool:
    """Whether an ``instance_type`` value names a mix (``parse_mix`` checks the rest)."""
    return isinstance(label, str) and label.startswith(MIX_PREFIX)


def mix_label(counts: Mapping[str, int], *, field: str = "mix") -> str:
    """The canonical label of ``{instance type: VMs}`` (rule: module docstring)."""
    if not isinstance(counts, Mapping):
        raise ConfigError(f"{field}: expected a mapping of instance type to VM count")
    members = []
    for name, count in counts.items():
        if not isinstance(name, str) or not _TYPE_RE.match(name):
            raise ConfigError(
                f"{field}: {name!r} is not an instance type name (letters, digits, '.', '-')"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ConfigError(f"{field}: VM count of {name} must be an integer >= 1, got {count!r}")
        members.append((name, count))
    if len(members) < 2:
        raise ConfigError(
            f"{field}: a mix needs at least two instance types, got {sorted(counts)}; "
            "probe a single type as its own allocation"
        )
    return MIX_PREFIX + "_".join(f"{n}x{t}" for t, n in sorted(members))


def parse_mix(label: str, *, field: str = "instance_type") -> dict[str, int]:
    """``{instance type: VMs}`` of a mix label, in name order; ``ConfigError`` naming
    ``field`` unless ``label`` is a canonical label."""
    if not is_mix(label):
        raise ConfigError(f"{field}: {label!r} is not a mix label (they start with {MIX_PREFIX!r})")
    out: dict[str, int] = {}
    for part in label[len(MIX_PREFIX) :].split("_"):
        m = _MEMBER_RE.match(part)
        if m is None:
            raise ConfigError(
                f"{field}: {label!r}: member {part!r} is not <count>x<instance type> "
                "(e.g. mix_1xg4dn.12xlarge_3xg4dn.xlarge)"
            )
        count, name = int(m.group(1)), m.group(2)
        if name in out:
            raise ConfigError(f"{field}: {label!r} names {name} twice")
        out[name] = count
    canonical = mix_label(out, field=field)
    if canonical != label:
        raise ConfigError(
            f"{field}: {label!r} is not canonical (types sorted by name): {canonical}"
        )
    return out


def parse_mix_spec(text: str, *, field: str = "--mix") -> dict[str, int]:
    """A mix typed by a user, ``g4dn.12xlarge:1,g4dn.xlarge:3``, as ``{type: VMs}``
    (checked as ``mix_label`` checks it)."""
    out: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        name, sep, count = part.partition(":")
        name = name.strip()
        if not sep or not name or not count.strip().isdigit():
            raise ConfigError(
                f"{field}: {part!r} is not TYPE:COUNT (e.g. g4dn.12xlarge:1,g4dn.xlarge:3)"
            )
        if name in out:
            raise ConfigError(f"{field}: {name} given twice")
        out[name] = int(count)
    mix_label(out, field=field)
    return dict(sorted(out.items()))


def ring_columns(
    counts: Mapping[str, int], specs: Sequence[Any], zones: Sequence[str]
) -> dict[str, Any]:
    """The columns a mix row carries for a ring of ``counts`` VMs (rule: module docstring).

    ``specs``: one per member type, with ``name``, ``gpus_per_vm``, ``vcpus`` and
    ``network_gbps`` (``cloud.base.InstanceSpec``); ``zones``: the members' zones."""
    label = mix_label(counts)
    names = sorted(counts)
    if sorted(s.name for s in specs) != names:
        raise ConfigError(f"mix {label}: specs of {sorted(s.name for s in specs)} given")
    rated = [float(s.network_gbps) for s in specs if s.network_gbps is not None]
    uniq = sorted(set(zones))
    return {
        "instance_type": label,
        "gpu_model": MIXED_GPU,
        "gpus_per_vm": min(int(s.gpus_per_vm) for s in specs),
        "vcpus": min(int(s.vcpus) for s in specs),
        "network_gbps": min(rated) if rated else None,
        "zone": "+".join(uniq),
    }
