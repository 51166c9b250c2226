"""Every hint an error prints is a command that works: it parses with the real ``srifty``
parser and names only options that exist (no abbreviations), and where it can run here (a
CPU profile, a probe sweep, in this test's data folder, tiny) it gets past the error that
printed it."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from srifty_core.cli import main
from srifty_core.cli.parser import build_parser

HINT = re.compile(r"(?<!`)`(srifty [^`]*)`(?!`)")
"""A command in single backticks (a docstring's ``double`` ones are not hints)."""


def hinted(text: str) -> list[list[str]]:
    """The ``srifty`` commands in backticks in ``text``, as argv (``srifty`` dropped)."""
    return [shlex.split(c)[1:] for c in HINT.findall(text)]


def _subparser(command: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]  # type: ignore[no-any-return]


def check_parses(argv: list[str]) -> argparse.Namespace:
    """``argv`` parses with the real parser, and every ``--option`` in it is one of the
    subcommand's own spellings (argparse would also take a prefix)."""
    args = build_parser().parse_args(argv)
    known = _subparser(argv[0])._option_string_actions
    for word in argv[1:]:
        if word.startswith("--"):
            assert word.split("=")[0] in known, f"{argv}: no option {word}"
    return args


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    return capsys.readouterr().err


def _request(path: Path, model: str, offer: str = "g4dn.xlarge") -> Path:
    path.write_text(
        f"model: {model}\nsize: tiny\nglobal_batch: 16\niterations: 10\n"
        f"offers:\n  - {{type: {offer}, market: on-demand, quota: 2}}\n"
    )
    return path


def test_an_unknown_model_hints_no_command_that_would_fail(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error(["plan", str(_request(data_dir / "r.yaml", "resnet51"))], capsys)
    assert "'resnet51' is a stored name, not a model Srifty can build" in err
    assert "srifty profile --model resnet51" not in err
    for argv in hinted(err):  # what is left: the command's help
        check_parses(argv)


def test_an_empty_probe_store_hints_a_sweep_that_fills_it(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = ["plan", str(_request(data_dir / "r.yaml", "dlrm")), "--bandwidth", "probes"]
    err = _error(plan, capsys)
    assert "the probe store is empty" in err
    (probe,) = [a for a in hinted(err) if a[0] == "probe"]
    check_parses(probe)
    tiny = ["--world-sizes", "2", "--sizes", "4B:1KB", "--steps", "2", "--repeats", "2"]
    # one allocation, one collective, one concurrency: two worker processes, not six
    tiny += ["--allocations", "1", "--concurrency", "1", "--collectives", "all_reduce"]
    assert main([*probe, *tiny, "--no-progress"]) == 0  # the hint, on a tiny grid
    main(plan)
    assert "the probe store is empty" not in capsys.readouterr().err


def test_a_missing_cpu_profile_hints_the_profile_that_makes_it(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore

    with pytest.raises(ProfileNotFoundError) as exc:
        ProfileStore().load("dlrm", "tiny", "cpu")
    (argv,) = hinted(str(exc.value))
    check_parses(argv)
    assert argv[:2] == ["profile", "--model"] and "--device" in argv
    # run as printed (the hint's own size is tiny), with a small budget and no MLflow; no
    # shared-host measurement (it spawns a torch process per round of it)
    quick = ["--max-batch", "8", "--probes", "2", "--refine", "0", "--repeats", "3"]
    quick += ["--share-host", "1"]
    assert main([*argv, *quick, "--warmup", "1", "--no-mlflow"]) == 0
    assert ProfileStore().load("dlrm", "tiny", "cpu").device_type == "cpu"


@pytest.mark.parametrize(
    ("load", "device"),
    [
        (("resnet50", "full", "V100"), "cuda"),
        (("examples/digits/model.py:build", "small", "T4"), "cuda"),
    ],
)
def test_a_missing_gpu_profile_hints_a_command_that_parses(
    load: tuple[str, str, str], device: str
) -> None:
    from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore

    with pytest.raises(ProfileNotFoundError) as exc:
        ProfileStore().load(*load)
    (argv,) = hinted(str(exc.value))
    args = check_parses(argv)
    assert (args.model, args.size, args.device) == (load[0], load[1], device)


def test_the_other_hints_parse() -> None:
    """Hints of errors that need a cloud or a model store to reach: each command parses."""
    from srifty_core.jobs import provisioning
    from srifty_core.planner import job as planner_job
    from srifty_core.predictors import registry

    sources = [Path(m.__file__ or "").read_text() for m in (registry, provisioning, planner_job)]
    commands = [argv for text in sources for argv in hinted(text)]
    assert any(a[0] == "fit-bandwidth" for a in commands)
    assert any(a[:2] == ["train", "--job"] for a in commands)
    for argv in commands:
        check_parses([w.replace("JOB.yaml", "job.yaml") for w in argv])


def test_a_parse_error_hints_the_commands_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "r.yaml", "--seed", "x"])
    (argv,) = hinted(capsys.readouterr().err)
    assert argv == ["plan", "--help"]
    with pytest.raises(SystemExit) as done:
        check_parses(argv)
    assert done.value.code == 0
