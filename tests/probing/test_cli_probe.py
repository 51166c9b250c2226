"""`srifty probe`: a real tiny sweep with its summary, and bad input named by field."""

from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.probing.store import read_probes
from tests.test_import_light import _loaded_after_import


def test_probe_command_sweeps_and_summarizes(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # World sizes 2 and 3 on a 3-rank allocation: world size 2 runs on a subgroup while
    # rank 2 waits.
    argv = [
        "probe",
        "--allocations",
        "1",
        "--world-sizes",
        "2,3",
        "--sizes",
        "4B:1KB",
        "--steps",
        "2",
    ]
    argv += ["--repeats", "3", "--concurrency", "1", "--day", "2026-03-01"]
    argv += ["--collectives", "all_reduce"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "4 point(s) measured, 0 already stored, 0 failed" in out.out
    assert "busbw p50" in out.out and "spread" in out.out
    table = [ln.split() for ln in out.out.splitlines() if ln.split()[1:2] in (["4B"], ["1KB"])]
    assert [r[:2] for r in table] == [["2", "4B"], ["2", "1KB"], ["3", "4B"], ["3", "1KB"]]
    assert all(r[3] == "3" for r in table)
    # off a terminal, progress is stage lines (the one convention), no bar redraws
    assert "probe local.cpu: allreduce sweep: points" in out.err and "\r" not in out.err
    assert out.err.splitlines()[-1].startswith("probe local.cpu: done [")
    df = read_probes()
    assert len(df) == 12 and df["allocation_id"].nunique() == 1
    assert df.groupby("world_size")["busbw"].count().to_dict() == {2: 6, 3: 6}
    assert (data_dir / "probes" / "date=2026-03-01" / "provider=local").is_dir()
    assert main([*argv, "--no-progress"]) == 0
    assert "0 point(s) measured, 4 already stored" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--world-sizes", "1"], "world_sizes: an allreduce needs at least 2"),
        (["--sizes", "4B:1GB"], "sizes: 1073741824 bytes is out of range"),
        (["--backend", "mpi"], "unknown backend 'mpi'"),
        (["--provider", "aws"], "unknown provider 'aws'"),
        (["--instance-type", "p5en.48xlarg"], "did you mean 'p5en.48xlarge'"),
        (
            ["--provider", "ec2-emulated", "--instance-type", "g5.xlarg"],
            "unknown instance type 'g5.xlarg'; did you mean 'g5.xlarge'",
        ),
        (["--world-sizes", "2,4", "--instances", "2"], "world_sizes: [4] exceed the 2 rank"),
        (["--concurrency", "1,x"], "concurrency:"),
    ],
)
def test_bad_input_is_a_clear_error(
    extra: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["probe", "--no-progress", *extra]) == 2
    assert message in capsys.readouterr().err


def test_probing_and_cloud_packages_stay_light() -> None:
    for module in ("srifty_core.probing", "srifty_core.cloud", "srifty_core.cloud.local"):
        assert _loaded_after_import(module) == [], module
    assert "torch" not in _loaded_after_import("srifty_core.measure.sweep")


def test_probe_command_runs_the_sustained_probe(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "probe",
        "--allocations",
        "1",
        "--sizes",
        "4B:1KB",
        "--steps",
        "2",
        "--repeats",
        "2",
        "--concurrency",
        "1",
    ]
    argv += ["--sustained-s", "1", "--no-progress", "--day", "2026-03-02"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    marked = [ln for ln in out.splitlines() if ln.endswith("sustained")]
    assert len(marked) == 1 and marked[0].split()[:2] == ["2", "64MB"]
    df = read_probes()
    assert sorted(df.loc[df["phase"] == "sustained", "buffer_bytes"].unique()) == [64 << 20]


def test_probe_progress_says_done_only_when_it_is(
    monkeypatch: pytest.MonkeyPatch, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep that fails (here: the sweep itself raises, as a provider that cannot launch
    does) ends without a "done" line: the error is the last word."""
    from srifty_core.errors import SriftyError
    from srifty_core.measure import sweep

    def failing(*args: object, on_progress: object, **kw: object) -> None:
        on_progress(1, 4)  # type: ignore[operator]
        raise SriftyError("the provider could not launch an allocation")

    monkeypatch.setattr(sweep, "probe_sweep", failing)
    assert main(["probe", "--sizes", "4B:1KB", "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert "probe local.cpu: allreduce sweep: points (1/4)" in err
    assert "done" not in err and "could not launch" in err.splitlines()[-1]
