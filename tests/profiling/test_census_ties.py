"""How the census holds the model (``census_count._built``): its parameters made on meta
where the factory allows (else built on the CPU, then moved), and a weight two modules
share (an LM head tied to its embedding) one parameter, as in the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.errors import ConfigError
from srifty_core.profiling.census import OpCensus, take_census
from srifty_core.workloads import build

TIED = """
from torch import nn


class Tied(nn.Module):
    def __init__(self, read=False):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        if read:  # a value read as it builds: no meta tensor has one
            self.scale = float(self.embed.weight.detach().abs().max())
        self.hidden = nn.Linear(16, 16)
        self.head = nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, x):
        return self.head(self.hidden(self.embed(x)))


def build(read=False):
    import torch

    data = torch.arange(50)  # the factory's data stays on the CPU (a batch is drawn from it)
    with open(__file__ + ".devices", "a") as f:
        f.write(f"{nn.Linear(1, 1).weight.device.type} {data.device.type}\\n")

    def batch(b, gen):
        x = data[torch.randint(0, 50, (b, 6), generator=gen)]
        return x, torch.randint(0, 50, (b, 6), generator=gen)

    def loss(m, batch):
        return nn.functional.cross_entropy(m(batch[0]).flatten(0, 1), batch[1].flatten())

    return Tied(read), batch, loss
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


def test_a_factory_is_built_on_meta_and_one_that_reads_a_value_on_the_cpu(
    tmp_path: Path,
) -> None:
    path = tmp_path / "tied.py"
    path.write_text(TIED)
    devices = Path(f"{path}.devices")
    meta = take_census(f"{path}:build", "tiny")
    # its parameters made on meta, its data on the CPU; one build a batch size
    assert devices.read_text().splitlines() == ["meta cpu"] * 2
    devices.unlink()
    read = tmp_path / "read.py"
    read.write_text(TIED.replace("def build(read=False)", "def build(read=True)"))
    cpu = take_census(f"{read}:build", "tiny")
    # each tried on meta, then built on the CPU
    assert Path(f"{read}.devices").read_text().splitlines() == ["meta cpu", "cpu cpu"] * 2
    assert cpu.device == meta.device == "meta" and cpu.n_parameters == meta.n_parameters
    assert (cpu.flops0, cpu.bytes1, cpu.peak_lines) == (meta.flops0, meta.bytes1, meta.peak_lines)


READS = """
from torch import nn


class Reads(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(64, 64)

    def forward(self, x):
        y = self.layer(x)
        return y if float(y.detach().abs().sum()) >= 0 else -y  # a value: no meta tensor has one


def build():
    import torch

    def batch(b, gen):
        return torch.randn(b, 64, generator=gen), torch.randn(b, 64, generator=gen)

    def loss(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    return Reads(), batch, loss
"""


def test_a_step_that_reads_a_value_is_counted_on_the_cpu_where_the_host_holds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from srifty_core.profiling import census_count

    path = tmp_path / "reads.py"
    path.write_text(READS)
    model = f"{path}:build"
    assert take_census(model, "tiny").device == "cpu"
    # 64 x 64 + 64 parameters, their gradients and SGD's momentum: 3 x 4 x 4,160 bytes
    monkeypatch.setattr(census_count, "available_bytes", lambda: 3 * 4 * 4160 - 1)
    said = r"meta device \(\w+Error: .*needs at least 0\.0 GiB, more than the 0\.0 GiB available"
    with pytest.raises(ConfigError, match=said):
        take_census(model, "tiny")
    monkeypatch.setattr(census_count, "available_bytes", lambda: 3 * 4 * 4160)
    assert take_census(model, "tiny").device == "cpu"


SHARED = """
import torch
from torch import nn


def build():
    a, b = nn.Linear(16, 16, bias=False), nn.Linear(16, 16, bias=False)
    shared = nn.Parameter(torch.randn(16, 16))
    a.weight = shared  # one parameter given to two modules: a tie made by hand
    b.weight = shared

    def batch(n, gen):
        return torch.randn(n, 16, generator=gen), torch.randn(n, 16, generator=gen)

    def loss(m, batch):
        return nn.functional.mse_loss(m(batch[0]), batch[1])

    return nn.Sequential(a, nn.ReLU(), b), batch, loss
"""


def test_one_parameter_given_to_two_modules_is_one_parameter(tmp_path: Path) -> None:
    path = tmp_path / "shared.py"
    path.write_text(SHARED)
    census = take_census(f"{path}:build", "tiny")
    assert census.device == "meta" and census.n_parameters == 16 * 16


def test_a_wrong_reference_is_one_error_and_never_built_again_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sequence over the config's position limit is the reference's own fault: refused
    at once (it was retried as a CPU build, which for an 8 B model ran out of memory)."""
    from srifty_core.profiling import census_count

    calls: list[str] = []

    def counted_build(model: str, size: str, seed: int = 0) -> object:
        calls.append(model)
        return build(model, size, seed=seed)

    monkeypatch.setattr(census_count, "build", counted_build)
    with pytest.raises(ConfigError, match="seq 99999 is over the config's position limit"):
        take_census("hf:llama-3-8b,seq=99999", "full")
    assert len(calls) == 1
