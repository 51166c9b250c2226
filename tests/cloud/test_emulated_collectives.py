"""The emulated EC2 answers all_gather and reduce_scatter by nccl-tests' published relations
(``emulator_truth.collective_time``), and adding them changes none of its allreduce rows."""

from __future__ import annotations

import numpy as np
import pytest

from srifty_core.catalog import Catalog
from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.emulated.measurements import emulated_probe_sweep
from srifty_core.errors import ConfigError
from srifty_core.probing.config import COLLECTIVES

SIZES = np.asarray([4096.0, 1 << 20, 64 << 20])


def _net(name: str) -> truth.NetSpec:
    return truth.NetSpec.of(Catalog.load().get(name, "us-east-1"))


def test_all_gather_and_reduce_scatter_are_half_a_ring_allreduce() -> None:
    net = _net("p4d.24xlarge")
    for n in (2, 8, 32):  # one VM, and 4 VMs where small allreduces take the tree
        ring = truth.allreduce_time(net, SIZES, n, ring_only=True)
        for name in ("all_gather", "reduce_scatter"):
            got = truth.collective_time(name, net, SIZES, n)
            assert got.tolist() == pytest.approx((ring / 2).tolist())
        ar = truth.collective_time("all_reduce", net, SIZES, n)
        assert ar.tolist() == truth.allreduce_time(net, SIZES, n).tolist()
    # across 4 VMs the small allreduce takes the tree; the others cannot
    tree = truth.allreduce_time(net, SIZES, 32)
    assert tree[0] != pytest.approx(truth.allreduce_time(net, SIZES, 32, ring_only=True)[0])
    with pytest.raises(ConfigError, match="collective: must be one of"):
        truth.collective_time("all_to_all", net, SIZES, 2)


def test_adding_collectives_changes_no_allreduce_row() -> None:
    kw = {
        "sizes": [4096, 1 << 20, 64 << 20],
        "world_sizes": (2, 8),
        "concurrency": (1,),
        "allocations": 2,
        "seed": 5,
        "sustained": False,
    }
    alone = emulated_probe_sweep(["g4dn.12xlarge"], **kw).to_pandas()  # type: ignore[arg-type]
    both = emulated_probe_sweep(["g4dn.12xlarge"], collectives=COLLECTIVES, **kw).to_pandas()  # type: ignore[arg-type]
    ar = both[both["collective"] == "all_reduce"].reset_index(drop=True)
    assert alone.equals(ar) and set(alone["collective"]) == {"all_reduce"}
    counts = both.groupby("collective").size().to_dict()
    assert counts == {c: len(alone) for c in COLLECTIVES}
    # each collective on its own allocations, its busbw by nccl-tests' factor
    assert both.groupby("allocation_id")["collective"].nunique().max() == 1
    n, s, t = both["world_size"], both["buffer_bytes"], both["time_s"]
    factor = both["collective"].map({"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0})
    assert both["busbw"].tolist() == pytest.approx((factor * s * (n - 1) / (n * t)).tolist())
    with pytest.raises(ConfigError, match="collectives: must be one of"):
        emulated_probe_sweep(["g4dn.12xlarge"], collectives=("gather",), **kw)  # type: ignore[arg-type]
