"""A weight two modules share (an LM head tied to its embedding) is one parameter in the
census, as in the model (``census_count.count`` moves the model to meta in place)."""

from __future__ import annotations

from pathlib import Path

from srifty_core.profiling.census import OpCensus, take_census
from srifty_core.workloads import build

TIED = """
from torch import nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.hidden = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.hidden(self.embed(x)))


def build():
    import torch

    def batch(b, gen):
        x = torch.randint(0, 50, (b, 6), generator=gen)
        return x, torch.randint(0, 50, (b, 6), generator=gen)

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]).flatten(0, 1), batch[1].flatten())

    return Tied(), batch, loss
"""


def test_a_tied_weight_is_counted_once_and_an_older_census_is_counted_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tied.py"
    path.write_text(TIED)
    model = f"{path}:build"
    real = sum(p.numel() for p in build(model, "tiny").module.parameters())
    assert real == 50 * 16 + 16 * 16 + 16  # the head's weight is the embedding's
    census = take_census(model, "tiny")
    assert census.n_parameters == real and census.current
    assert census.gradient_bytes == 4 * real
    # a census counted before ties were kept (each module its own copy on meta) is stale
    old = {k: v for k, v in census.to_dict().items() if k != "ties_kept"}
    assert not OpCensus.from_dict(old).current
