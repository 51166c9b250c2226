"""The order in which parallel workers take the test files: the costliest first.

scripts/test sends each file whole to one worker (``--dist loadfile``) and hands the files
out in collection order (``--no-loadscope-reorder``), so a file collected last runs while
the other worker may have nothing left: with xdist's own order (most tests first) the
files of a few minutes-long tests (the GPU check's CPU run, the namespace VMs) went last.
``FILE_SECONDS`` holds each file's seconds from a recorded run; the order only moves time
about, so a stale figure costs balance, never a result. A file it does not know (a new
one) goes first. Refresh it from a run's JUnit report:

    .venv/bin/python -m pytest -n auto --dist loadfile --junitxml=run.xml ...
    .venv/bin/python -m tests.file_order run.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from srifty_core.atomic import write_text_atomic

FILE_SECONDS = Path(__file__).with_name("file_seconds.json")


def order(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place: by their file's recorded seconds, the largest (or unknown)
    first, each file's own tests in their collection order."""
    seconds: dict[str, float] = json.loads(FILE_SECONDS.read_text())
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::", 1)[0], float("inf")))


def file_seconds(junit_xml: Path) -> dict[str, float]:
    """Each test file's summed test seconds (setup, call and teardown) in a JUnit report."""
    total: Counter[str] = Counter()
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        # classname is the dotted module path, then the class for a test in one
        parts = (case.get("classname") or "").split(".")
        if parts[-1][:1].isupper():
            parts = parts[:-1]
        total["/".join(parts) + ".py"] += float(case.get("time") or 0)
    return {f: round(s, 1) for f, s in sorted(total.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.file_order JUNIT_XML", file=sys.stderr)
        return 2
    try:
        figures = file_seconds(Path(argv[0]))
    except (OSError, ET.ParseError) as exc:
        print(f"tests.file_order: JUNIT_XML {argv[0]}: {exc}", file=sys.stderr)
        return 2
    write_text_atomic(FILE_SECONDS, json.dumps(figures, indent=1) + "\n")  # whole or not at all
    print(f"{FILE_SECONDS.name}: {len(figures)} files, {sum(figures.values()):.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
