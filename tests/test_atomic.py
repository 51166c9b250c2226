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


def test_open_for_append_cuts_a_torn_last_line_and_keeps_whole_ones(tmp_path: Path) -> None:
    from srifty_core.atomic import open_for_append
    from srifty_core.runs.progress import ProgressLog, ProgressRecord, read_progress

    p = tmp_path / "progress.jsonl"
    rec = ProgressRecord(1, 0.0, 0.1, 8, "c0")
    with ProgressLog(p) as log:
        log.append(rec)
    whole = p.read_bytes()
    p.write_bytes(whole + b'{"iteration": 2, "wall_ti')  # a kill mid-line
    with ProgressLog(p) as log:  # the next writer
        log.append(ProgressRecord(2, 1.0, 0.1, 8, "c0"))
    assert [r.iteration for r in read_progress(p)] == [1, 2]
    # a file that is one torn line, a missing file, a clean file, a long line
    q = tmp_path / "q.jsonl"
    q.write_bytes(b"x" * 200_000)
    with open_for_append(q) as fh:
        fh.write("ok\n")
    assert q.read_text() == "ok\n"
    with open_for_append(tmp_path / "new" / "n.jsonl") as fh:
        fh.write("a\n")
    clean = tmp_path / "c.jsonl"
    clean.write_text("a\n" + "y" * 100_000 + "\n")
    with open_for_append(clean) as fh:
        fh.write("b\n")
    assert clean.read_text() == "a\n" + "y" * 100_000 + "\nb\n"


def test_a_figure_that_fails_to_save_leaves_the_old_picture(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.plotting import pyplot, save_figure

    plt = pyplot()
    p = tmp_path / "plots" / "f.png"
    fig, ax = plt.subplots()
    ax.plot([0, 1], [1, 0])
    save_figure(fig, p)
    old = p.read_bytes()
    assert old.startswith(b"\x89PNG")

    fig, ax = plt.subplots()
    ax.plot([0, 1], [0, 1])
    real = fig.savefig

    def torn(fh, **kw):  # type: ignore[no-untyped-def]
        real(fh, **kw)  # the whole picture written, then the process dies
        raise Boom()

    monkeypatch.setattr(fig, "savefig", torn)
    with pytest.raises(Boom):
        save_figure(fig, p)
    assert p.read_bytes() == old
    assert [x.name for x in p.parent.iterdir()] == ["f.png"]
    assert not plt.fignum_exists(fig.number)  # closed even so
