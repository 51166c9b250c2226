"""A digit classifier on real data that ships with scikit-learn (nothing is downloaded).

scikit-learn's ``load_digits`` reads its bundled copy of the UCI optical-recognition
digits: 1,797 8x8 grey-level images of the digits 0-9. ``build`` is a Srifty model
factory (``srifty profile --model examples/digits/model.py:build``): it returns the
network, a batch maker that draws real samples, and the loss.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from srifty_core.workloads import Parts

WIDTH = {"tiny": 32, "small": 128, "full": 512}
"""Hidden units per size preset."""


@functools.cache
def digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 images as float32 rows of 64 pixels scaled to [0, 1], and their labels."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
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
