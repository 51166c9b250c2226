"""Human and machine views of the catalog: the CLI table, JSON, and the validation report."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from datetime import date
from pathlib import Path
from typing import Any

from srifty_core.atomic import write_text_atomic
from srifty_core.catalog.catalog import Catalog
from srifty_core.catalog.types import InstanceType
from srifty_core.catalog.validate import Finding

_COLUMNS = (
    ("type", "<"),
    ("region", "<"),
    ("vCPU", ">"),
    ("mem GiB", ">"),
    ("GPU", "<"),
    ("GPUs", ">"),
    ("GiB/GPU", ">"),
    ("FP32 TF", ">"),
    ("net Gbps", ">"),
    ("od $/h", ">"),
    ("spot min $/h", ">"),
    ("spot zone", "<"),
    ("zones", ">"),
)


def _money(value: float | None) -> str:
    return "missing" if value is None else f"{value:.4f}"


def _row(t: InstanceType) -> list[str]:
    s = t.spot_summary
    net = f"{t.network_gbps:g}" + (f"-{t.network_burst_gbps:g}" if t.network_burst_gbps else "")
    return [
        t.name,
        t.region,
        str(t.vcpus),
        f"{t.memory_gib:g}",
        t.gpu_model,
        str(t.gpus_per_vm),
        f"{t.gpu_memory_gib:g}",
        "?" if t.gpu is None else f"{t.gpu.fp32_tflops:g}",
        net,
        _money(t.ondemand.usd_per_hour if t.ondemand else None),
        _money(s.min_usd_per_hour if s else None),
        s.cheapest_zone if s else "-",
        str(s.n_zones if s else 0),
    ]


def format_table(types: Sequence[InstanceType]) -> str:
    """A fixed-width text table, one row per (type, region)."""
    rows = [[c for c, _ in _COLUMNS], *(_row(t) for t in types)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(_COLUMNS))]
    lines = []
    for r in rows:
        cells = [
            f"{cell:{align}{w}}" for cell, (_, align), w in zip(r, _COLUMNS, widths, strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def price_age_line(catalog: Catalog, today: date | None = None) -> str:
    today = today or date.today()
    oldest, newest = catalog.price_dates()
    newest_age, oldest_age = catalog.price_age_days(today)
    return (
        f"prices observed {oldest} .. {newest} (upper bounds; {newest_age}-{oldest_age} days old "
        f"on {today}); sources: srifty_core/shipped/SOURCES.md"
    )


def catalog_json(types: Sequence[InstanceType]) -> str:
    return json.dumps([t.to_dict() for t in types], indent=2, sort_keys=True)


def write_validation_report(
    catalog: Catalog, findings: Sequence[Finding], out_dir: Path, today: date | None = None
) -> dict[str, Any]:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` atomically; return the summary.

    Rerunning with the same inputs rewrites the same two files (idempotent).
    """
    today = today or date.today()
    counts = Counter(f.severity.value for f in findings)
    oldest, newest = catalog.price_dates()
    summary: dict[str, Any] = {
        "generated_on": today.isoformat(),
        "instance_types": len(catalog.names()),
        "rows": len(catalog),
        "regions": catalog.regions(),
        "families": catalog.families(),
        "prices_oldest": oldest.isoformat(),
        "prices_newest": newest.isoformat(),
        "errors": counts.get("error", 0),
        "warnings": counts.get("warning", 0),
    }
    body = {"summary": summary, "findings": [asdict(f) for f in findings]}
    write_text_atomic(out_dir / "report.json", json.dumps(body, indent=2, sort_keys=True) + "\n")
    md = [
        "# Instance catalog validation",
        "",
        f"{summary['rows']} rows ({summary['instance_types']} types x regions "
        f"{', '.join(summary['regions'])}); {summary['errors']} errors, "
        f"{summary['warnings']} warnings.",
        "",
        price_age_line(catalog, today),
        "",
        "| severity | type | region | check | message |",
        "|---|---|---|---|---|",
        *(
            f"| {f.severity.value} | {f.instance_type} | {f.region} | {f.check} | {f.message} |"
            for f in findings
        ),
        "",
    ]
    write_text_atomic(out_dir / "report.md", "\n".join(md))
    return summary
