"""The FSDP wrapping policy (which submodules are units) and its use on real processes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from srifty_core.errors import ConfigError
from srifty_core.measure.sharded_memory import rank_peaks
from srifty_core.sharding.memory import Layout
from srifty_core.sharding.units import shard_units, unit_parameters
from srifty_core.workloads import build


class Blocks(nn.Module):
    """An embedding, a list of three blocks and a head: a user's model, not in the zoo."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3))
        self.head = nn.Linear(8, 2)


class Tied(nn.Module):
    """Two children sharing a weight (a decoder tied to its embedding), as a one-layer
    masked language model's ``bert`` and ``cls`` do, beside a child of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(50, 8)
        self.decoder = nn.Linear(8, 50)
        self.decoder.weight = self.encoder.weight
        self.other = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.decoder(self.other(self.encoder(x)))
        return out


def test_a_unit_tied_to_parameters_outside_it_stays_with_the_root() -> None:
    m = Tied()
    assert shard_units(m) == [m.other]
    assert unit_parameters(m) == (50 * 8 + 50, 72)
    # FSDP2 takes the policy: no parameter in two groups (one process group of one)
    import torch.distributed as dist

    from srifty_core.sharding.wrap import wrap
    from srifty_core.training_settings import TrainingSettings

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        wrapped = wrap(m, Layout("fsdp", 1), TrainingSettings(), torch.device("cpu"))
        wrapped(torch.tensor([1, 2])).sum().backward()
        assert m.encoder.weight.grad is not None
    finally:
        dist.destroy_process_group()


def test_repeated_blocks_are_the_units_and_the_rest_stays_with_the_root() -> None:
    m = Blocks()
    assert shard_units(m) == list(m.blocks)
    # the root keeps the embedding (800) and the head (18); each block 72
    assert unit_parameters(m) == (818, 72, 72, 72)


def test_a_model_without_repeated_blocks_has_its_children_as_units() -> None:
    m = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    # a Sequential of children of different classes is not a list of blocks
    assert shard_units(m) == [m[0], m[2]]
    assert unit_parameters(m) == (0, 40, 9)


def test_a_transformer_is_sharded_by_its_layers() -> None:
    gpt2 = build("hf:gpt2", "tiny").module
    units = shard_units(gpt2)
    assert len(units) == 2 and all(type(u).__name__ == "GPT2Block" for u in units)
    counts = unit_parameters(gpt2)
    assert sum(counts) == sum(p.numel() for p in gpt2.parameters())
    assert counts[0] > 0  # embeddings (tied with the head) and the final norm


def test_fsdp2_wraps_and_trains_a_user_model_on_two_processes() -> None:
    # the wrapping policy applied by sharding.wrap on real gloo ranks (FSDP2's fully_shard
    # on each GPT2Block, then the root), one AdamW step in two micro-batches (the
    # trainer's split, ``batches.micro_split``), each rank's readings reported
    readings = rank_peaks("hf:gpt2", "tiny", Layout("fsdp", 2), 2, steps=1, micro_batches=2)
    assert len(readings) == 2 and all(0 < r.held <= r.peak for r in readings)
    assert all(len(r.losses) == 1 and math.isfinite(r.losses[0]) for r in readings)


def test_memory_readings_name_a_bad_device() -> None:
    with pytest.raises(ConfigError, match=r"^device: must be 'cpu' or 'cuda', got 'tpu'$"):
        rank_peaks("hf:gpt2", "tiny", Layout("ddp", 1), 1, device="tpu")
