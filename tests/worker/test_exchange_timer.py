"""The worker's timed DDP hook sums the ranks' gradients and leaves the division by the
world size to the loss (``loss_factor``): no pass over the buckets of its own."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from srifty_core.worker.exchange_timer import ExchangeTimer


def test_the_hook_sums_and_the_loss_carries_one_over_world() -> None:
    # a process group of this process alone: the all-reduce is the identity, so what
    # DDP hands back is exactly what the hook did to the bucket
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # type: ignore[attr-defined]
    try:
        torch.manual_seed(0)
        plain = torch.nn.Linear(8, 4)
        wrapped = torch.nn.Linear(8, 4)
        wrapped.load_state_dict(plain.state_dict())
        ddp = torch.nn.parallel.DistributedDataParallel(wrapped)
        timer = ExchangeTimer(4)  # as on a rank of four
        ddp.register_comm_hook(None, lambda state, bucket: timer.hook(state, bucket))
        x = torch.randn(16, 8)
        assert timer.loss_factor == 0.25
        timer.start(time.perf_counter())
        (ddp(x).pow(2).mean() * timer.loss_factor).backward()
        plain(x).pow(2).mean().backward()
        for a, b in zip(wrapped.parameters(), plain.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            # one rank's share of the average: its gradient / 4, from the loss alone
            torch.testing.assert_close(a.grad, b.grad / 4)
        assert timer.compute_s(time.perf_counter()) > 0.0
        # DDP's reducer holds the group: freed only after destroy_process_group, gloo's
        # destructor joined its run-loop threads forever (seen once, a C++ hang no
        # pytest-timeout signal interrupts), so it goes while the group is alive
        del ddp
    finally:
        dist.destroy_process_group()
