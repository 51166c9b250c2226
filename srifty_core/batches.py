"""The arithmetic of unequal local batches over a plan's ranks: the split of a global
batch, of a local batch into micro-batches, and each rank's loss scale; one home for the
trainer (``worker``), the control plane (``jobs``) and the memory measurement
(``measure``). The plan itself (the PLAN.json document) is
``planner.schema.train_plan.TrainPlan``. No torch."""

from __future__ import annotations

from collections.abc import Sequence

from srifty_core.errors import ConfigError


def split_batch(global_batch: int, ranks: int) -> tuple[int, ...]:
    """``global_batch`` split as evenly as possible over ``ranks`` (larger ones first)."""
    if ranks < 1 or ranks > global_batch:
        raise ConfigError(f"cannot split a batch of {global_batch} over {ranks} ranks")
    q, r = divmod(global_batch, ranks)
    return tuple(q + (1 if k < r else 0) for k in range(ranks))


def micro_split(local_batch: int, micro_batches: int) -> tuple[int, ...]:
    """A local batch's micro-batch sizes (``split_batch``: as equal as possible, larger
    first). Micro-batch ``j`` of ``m_j`` samples scales its mean loss by ``m_j / b``
    besides the rank's ``loss_scale``: the accumulated gradient is then the one of the whole
    local batch."""
    if micro_batches < 1 or micro_batches > local_batch:
        raise ConfigError(
            f"micro_batches: must be between 1 and the local batch {local_batch}, "
            f"got {micro_batches}"
        )
    return split_batch(local_batch, micro_batches)


def micro_batches_for(
    local_batches: Sequence[int], micro_batches: int, new_batches: Sequence[int]
) -> int:
    """The micro-batches that keep a plan's largest micro-batch (what its GPUs were planned
    to hold) when its ranks take ``new_batches`` instead (survivors of a preemption
    taking the global batch over): ``ceil(max(new) / ceil(max(old) / k))``, at most the
    smallest new local batch, at least 1. A plan without micro-batches (k = 1) keeps
    none: nothing here knows what its GPUs hold beyond what it planned."""
    if micro_batches <= 1:
        return 1
    size = -(-max(local_batches) // micro_batches)
    return max(1, min(-(-max(new_batches) // size), min(new_batches)))


def loss_scale(local_batches: Sequence[int], rank: int) -> float:
    """``world_size * b_rank / B_global``: the factor that makes DDP's average of the ranks'
    mean losses the mean over every sample of the global batch."""
    return len(local_batches) * local_batches[rank] / sum(local_batches)
