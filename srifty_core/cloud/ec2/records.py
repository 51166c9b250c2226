"""What EC2's records say in Srifty's terms: the tags Srifty puts on what it launches, and
an instance's state, interruptions and exit codes read from ``describe_instances`` and
``describe_spot_instance_requests`` records already fetched (by the provider's calls, or
its async reader for the monitor: the same rules for both).

* An instance that stopped or terminated without ``srifty:released`` was taken back by
  EC2 (spot), unless its state reason says it shut itself down (the training start
  script, once torchrun ended): that one is ``terminated``.
* A spot request whose status says ``marked-for-...`` or ``instance-terminated-...`` is an
  interruption too (the two-minute notice).
* Exit codes are unknown from here: ``None`` per rank while its instance runs, -1 once it
  has ended.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from srifty_core.cloud.base import (
    Allocation,
    Instance,
    InstanceState,
    Interruption,
    ProviderError,
)

TAG_ALLOCATION = "srifty:allocation"
TAG_MANAGED = "srifty:managed"
TAG_MARKET = "srifty:market"
TAG_PLACEMENT = "srifty:placement-group"
TAG_RELEASED = "srifty:released"
LIVE_STATES = ("pending", "running", "stopping", "stopped")
SPOT_INTERRUPTION_CODES = (
    "marked-for-termination",
    "marked-for-stop",
    "instance-terminated-by-price",
    "instance-terminated-no-capacity",
    "instance-terminated-capacity-oversubscribed",
    "instance-stopped-by-price",
    "instance-stopped-no-capacity",
)
_GMT = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) GMT\)")
SELF_SHUTDOWN = "Client.InstanceInitiatedShutdown"
"""EC2's state reason for an instance that shut itself down (the start script, once
torchrun ended): terminated, not taken back."""

Clock = Callable[[], datetime]
"""The provider's clock (``Provider.now``), asked only when a record has no time."""


def instance_state(raw: Mapping[str, Any], now: Clock) -> tuple[InstanceState, datetime | None]:
    """The state of a ``describe_instances`` record, and when it ended (``None`` while it
    runs)."""
    name = raw["State"]["Name"]
    if name == "pending":
        return InstanceState.PENDING, None
    if name == "running":
        return InstanceState.RUNNING, None
    found = tags(raw)
    if TAG_RELEASED in found:
        return InstanceState.TERMINATED, parse_time(found[TAG_RELEASED])
    m = _GMT.search(raw.get("StateTransitionReason", "") or "")
    ended = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC) if m else now()
    if (raw.get("StateReason") or {}).get("Code") == SELF_SHUTDOWN:
        return InstanceState.TERMINATED, ended  # it shut itself down: not taken back
    return InstanceState.INTERRUPTED, ended


def instances_from(
    allocation: Allocation, raws: Mapping[str, Mapping[str, Any]], now: Clock
) -> tuple[Instance, ...]:
    """The instances of ``allocation`` from ``describe_instances`` records by instance id
    (one with no record has terminated)."""
    per = allocation.spec.ranks_per_instance
    out = []
    for k, iid in enumerate(allocation.instance_ids):
        raw = raws.get(iid)
        state, ended = instance_state(raw, now) if raw else (InstanceState.TERMINATED, None)
        out.append(
            Instance(
                id=iid,
                allocation_id=allocation.id,
                instance_type=allocation.spec.name,
                market=allocation.market,
                zone=allocation.zone,
                state=state,
                address=(raw or {}).get("PrivateIpAddress", ""),
                ranks=tuple(range(k * per, (k + 1) * per)),
                launched_at=utc(raw["LaunchTime"]) if raw else allocation.created_at,
                ended_at=ended,
            )
        )
    return tuple(out)


def interruptions_from(
    allocation: Allocation,
    raws: Mapping[str, Mapping[str, Any]],
    spot_requests: Sequence[Mapping[str, Any]],
    now: Clock,
) -> tuple[Interruption, ...]:
    """``Provider.interruptions`` from records already read: ``describe_instances``
    records by instance id and ``describe_spot_instance_requests`` records."""
    out: dict[str, Interruption] = {}
    for iid in allocation.instance_ids:
        raw = raws.get(iid)
        if raw is None:
            continue
        state, ended = instance_state(raw, now)
        if state is InstanceState.INTERRUPTED:
            reason = (raw.get("StateReason") or {}).get("Message") or raw.get(
                "StateTransitionReason", "taken back by EC2"
            )
            out[iid] = Interruption(iid, ended or now(), reason)
    mine = set(allocation.instance_ids)
    for req in spot_requests:
        code = (req.get("Status") or {}).get("Code", "")
        taken = str(req.get("InstanceId") or "")
        if taken in mine and code in SPOT_INTERRUPTION_CODES and taken not in out:
            at = utc(req["Status"].get("UpdateTime", now()))
            out[taken] = Interruption(taken, at, f"spot request status {code}")
    return tuple(sorted(out.values(), key=lambda x: (x.at, x.instance_id)))


def exit_codes_from(
    allocation: Allocation, raws: Mapping[str, Mapping[str, Any]], now: Clock
) -> dict[int, int | None]:
    """``Provider.exit_codes`` from ``describe_instances`` records already read, by
    instance id."""
    per = allocation.spec.ranks_per_instance
    out: dict[int, int | None] = {}
    for k, iid in enumerate(allocation.instance_ids):
        raw = raws.get(iid)
        state = instance_state(raw, now)[0] if raw else InstanceState.TERMINATED
        for r in range(k * per, (k + 1) * per):
            out[r] = None if state is InstanceState.RUNNING else -1
    return out


def placement_group(alloc_id: str, found: Mapping[str, str]) -> str | None:
    """The placement group an allocation launched in (its ``srifty:placement-group`` tag:
    the group's name; ``true`` from before groups were shared: named after the
    allocation), or ``None``; ``found``: the tags of one of its instances."""
    value = found.get(TAG_PLACEMENT, "false")
    if value in ("", "false"):
        return None
    return alloc_id if value == "true" else value


def tags(raw: Mapping[str, Any]) -> dict[str, str]:
    """A record's tags, by key."""
    return {t["Key"]: t["Value"] for t in raw.get("Tags", [])}


def utc(t: Any) -> datetime:
    """A record's timestamp (a datetime or an ISO string) in UTC."""
    if isinstance(t, str):
        t = datetime.fromisoformat(t)
    if not isinstance(t, datetime):
        raise ProviderError(f"unexpected timestamp {t!r} from EC2")
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def parse_time(text: str) -> datetime | None:
    """The time a ``srifty:released`` tag holds, or ``None`` if it holds none."""
    try:
        return utc(datetime.fromisoformat(text))
    except ValueError:
        return None
