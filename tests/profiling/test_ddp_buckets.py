"""The profiler's buckets are DDP's own: checked against a real 2-process gloo DDP run."""

from __future__ import annotations

import pytest
import torch

from srifty_core.profiling.buckets import (
    ddp_observed_buckets,
    form_buckets,
    gradient_ready_schedule,
    trainable,
)
from srifty_core.workloads.zoo import build


@pytest.mark.parametrize(("name", "expected_buckets"), [("resnet18", 2), ("dlrm", 3)])
def test_buckets_match_what_ddp_comm_hook_sees(name: str, expected_buckets: int) -> None:
    torch.set_num_threads(1)
    w = build(name, "small", seed=0)
    schedule = gradient_ready_schedule(w, w.make_batch(2, torch.device("cpu")), repeats=2)
    predicted = form_buckets(trainable(w.module), schedule)
    observed = ddp_observed_buckets(name, "small", batch_size=2, iterations=3)
    # first iteration: DDP reduces everything in one bucket, then rebuilds in ready order
    assert len(observed[0]) == 1
    steady = observed[-1]
    assert observed[1] == steady
    assert [i for i, _ in steady] == [b.index for b in predicted]
    assert [n for _, n in steady] == [b.size_bytes for b in predicted]
    assert len(predicted) == expected_buckets
    # buckets are reduced in the order their gradients become ready
    fractions = [b.ready_fraction for b in predicted]
    assert fractions == sorted(fractions)
    assert predicted[0].size_bytes <= 1024 * 1024 + max(
        p.numel() * p.element_size() for p in trainable(w.module)
    )


def test_the_bucket_defaults_are_ddps() -> None:
    """The profiler's settings write DDP's bucket sizes down (no torch import there)."""
    import torch.distributed as dist

    from srifty_core.profiling.config import DEFAULT_BUCKET_CAP_BYTES, DEFAULT_FIRST_BUCKET_BYTES

    assert DEFAULT_FIRST_BUCKET_BYTES == dist._DEFAULT_FIRST_BUCKET_BYTES  # type: ignore[attr-defined]
    assert DEFAULT_BUCKET_CAP_BYTES == 25 * 2**20  # DistributedDataParallel(bucket_cap_mb=25)
