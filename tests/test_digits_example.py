"""The digits example's data: scikit-learn's bundled digits, read without importing
scikit-learn (each training rank would pay for the import), the same as ``load_digits``."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest

from srifty_core import paths


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "digits_example", paths.REPO_ROOT / "examples" / "digits" / "model.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_digits_are_load_digits_without_importing_sklearn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sklearn.datasets import load_digits

    expected = load_digits()
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "sklearn.datasets", None)  # importing it now fails
        x, y = _example().digits()
    assert x.shape == (1797, 64) and np.array_equal(x.numpy() * 16, expected.data)
    assert np.array_equal(y.numpy(), expected.target)


def test_without_the_bundled_file_the_digits_come_from_load_digits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sklearn.datasets import load_digits

    example = _example()
    x, y = example.digits()
    calls: list[int] = []
    datasets = ModuleType("sklearn.datasets")

    def counted() -> object:
        calls.append(1)
        return load_digits()

    datasets.load_digits = counted  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sklearn.datasets", datasets)
    monkeypatch.setattr(example.importlib.util, "find_spec", lambda name: None)
    example.digits.cache_clear()
    x2, y2 = example.digits()
    assert calls == [1]
    assert np.array_equal(x.numpy(), x2.numpy()) and np.array_equal(y.numpy(), y2.numpy())
