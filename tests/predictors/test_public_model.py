"""The public-table bandwidth model, fitted once and kept (``predictors.public_model``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from srifty_core import paths
from srifty_core.predictors import public_model as pm
from srifty_core.predictors.nccl_tests import nccl_tests_frame


def test_the_public_model_is_fitted_once_then_read_back_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call fits and keeps the model; the second reads it back and predicts the
    same to the bit without fitting; a damaged copy is fitted again and replaced; other
    rows are another key."""
    rows = nccl_tests_frame()
    first = pm.public_model(rows, tmp_path)
    folder = paths.model_cache_dir(tmp_path) / "public" / pm.cache_key(rows)
    assert (folder / "model.json").is_file()
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]

    def no_fit(*args: object, **kwargs: object) -> None:
        raise AssertionError("fitted again")

    with monkeypatch.context() as m:
        m.setattr(pm.BandwidthModel, "fit", no_fit)
        again = pm.public_model(rows, tmp_path)
    np.testing.assert_array_equal(again.predict(rows), first.predict(rows))

    (folder / "model.json").write_text("{not json")
    mended = pm.public_model(rows, tmp_path)
    np.testing.assert_array_equal(mended.predict(rows), first.predict(rows))
    assert (folder / "model.json").read_text().startswith("{\n")
    assert pm.cache_key(rows.iloc[:-1]) != pm.cache_key(rows)
