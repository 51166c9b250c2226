from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.atomic import write_text_atomic


class Boom(Exception):
    pass


def test_writes_verbatim_and_replaces(tmp_path: Path) -> None:
    p = tmp_path / "sub" / "f.csv"
    write_text_atomic(p, "a,b\r\n1,2\r\n")
    assert p.read_bytes() == b"a,b\r\n1,2\r\n"
    write_text_atomic(p, "new\n")
    assert p.read_text() == "new\n"
    assert [x.name for x in p.parent.iterdir()] == ["f.csv"]


def test_a_failed_write_leaves_the_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "out" / "f.json"
    write_text_atomic(p, "old")

    def fail(src: str, dst: str) -> None:
        raise Boom()

    monkeypatch.setattr("srifty_core.atomic.os.replace", fail)
    with pytest.raises(Boom):
        write_text_atomic(p, "new")
    assert p.read_text() == "old"
    assert [x.name for x in p.parent.iterdir()] == ["f.json"]
