"""The parallel workers' file order (tests/file_order.py): costliest files first, read from
a JUnit report."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import file_order

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_one" time="1.5"/>
<testcase classname="tests.test_a" name="test_two[x]" time="2.0"/>
<testcase classname="tests.worker.test_b.TestGroup" name="test_three" time="10.25"/>
<testcase classname="tests.test_c" name="test_four" time="0.125"/>
</testsuite></testsuites>
"""


def test_a_junit_report_gives_each_files_seconds_largest_first(tmp_path: Path) -> None:
    report = tmp_path / "run.xml"
    report.write_text(JUNIT)
    seconds = file_order.file_seconds(report)
    assert list(seconds.items()) == [
        ("tests/worker/test_b.py", 10.2),
        ("tests/test_a.py", 3.5),
        ("tests/test_c.py", 0.1),
    ]


def test_costliest_and_unknown_files_go_first_each_in_its_own_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = tmp_path / "file_seconds.json"
    figures.write_text(json.dumps({"tests/test_a.py": 3.5, "tests/test_b.py": 10.0}))
    monkeypatch.setattr(file_order, "FILE_SECONDS", figures)
    ids = ["tests/test_a.py::one", "tests/test_b.py::two", "tests/test_new.py::three",
           "tests/test_a.py::four", "tests/test_b.py::five"]  # fmt: skip
    items: list[Any] = [SimpleNamespace(nodeid=i) for i in ids]
    file_order.order(items)
    assert [i.nodeid for i in items] == [
        "tests/test_new.py::three",
        "tests/test_b.py::two",
        "tests/test_b.py::five",
        "tests/test_a.py::one",
        "tests/test_a.py::four",
    ]


def test_the_recorded_figures_name_files_that_exist() -> None:
    """A renamed or deleted file's figure is stale: refresh the figures (module docstring)."""
    seconds = json.loads(file_order.FILE_SECONDS.read_text())
    root = Path(file_order.__file__).parent.parent
    assert seconds and all((root / f).is_file() for f in seconds)


def test_a_missing_or_garbled_report_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbled = tmp_path / "garbled.xml"
    garbled.write_text("<testsuites><testcase")
    for report in (tmp_path / "absent.xml", garbled):
        assert file_order.main([str(report)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and f"JUNIT_XML {report}" in err
    assert json.loads(file_order.FILE_SECONDS.read_text())  # the figures left as they were
