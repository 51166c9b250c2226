"""The catalog refresh job: load, validate, write the report. Called by the Airflow DAG
``srifty_catalog_refresh`` and by ``srifty catalog --validate``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from pathlib import Path
from typing import Any

from srifty_core import paths
from srifty_core.catalog.catalog import Catalog
from srifty_core.catalog.report import write_validation_report
from srifty_core.catalog.validate import validate
from srifty_core.errors import SriftyError


class CatalogInvalidError(SriftyError):
    """The catalog has errors that would make plans wrong; the report lists them."""


def refresh_catalog_report(
    regions: Sequence[str] = (),
    run_day: date | None = None,
    data_dir: Path | None = None,
) -> dict[str, Any]:
    """Validate the catalog (filtered to ``regions`` if given) and write the report under
    ``<data dir>/reports/catalog/<run day>/``. Returns the summary with ``report_dir``.

    Idempotent: a rerun for the same day replaces that day's report.
    """
    run_day = run_day or date.today()
    root = paths.data_dir(data_dir)
    catalog = Catalog.load(overlay_dir=paths.price_overlay_dir(root))
    if regions:
        for r in regions:
            catalog.check_region(r)
        catalog = Catalog([t for t in catalog.types if t.region in set(regions)])
    findings = validate(catalog, today=run_day)
    out_dir = paths.reports_dir(root) / "catalog" / run_day.isoformat()
    summary = write_validation_report(catalog, findings, out_dir, today=run_day)
    summary["report_dir"] = str(out_dir)
    return summary


def check_summary(summary: dict[str, Any], *, fail_on_error: bool = True) -> None:
    """Raise ``CatalogInvalidError`` when the report counted errors and that is fatal."""
    if fail_on_error and summary["errors"]:
        raise CatalogInvalidError(
            f"catalog has {summary['errors']} error(s); see {summary['report_dir']}/report.md"
        )
