"""Which mixed-type rings to probe, within a budget: chosen, not enumerated (issue 52).

First the mixes that recent plans chose (``configuration_mix`` of their configuration
labels, most used first) and the store does not hold yet: what users run. Then, while
the budget lasts, a small design over what makes one mix differ from another as a ring:
whether its members' GPUs per VM differ (a 1-GPU VM beside a multi-GPU one loses what
the multi-GPU VM gains inside itself), whether their rated links differ, and how many
VMs it holds. Each candidate pair of offered types is described by those levels; the
design takes pairs that add a level combination no chosen or stored mix covers yet (first
pairs whose GPUs per VM differ, then whose links differ), each at one VM a type, then at
two VMs of the smaller type, then pairs that bring a type no chosen mix holds yet, while
the budget allows. Same inputs, same choice. ``mixes_to_probe`` is what the sweep DAG
calls: the listed mixes, then the chosen ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import date, timedelta
from itertools import combinations
from pathlib import Path
from typing import Any

from srifty_core.probing.mix import is_mix, mix_label, parse_mix_spec
from srifty_core.probing.store import partition_files

GROUP_SEP = "+"
MIX_DAYS = 30
"""A mix the store holds from the last this many days is not chosen again."""


def configuration_mix(label: str) -> dict[str, int] | None:
    """``{type: VMs}`` of a configuration label (``2xp3.8xlarge@512+8xg3.8xlarge@64``, the
    simulator's ``Configuration.label``) when it holds two or more types; ``None`` for one
    type or a label that does not parse."""
    counts: Counter[str] = Counter()
    for group in filter(None, str(label).split(GROUP_SEP)):
        count, x, rest = group.partition("x")
        name = rest.split("@", 1)[0]
        if not x or not count.isdigit() or int(count) < 1 or not name:
            return None
        counts[name] += int(count)
    return dict(sorted(counts.items())) if len(counts) >= 2 else None


def _levels(a: Any, b: Any) -> tuple[bool, bool]:
    """(GPUs per VM differ, rated links differ) of two ``InstanceSpec``-like types."""
    return a.gpus_per_vm != b.gpus_per_vm, a.network_gbps != b.network_gbps


def choose_mixes(
    recent: Iterable[str],
    offered: Sequence[Any],
    probed: Iterable[str],
    budget: int,
) -> list[dict[str, int]]:
    """Up to ``budget`` mixes (``{type: VMs}``) to probe (rule: module docstring).

    ``recent``: configuration labels of recent plans (repeats count as uses); ``offered``:
    ``InstanceSpec``-like types (``name``, ``gpus_per_vm``, ``network_gbps``) the design
    draws from; ``probed``: mix labels the store already holds."""
    done = set(probed)
    chosen: list[dict[str, int]] = []

    def take(mix: Mapping[str, int]) -> bool:
        label = mix_label(mix)
        if label in done or len(chosen) >= budget:
            return False
        done.add(label)
        chosen.append(dict(sorted(mix.items())))
        return True

    mixes = [m for m in map(configuration_mix, recent) if m is not None]
    by_label = {mix_label(m): m for m in mixes}
    uses = Counter(mix_label(m) for m in mixes)
    for label, _ in sorted(uses.items(), key=lambda kv: (-kv[1], kv[0])):
        take(by_label[label])
    types = sorted({t.name: t for t in offered}.values(), key=lambda t: t.name)
    pairs = list(combinations(types, 2))
    covered: set[tuple[bool, bool]] = set()
    ordered = sorted(pairs, key=lambda p: (not _levels(*p)[0], not _levels(*p)[1]))
    for a, b in ordered:  # one pair per level combination, each at one VM a type
        cell, pair = _levels(a, b), {a.name: 1, b.name: 1}
        if cell not in covered and (take(pair) or mix_label(pair) in done):
            covered.add(cell)  # chosen now, or the store (or the list) holds it
    for a, b in ordered:  # then member count: two VMs of the type with fewer GPUs
        small = a if (a.gpus_per_vm, a.name) <= (b.gpus_per_vm, b.name) else b
        if _levels(a, b) in covered:
            other = b if small is a else a
            if take({small.name: 2, other.name: 1}):
                covered.discard(_levels(a, b))  # once per combination
    seen = {t for m in chosen for t in m}
    for a, b in ordered:  # then pairs that bring a type no chosen mix holds
        if (a.name not in seen or b.name not in seen) and take({a.name: 1, b.name: 1}):
            seen |= {a.name, b.name}
    return chosen


def stored_mixes(provider: str, since: date, root: Path | None = None) -> set[str]:
    """Mix labels the probe store holds for ``provider`` from day ``since`` on (folder
    names only: no partition is read)."""
    out = set()
    for f in partition_files(root, providers=[provider]):
        label = f.parent.name.removeprefix("instance_type=")
        day = f.parent.parent.parent.name.removeprefix("date=")
        if is_mix(label) and date.fromisoformat(day) >= since:
            out.add(label)
    return out


def mixes_to_probe(
    listed: Sequence[str],
    offered: Sequence[Any],
    provider: str,
    today: date,
    budget: int,
    recent: Callable[[], list[str]],
    root: Path | None = None,
) -> list[dict[str, int]]:
    """What a sweep probes as mixes: the ``listed`` ones (``TYPE:VMS,TYPE:VMS`` each, a
    ``ConfigError`` naming ``mixes[i]`` for a bad one), then up to ``budget`` that
    ``choose_mixes`` picks from the configurations ``recent()`` gives (what users ran;
    unreadable: the design alone, said on stdout) and the ``offered`` types, leaving out
    what the store holds for ``provider`` from the last ``MIX_DAYS`` days."""
    mixes = [parse_mix_spec(m, field=f"mixes[{i}]") for i, m in enumerate(listed)]
    stored = stored_mixes(provider, today - timedelta(days=MIX_DAYS), root)
    stored |= {mix_label(m) for m in mixes}
    plans: list[str] = []
    if budget:
        try:
            plans = recent()
        except Exception as exc:  # the nightly sweep goes on without them
            print(f"mix choice: recent plans unreadable ({exc}); the design alone picks")
    return mixes + choose_mixes(plans, offered, stored, budget)
