"""`srifty plan` on bad request files: exit 2 and one line on stderr naming the field (or,
when the file cannot be read as a request at all, the file).

The corpus is ``bad_requests/``: one file per mistake, YAML and JSON, with malformed YAML
and JSON, binary bytes, a 5000-digit integer, a key given twice. A property test then
feeds the command random bytes, text and YAML/JSON documents.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srifty_core.cli import main

CORPUS = Path(__file__).parent / "bad_requests"
FIELD = {
    "bad_market.yaml": "offers[0].market",
    "bool_batch.yaml": "global_batch",
    "date_as_zone.yaml": "offers[0].zone",
    "fractional_quota.json": "offers[0].quota",
    "huge_global_batch.json": "global_batch",
    "huge_iterations.yaml": "iterations",
    "infinite_time_limit.json": "time_limit_s",
    "integer_key.yaml": "offers[0]",
    "missing_offers.yaml": "offers",
    "nan_budget.yaml": "budget_usd",
    "negative_launch.yaml": "overheads.launch_s",
    "negative_quota.yaml": "offers[1].quota",
    "objective_speed.yaml": "objective",
    "offers_not_a_list.yaml": "offers",
    "risk_quantile_one.yaml": "risk_quantile",
    "string_iterations.json": "iterations",
    "typo_global_batch.yaml": "gloabl_batch",
    "typo_quota.yaml": "offers[1].qouta",
    "unknown_region.yaml": "region",
    "unknown_type.yaml": "offers[0].type",
    "zero_price.yaml": "offers[0].price",
}
"""File -> the field its error names first."""
NOT_A_REQUEST = {
    "binary.yaml": "not UTF-8 text",
    "duplicate_key.yaml": "not valid YAML (line 8, column 1: key 'global_batch' given twice)",
    "empty.yaml": "a request is a mapping",
    "list_at_top.yaml": "a request is a mapping",
    "malformed.json": "not valid JSON (line 1",
    "malformed.yaml": "not valid YAML (line 4",
    "python_tag.yaml": "not valid YAML",
}
"""Files that are no request at all -> what the error says after the file's path."""


def plan(path: Path | str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", str(path)])
    return code, out.getvalue(), err.getvalue()


def test_every_file_of_the_corpus_is_checked() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(FIELD | NOT_A_REQUEST)


@pytest.mark.parametrize("name", sorted(FIELD))
def test_a_bad_field_is_one_line_naming_it(name: str) -> None:
    code, out, err = plan(CORPUS / name)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"srifty: error: {FIELD[name]}: "), err


@pytest.mark.parametrize("name", sorted(NOT_A_REQUEST))
def test_a_file_that_is_no_request_is_one_line_naming_it(name: str) -> None:
    code, out, err = plan(CORPUS / name)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1, err
    assert err.startswith(f"srifty: error: {CORPUS / name}: {NOT_A_REQUEST[name]}"), err


def test_the_command_exits_2_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "srifty_core.cli", "plan", str(CORPUS / "typo_quota.yaml")],
        capture_output=True,
        text=True,
        env=os.environ.copy(),
        check=False,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (
        "srifty: error: offers[1].qouta: unknown offer field 'qouta'; did you mean 'quota'?\n"
    )


def test_a_missing_or_unreadable_file_is_one_line(tmp_path: Path) -> None:
    assert plan(tmp_path / "nope.yaml")[::2] == (
        2,
        f"srifty: error: request file not found: {tmp_path / 'nope.yaml'}\n",
    )
    assert plan(tmp_path)[0] == 2  # a folder
    big = tmp_path / "big.yaml"
    big.write_text("model: m\n" + "# padding\n" * 200_000)
    code, _, err = plan(big)
    assert code == 2 and "larger than" in err and err.count("\n") == 1


# ---------------------------------------------------------------------- random files
documents = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=15,
)
requestish = st.fixed_dictionaries(
    {},
    optional={
        "model": documents,
        "global_batch": documents,
        "iterations": documents,
        "offers": st.lists(
            st.fixed_dictionaries(
                {"type": st.sampled_from(["g4dn.xlarge", "g3.4xlarge", "x"]) | documents},
                optional={"quota": documents, "market": documents, "price": documents},
            ),
            max_size=3,
        )
        | documents,
        "time_limit_s": documents,
        "overheads": documents,
    },
)


def _yaml(doc: Any) -> bytes:
    return yaml.safe_dump(doc, allow_unicode=True).encode()


def _json(doc: Any) -> bytes:
    return json.dumps(doc).encode()  # NaN and Infinity too


contents = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200).map(str.encode),
    documents.map(_yaml),
    requestish.map(_yaml),
    requestish.map(_json),
)


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(content=contents, suffix=st.sampled_from([".yaml", ".yml", ".json"]))
def test_any_file_is_exit_2_and_one_line(content: bytes, suffix: str) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / f"request{suffix}"
        path.write_bytes(content)
        code, out, err = plan(path)
    assert (code, out) == (2, ""), err
    assert err.count("\n") == 1 and err.startswith("srifty: error: "), err
