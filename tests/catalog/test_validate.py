from __future__ import annotations

import dataclasses
from datetime import date
from pathlib import Path

import pytest

from srifty_core.catalog import Catalog, Price, Severity, validate
from srifty_core.catalog.refresh import CatalogInvalidError, check_summary, refresh_catalog_report


def test_shipped_catalog_has_no_errors_only_known_warnings() -> None:
    findings = validate(Catalog.load(use_overlays=False), today=date(2026, 4, 2))
    assert [f for f in findings if f.severity is Severity.ERROR] == []
    # g3/g3s have no zone spot price in any shipped source
    no_spot = {f.instance_type for f in findings if f.check == "spot_price"}
    assert no_spot == {"g3.4xlarge", "g3.8xlarge", "g3.16xlarge", "g3s.xlarge"}


def test_stale_prices_depend_on_the_day() -> None:
    catalog = Catalog.load(use_overlays=False)
    early = {
        f.instance_type for f in validate(catalog, date(2026, 4, 2)) if f.check == "stale_price"
    }
    late = {
        f.instance_type for f in validate(catalog, date(2027, 6, 1)) if f.check == "stale_price"
    }
    assert early < late and "g4dn.xlarge" in late


def test_broken_entries_are_errors() -> None:
    shipped = Catalog.load(use_overlays=False)
    t = shipped.get("g4dn.xlarge", "us-east-1")
    day = date(2026, 4, 1)
    broken = dataclasses.replace(
        t,
        gpu=None,
        ondemand=None,
        spot_zones=(("usw2-az1", Price(0.3, day, "x")),),
    )
    pricey = dataclasses.replace(
        shipped.get("g5.xlarge", "us-east-1"), spot_zones=(("use1-az1", Price(99.0, day, "x")),)
    )
    findings = validate(Catalog([broken, pricey]), today=day)
    checks = {(f.instance_type, f.check, f.severity) for f in findings}
    assert ("g4dn.xlarge", "gpu_spec", Severity.ERROR) in checks
    assert ("g4dn.xlarge", "ondemand_price", Severity.ERROR) in checks
    assert ("g4dn.xlarge", "zone", Severity.ERROR) in checks
    assert ("g5.xlarge", "spot_above_ondemand", Severity.WARNING) in checks
    assert findings[0].severity is Severity.ERROR  # errors first


def test_refresh_writes_an_idempotent_report(data_dir: Path) -> None:
    day = date(2026, 4, 2)
    s1 = refresh_catalog_report(regions=["us-west-2"], run_day=day)
    out = Path(s1["report_dir"])
    assert out == data_dir / "reports" / "catalog" / "2026-04-02"
    first = (out / "report.json").read_text()
    s2 = refresh_catalog_report(regions=["us-west-2"], run_day=day)
    assert (out / "report.json").read_text() == first
    assert s1 == s2 and s1["rows"] == 36 and s1["regions"] == ["us-west-2"]
    assert sorted(p.name for p in out.iterdir()) == ["report.json", "report.md"]
    check_summary(s1)  # no errors: passes
    with pytest.raises(CatalogInvalidError, match=r"2 error\(s\)"):
        check_summary({**s1, "errors": 2})
    check_summary({**s1, "errors": 2}, fail_on_error=False)
