"""The report of a cloud profiling run: per instance type its B_max, profile and VM's bill,
and the totals (``summarize``), as text (``format_summary``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def summarize(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per type (each row a ``VMBill`` dict with its ``CloudProfileResult`` under
    ``profile``, ``None`` where it failed): B_max, profile path, VM seconds and cost; and
    the totals."""
    out = []
    for r in rows:
        prof = r.get("profile") or {}
        out.append(
            {
                "instance_type": r["instance_type"],
                "device_type": prof.get("device_type"),
                "b_max": prof.get("b_max"),
                "path": prof.get("path"),
                "vm_s": float(r["vm_s"]),
                "cost_usd": float(r["cost_usd"]),
                "usd_per_hour": float(r["usd_per_hour"]),
                "market": r["market"],
                "ok": bool(prof),
            }
        )
    return {
        "types": out,
        "total_vm_s": sum(x["vm_s"] for x in out),
        "total_cost_usd": sum(x["cost_usd"] for x in out),
        "failed": [x["instance_type"] for x in out if not x["ok"]],
    }


def format_summary(summary: Mapping[str, Any]) -> str:
    lines = []
    for x in summary["types"]:
        what = (
            f"{x['device_type']}: B_max {x['b_max']}, profile {x['path']}"
            if x["ok"]
            else "no profile (failed)"
        )
        lines.append(
            f"{x['instance_type']} ({x['market']}): {what}; VM {x['vm_s']:.0f} s, "
            f"${x['cost_usd']:.4f} at ${x['usd_per_hour']:g}/h"
        )
    lines.append(
        f"total: {len(summary['types'])} VM(s), {summary['total_vm_s']:.0f} VM-seconds, "
        f"${summary['total_cost_usd']:.4f}"
    )
    return "\n".join(lines)
