"""A digit classifier on real data that ships with scikit-learn (nothing is downloaded).

The data is scikit-learn's bundled copy of the UCI optical-recognition digits (what its
``load_digits`` returns): 1,797 8x8 grey-level images of the digits 0-9. ``build`` is a
Srifty model factory (``srifty profile --model examples/digits/model.py:build``): it
returns the network, a batch maker that draws real samples, and the loss.
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import nn

from srifty_core.workloads import Parts

WIDTH = {"tiny": 32, "small": 128, "full": 512}
"""Hidden units per size preset."""


@functools.cache
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 images as float32 rows of 64 pixels scaled to [0, 1], and their labels.

    Read from scikit-learn's bundled ``digits.csv.gz`` (64 pixels, then the label, a row
    each: what ``load_digits`` parses) without importing scikit-learn, which costs each
    rank about 1.6 s of CPU; ``load_digits`` itself where the file is not where it was.
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without importing it
    where = list(spec.submodule_search_locations or []) if spec else []
    bundled = Path(where[0]) / "datasets" / "data" / "digits.csv.gz" if where else None
    if bundled is not None and bundled.is_file():
        rows = np.loadtxt(bundled, delimiter=",")
        pixels, labels = rows[:, :-1], rows[:, -1]
    else:
        from sklearn.datasets import load_digits

        data = load_digits()
        pixels, labels = data.data, data.target
    x = torch.tensor(pixels, dtype=torch.float32) / 16.0
    y = torch.tensor(labels, dtype=torch.long)
    return x, y


class DigitNet(nn.Module):
    """Two hidden layers with ReLU: 64 -> width -> width -> 10."""

    def __init__(self, width: int = 128) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(64, width),
            nn.ReLU(),
            nn.Linear(width, width),
            nn.ReLU(),
            nn.Linear(width, 10),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers(x)
        return out


def loss(module: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(module(x), y)


def build(size: str = "small") -> Parts:
    """The factory Srifty calls (``size`` is the profile's size preset)."""
    x, y = digits()

    def make_batch(batch_size: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        idx = torch.randint(0, len(x), (batch_size,), generator=generator)
        return x[idx], y[idx]

    return Parts(module=DigitNet(WIDTH[size]), make_batch=make_batch, loss=loss)
