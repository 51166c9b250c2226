"""The per-rank memory model: what each strategy holds, and B_max from it."""

from __future__ import annotations

import pytest

from srifty_core.errors import ConfigError
from srifty_core.sharding.memory import (
    Layout,
    ModelMemory,
    b_max,
    parse_strategy,
    rank_memory,
)
from srifty_core.training_settings import TrainingSettings

ADAMW_BF16 = TrainingSettings(precision="bf16", optimizer="adamw")
GIB = 2**30


def gpt2_xl_like() -> ModelMemory:
    # 1.56B parameters: 48 blocks of 30.7M, the root's 80M (embeddings); 25 MiB per sample
    return ModelMemory((80_000_000, *[30_700_000] * 48), 25 * 2**20)


def test_adamw_holds_sixteen_bytes_per_parameter_in_ddp() -> None:
    m = ModelMemory((1000, 500, 500), 0.0)
    one = rank_memory(m, ADAMW_BF16, Layout("ddp", 1), 0)
    assert one.parameters + one.gradients + one.optimizer == 16 * 2000
    assert one.communication == 0  # one rank: no buckets
    assert rank_memory(m, ADAMW_BF16, Layout("ddp", 4), 0).communication == 4 * 2000


def test_sgd_holds_one_state_per_parameter() -> None:
    m = ModelMemory((2000,), 0.0)
    r = rank_memory(m, TrainingSettings(), Layout("ddp", 1), 0)
    assert r.optimizer == 4 * 2000


def test_fsdp_shards_the_state_over_every_rank_and_hsdp_over_a_vm() -> None:
    m = gpt2_xl_like()
    ddp = rank_memory(m, ADAMW_BF16, Layout("ddp", 8), 1)
    fsdp = rank_memory(m, ADAMW_BF16, Layout("fsdp", 8), 1)
    hsdp = rank_memory(m, ADAMW_BF16, Layout("hsdp", 8, ranks_per_vm=4), 1)
    assert fsdp.optimizer == pytest.approx(ddp.optimizer / 8, rel=1e-6)
    assert hsdp.optimizer == pytest.approx(ddp.optimizer / 4, rel=1e-6)
    assert fsdp.activations == ddp.activations  # a sample's activations are not sharded
    # the gathered root and two units, not the whole model
    assert fsdp.communication == 80_000_000 * (2 + 4) + 30_700_000 * (2 * 2 + 4)


def test_a_model_no_gpu_holds_fits_sharded() -> None:
    # 1.56B params with AdamW is 25 GB of state: no 24 GiB A10G holds a replica, 8 shards do
    m = gpt2_xl_like()
    a10g = 24 * GIB
    assert b_max(m, ADAMW_BF16, Layout("ddp", 8), a10g) == 0
    sharded = b_max(m, ADAMW_BF16, Layout("fsdp", 8), a10g)
    assert sharded > 100
    assert b_max(m, ADAMW_BF16, Layout("fsdp", 16), a10g) > sharded
    assert b_max(m, ADAMW_BF16, Layout("hsdp", 8, ranks_per_vm=4), a10g) < sharded


def test_b_max_is_the_largest_batch_that_fits() -> None:
    m = ModelMemory((1000,), 100.0, 50.0)
    layout = Layout("ddp", 1)
    assert b_max(m, TrainingSettings(), layout, 12_000.0, usable=1.0) == 0  # the state alone
    b = b_max(m, TrainingSettings(), layout, 13_000.0, usable=1.0)
    assert b == 9  # (13,000 - 12,000 - 50) // 100
    big = b_max(m, TrainingSettings(), layout, 10 * 2**20, usable=1.0)
    assert rank_memory(m, TrainingSettings(), layout, big).total <= 10 * 2**20
    assert rank_memory(m, TrainingSettings(), layout, big + 1).total > 10 * 2**20


def test_no_per_sample_activations_is_bounded_by_the_ceiling() -> None:
    m = ModelMemory((10,), 0.0)
    assert b_max(m, TrainingSettings(), Layout("ddp", 1), GIB, ceiling=4096) == 4096


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: parse_strategy("zero3"), "strategy"),
        (lambda: Layout("fsdp", 0), "world"),
        (lambda: Layout("hsdp", 4, ranks_per_vm=8), "ranks_per_vm"),
        (lambda: ModelMemory((), 1.0), "unit_parameters"),
        (
            lambda: b_max(ModelMemory((1,), 1.0), TrainingSettings(), Layout("ddp", 1), 0),
            "capacity_bytes",
        ),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_field(make, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as err:
        make()
    assert str(err.value).startswith(field) and "\n" not in str(err.value)
