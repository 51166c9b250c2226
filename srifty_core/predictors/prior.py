"""The physics prior of the bus-bandwidth model: rated links from the hardware, with the
efficiency and latency of each link class learned from probes.

Contract: ``hardware_of(type)`` gives a type's rated links (``Hardware``; ``None`` outside
the catalog), ``vms_of`` and ``one_vm`` where a row's ranks sit (one per GPU, as the
sweep and the simulator place them), ``hardware_columns`` a row's links and classes.
``LinkPrior().fit(frame, busbw, weight)`` returns itself (scikit-learn style, fitted
attributes end in ``_``); ``predict(frame)`` gives each row's bus bandwidth in bytes/s,
positive; ``to_dict``/``from_dict`` round-trip it.

Imports the catalog (at call time: its types and their GPU specs); SciPy and threadpoolctl
only inside ``fit``.

How and why (the ring, the tree, what is learned): docs/design/bandwidth.md#prior
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from srifty_core.catalog import Catalog

if TYPE_CHECKING:
    import pandas as pd

PCIE_X16_GBS: Mapping[int, float] = {3: 15.75, 4: 31.5, 5: 63.0}
"""Rated per-direction bandwidth of a PCIe x16 link, GB/s, by generation (PCI-SIG: 8, 16,
32 GT/s per lane with 128b/130b encoding)."""
INTRA_CLASSES = ("nvlink", "pcie", "host")
NET_CLASSES = ("efa", "ena", "host-net")
CLASSES = INTRA_CLASSES + NET_CLASSES
NOMINAL_GBS = 1.0
"""The rating given to a link without one (``host``): its eta is then its GB/s."""
RIDGE = 1e-3
"""Weight of the ridge (per parameter, against a sum over rows of squared log errors)."""
ALPHA0_S = 1e-5
ETA_TREE0 = 0.5
"""Where the tree's fit starts and its ridge holds ``eta_tree``."""
ETA_TREE_MIN = 0.05
"""The slowest tree the fit considers (a fraction of the ring's bandwidth)."""
TREE_OFF = -1e3
"""``log eta_tree`` of a prior without a tree: the data did not want one (a tree wins tiny
buffers over many VMs at any bandwidth, so "off" is a state of its own), or the prior was
saved before the tree existed."""
TREE = 2 * len(CLASSES) + 1
"""Where ``log eta_tree`` sits in the parameters (after log eta and log alpha per class and
beta)."""
TYPES = TREE + 1
"""Where the per-type levels start in the parameters: a log NIC factor for each instance
type the fit saw over several VMs, then a log latency factor for each, relative to its
link class (``LinkPrior(type_levels=True)``)."""
TYPE_LEVEL_BOUND = 5.0
HARDWARE_COLUMNS = ("vms", "ranks_per_vm", "intra_gbs", "nic_gbs", "intra_class", "net_class")


@dataclass(frozen=True)
class Hardware:
    """The rated links of one instance type (``None``: no rating)."""

    intra_gbs: float | None
    intra_class: str
    nic_gbs: float | None
    net_class: str
    gpus_per_vm: int = 0
    """GPUs of one VM (0: none, or not in the catalog): a ring of this type inside one VM
    has at most this many ranks (one per GPU, as the simulator places them)."""


def pcie_generation(text: str) -> int | None:
    """The PCIe generation a host-interface text names (``"PCIe 3.0 x16"`` -> 3,
    ``"PCIe Gen4"`` -> 4), else None."""
    m = re.search(r"(?:gen\s*|pcie\s*)(\d)(?:\.\d)?", text or "", re.IGNORECASE)
    return int(m.group(1)) if m and int(m.group(1)) in PCIE_X16_GBS else None


@functools.cache
def _catalog_hardware() -> dict[str, Hardware]:
    out: dict[str, Hardware] = {}
    for t in Catalog.load(use_overlays=False).types:
        if t.name in out:
            continue
        gpu = t.gpu
        if gpu is not None and gpu.nvlink and gpu.nvlink_bw_gbs:
            intra: float | None = gpu.nvlink_bw_gbs / 2
            intra_class = "nvlink"
        else:
            gen = pcie_generation(gpu.host_interface) if gpu is not None else None
            # A GPU without a readable interface: PCIe 3, the oldest generation EC2 GPUs use.
            intra = PCIE_X16_GBS[gen or 3] if gpu is not None else None
            intra_class = "pcie" if gpu is not None else "host"
        rated = max(t.network_gbps or 0.0, t.network_burst_gbps or 0.0)
        out[t.name] = Hardware(
            intra_gbs=intra,
            intra_class=intra_class,
            nic_gbs=rated / 8 if rated > 0 else None,
            net_class=("efa" if t.efa_supported else "ena") if rated > 0 else "host-net",
            gpus_per_vm=max(0, int(t.gpus_per_vm)),
        )
    return out


def hardware_of(instance_type: str) -> Hardware | None:
    """The rated links of a catalog type, or None for a type the catalog lacks."""
    return _catalog_hardware().get(instance_type)


def catalog_types() -> list[str]:
    return sorted(_catalog_hardware())


def one_vm(instance_type: str, world_size: int) -> bool:
    """Whether a ring of ``world_size`` ranks of ``instance_type``, packed one per GPU (as
    the simulator and the probe sweeps place them), sits inside one VM: it then crosses
    NVLink or PCIe only, never the NIC. False for a type the catalog lacks or without GPUs
    (``local.cpu``: one rank per "VM", as ``hardware_columns`` has it)."""
    hw = hardware_of(instance_type)
    return hw is not None and int(world_size) <= hw.gpus_per_vm


def vms_of(features: pd.DataFrame) -> NDArray[np.int64]:
    """The VMs each row's ranks sit on (rules: module docstring): ``num_nodes`` where a
    row has one, else ranks packed one per GPU, ``ceil(world_size / gpus_per_vm)``."""
    world = features["world_size"].to_numpy(dtype=np.int64)
    gpus = np.maximum(features["gpus_per_vm"].to_numpy(dtype=np.int64), 1)
    vms = -(-world // gpus)
    if "num_nodes" in features.columns:
        given = features["num_nodes"].to_numpy(dtype=np.float64, na_value=np.nan)
        ok = np.isfinite(given) & (given >= 1)
        vms = np.where(ok, given, vms).astype(np.int64)
    out: NDArray[np.int64] = np.clip(vms, 1, np.maximum(world, 1)).astype(np.int64)
    return out


def hardware_columns(features: pd.DataFrame) -> pd.DataFrame:
    """``features`` with ``HARDWARE_COLUMNS`` added (rules: module docstring). A type the
    catalog lacks takes the row's ``network_gbps`` as its NIC and no intra rating."""
    import pandas as pd

    out = features.copy()
    world = out["world_size"].to_numpy(dtype=np.int64)
    vms = vms_of(out)
    out["vms"] = vms
    out["ranks_per_vm"] = -(-world // vms)
    rated = out["network_gbps"].to_numpy(dtype=np.float64, na_value=np.nan)
    keys = pd.MultiIndex.from_arrays([out["instance_type"].astype(str), rated])
    codes, uniques = keys.factorize()
    found: list[Hardware] = []
    for name, gbps in uniques:
        hw = hardware_of(name)
        if hw is None:
            ok = math.isfinite(gbps) and gbps > 0
            hw = Hardware(None, "host", gbps / 8 if ok else None, "ena" if ok else "host-net")
        found.append(hw)
    intra = np.asarray([np.nan if h.intra_gbs is None else h.intra_gbs for h in found])
    nic = np.asarray([np.nan if h.nic_gbs is None else h.nic_gbs for h in found])
    out["intra_gbs"] = intra[codes] if len(found) else np.zeros(0)
    out["nic_gbs"] = nic[codes] if len(found) else np.zeros(0)
    out["intra_class"] = np.asarray([h.intra_class for h in found] or [""], dtype=object)[codes]
    out["net_class"] = np.asarray([h.net_class for h in found] or [""], dtype=object)[codes]
    return out


@dataclass(frozen=True)
class _Rows:
    """A frame reduced to what the ring formula needs."""

    s_eff: NDArray[np.float64]
    passes: NDArray[np.float64]  # 2(n-1)/n
    hops_net: NDArray[np.float64]
    hops_intra: NDArray[np.float64]
    conc: NDArray[np.float64]
    intra_rate: NDArray[np.float64]  # GB/s rating (nominal where none)
    nic_rate: NDArray[np.float64]
    share: NDArray[np.float64]  # ranks per VM / GPUs per VM
    intra_k: NDArray[np.intp]  # class index
    net_k: NDArray[np.intp]
    multi: NDArray[np.bool_]  # several VMs
    packed: NDArray[np.bool_]  # several ranks on a VM
    tree_net: NDArray[np.float64]  # NIC hops of a tree pass: ceil(log2 v)
    tree_intra: NDArray[np.float64]  # intra-VM hops of a tree pass: the chain, ranks per VM - 1
    type_k: NDArray[np.intp]  # index of the row's type among those with a level, else -1


def _class_index(column: pd.Series) -> NDArray[np.intp]:
    """Each row's link class as its index in ``CLASSES`` (a KeyError names an unknown one)."""
    import pandas as pd

    codes, names = pd.factorize(column.astype(str))
    index = {c: i for i, c in enumerate(CLASSES)}
    return np.asarray([index[c] for c in names], dtype=np.intp)[codes].reshape(-1)


def _rows(frame: pd.DataFrame, types: tuple[str, ...] = ()) -> _Rows:
    """The rows' ring terms; ``types`` are the instance types with a learned NIC level (a
    row of another type has ``type_k`` -1: its class's level alone)."""
    import pandas as pd

    hw = frame if set(HARDWARE_COLUMNS) <= set(frame.columns) else hardware_columns(frame)
    if types and "instance_type" in hw.columns:
        type_k = pd.Index(list(types)).get_indexer(pd.Index(hw["instance_type"].astype(str)))
    else:
        type_k = np.full(len(hw), -1)
    n = hw["world_size"].to_numpy(dtype=np.float64)
    s = hw["buffer_bytes"].to_numpy(dtype=np.float64)
    vms = hw["vms"].to_numpy(dtype=np.float64)
    intra = hw["intra_gbs"].to_numpy(dtype=np.float64, na_value=np.nan)
    nic = hw["nic_gbs"].to_numpy(dtype=np.float64, na_value=np.nan)
    return _Rows(
        s_eff=2 * s * np.maximum(n - 1, 1) / np.maximum(n, 1),
        passes=2 * np.maximum(n - 1, 1) / np.maximum(n, 1),
        hops_net=np.where(vms > 1, vms, 0.0),
        hops_intra=np.where(vms > 1, n - vms, n),
        conc=np.maximum(hw["concurrent"].to_numpy(dtype=np.float64), 1),
        intra_rate=np.where(np.isfinite(intra) & (intra > 0), intra, NOMINAL_GBS),
        nic_rate=np.where(np.isfinite(nic) & (nic > 0), nic, NOMINAL_GBS),
        share=np.clip(
            hw["ranks_per_vm"].to_numpy(dtype=np.float64)
            / np.maximum(hw["gpus_per_vm"].to_numpy(dtype=np.float64), 1),
            1e-3,
            1.0,
        ),
        intra_k=_class_index(hw["intra_class"]),
        net_k=_class_index(hw["net_class"]),
        multi=hw["vms"].to_numpy(dtype=np.int64) > 1,
        packed=hw["ranks_per_vm"].to_numpy(dtype=np.int64) > 1,
        tree_net=np.ceil(np.log2(np.maximum(vms, 1))),
        tree_intra=np.maximum(hw["ranks_per_vm"].to_numpy(dtype=np.float64) - 1, 0),
        type_k=np.asarray(type_k, dtype=np.intp),
    )


def distinct_rows(table: NDArray[Any]) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """The distinct rows of a 2-D array, compared byte for byte (NaN equals NaN): the index
    of each one's first row, in order, and for each row the position of its distinct row
    in that list."""
    rows = np.ascontiguousarray(table).reshape(len(table), -1)
    keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
    _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return np.asarray(first[order], dtype=np.intp), np.asarray(rank[inverse], dtype=np.intp)


def _distinct(r: _Rows) -> tuple[_Rows, NDArray[np.intp]]:
    """The distinct rows of ``r`` and, for each row, the index of its distinct row."""
    fields = dataclasses.fields(r)
    table = np.column_stack([getattr(r, f.name).astype(np.float64) for f in fields])
    if len(table) == 0:
        return r, np.zeros(0, dtype=np.intp)
    first, inverse = distinct_rows(table)
    return _Rows(**{f.name: getattr(r, f.name)[first] for f in fields}), inverse


def _log_busbw(
    theta: NDArray[np.float64], r: _Rows, centring: NDArray[np.float64] | None = None
) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
    """log busbw (bytes/s) of each row under parameters ``theta`` = (log eta per class,
    log alpha per class, beta, log eta_tree, then the type levels if any: ``TYPES``), and
    the bottleneck class of each row. ``centring`` maps raw type levels to levels averaging
    zero within each class (while fitting)."""
    k = len(CLASSES)
    log_eta, log_alpha, beta = theta[:k], theta[k : 2 * k], theta[2 * k]
    tree_on = bool(theta[TREE] > TREE_OFF / 2)
    b_intra = np.exp(log_eta[r.intra_k]) * r.intra_rate * 1e9
    b_net = np.exp(log_eta[r.net_k]) * r.nic_rate * 1e9 * r.share**beta
    m = (len(theta) - TYPES) // 2
    lat_level = None
    if m:  # each learned type's NIC level and latency, relative to its class's
        nic, lat = theta[TYPES : TYPES + m], theta[TYPES + m :]
        if centring is not None:  # while fitting: levels averaging zero within each class
            nic, lat = centring @ nic, centring @ lat
        mine = r.type_k >= 0
        at = np.maximum(r.type_k, 0)
        b_net = b_net * np.exp(np.where(mine, nic[at], 0.0))
        lat_level = np.where(mine, lat[at], 0.0)
    # several VMs: the NIC, and the intra link too where a VM holds several ranks
    use_net = r.multi & (~r.packed | (b_net <= b_intra))
    bw = np.where(use_net, b_net, b_intra)
    cls = np.where(use_net, r.net_k, r.intra_k)
    alpha_net, alpha_intra = np.exp(log_alpha[r.net_k]), np.exp(log_alpha[r.intra_k])
    latency = r.passes * (r.hops_net * alpha_net + r.hops_intra * alpha_intra)
    lat_scale = 1.0 if lat_level is None else np.exp(lat_level)
    t = latency * lat_scale + r.conc * r.s_eff / bw
    if tree_on:
        tree_latency = 2 * (r.tree_net * alpha_net + r.tree_intra * alpha_intra) * lat_scale
        t_tree = tree_latency + r.conc * r.s_eff / (math.exp(theta[TREE]) * bw)
        t = np.where(r.multi, np.minimum(t, t_tree), t)
    return np.log(r.s_eff) - np.log(t), cls


class LinkPrior:
    """Bus bandwidth from rated links with learned efficiency and latency (module
    docstring). scikit-learn style: ``fit`` returns ``self``, fitted attributes end in
    ``_``. ``tree=False`` fits the ring alone (the prior before the tree, for comparison).

    ``type_levels=True`` (off by default) also learns, for each instance type seen over
    several VMs, a NIC level and a latency factor relative to its network class (averaging
    zero over the class's types; a type the fit never saw takes the class's own). On the
    public nccl-tests tables it makes the prior alone far better and the model at 4-32 VMs
    from 2-VM tables too, but it leaves the held-out row mean above the MTU where it was and
    costs the fit 2 parameters per type (about 12x the time at 24 types):
    ``benchmarks/investigations/prior_type_levels.py`` measures it."""

    def __init__(self, *, tree: bool = True, type_levels: bool = False) -> None:
        self.tree = tree
        self.type_levels = type_levels

    def fit(
        self, frame: pd.DataFrame, busbw: ArrayLike, weight: ArrayLike | None = None
    ) -> LinkPrior:
        from scipy.optimize import least_squares
        from threadpoolctl import threadpool_limits

        if not set(HARDWARE_COLUMNS) <= set(frame.columns):
            frame = hardware_columns(frame)  # once, whether the rows are made once or twice
        r = _rows(frame)
        # a level for each type seen over several VMs (where its NIC can bind)
        types: tuple[str, ...] = ()
        if self.type_levels and "instance_type" in frame.columns and r.multi.any():
            types = tuple(sorted(set(frame["instance_type"].astype(str)[r.multi])))
            r = _rows(frame, types)
        # Probes repeat their configurations (repeats, allocations): the formula runs once
        # per distinct row and each residual takes its row's value (the same numbers).
        u, inverse = _distinct(r)
        y = np.log(np.asarray(busbw, dtype=np.float64))
        w = np.ones(len(y)) if weight is None else np.asarray(weight, dtype=np.float64)
        w = np.sqrt(w / w.mean())
        k, m = len(CLASSES), len(types)
        # A type's levels are relative to its network class: they average zero over the
        # class's types (one type alone in its class has none), so the class's eta and
        # alpha stay the level of a type the fit never saw.
        classes = np.asarray(
            [r.net_k[r.type_k == i][0] if (r.type_k == i).any() else -1 for i in range(m)]
        )
        same = (classes[:, None] == classes[None, :]).astype(np.float64)
        centring = np.eye(m) - same / np.maximum(same.sum(axis=1, keepdims=True), 1.0)
        centre = np.concatenate(
            [
                np.zeros(k),
                np.full(k, math.log(ALPHA0_S)),
                [0.0, math.log(ETA_TREE0)],
                np.zeros(2 * m),
            ]
        )
        ridge = math.sqrt(RIDGE * len(y))
        lo = np.concatenate(
            [
                np.full(k, -12.0),
                np.full(k, math.log(1e-9)),
                [0.0, math.log(ETA_TREE_MIN)],
                np.full(2 * m, -TYPE_LEVEL_BOUND),
            ]
        )
        hi = np.concatenate(
            [
                np.full(k, 3.0),
                np.full(k, math.log(1e-1)),
                [1.0, 0.0],
                np.full(2 * m, TYPE_LEVEL_BOUND),
            ]
        )

        def solve(theta0: NDArray[np.float64], free: NDArray[np.intp]) -> Any:
            def residuals(x: NDArray[np.float64]) -> NDArray[np.float64]:
                theta = theta0.copy()
                theta[free] = x
                pred, _ = _log_busbw(theta, u, centring)
                return np.concatenate([w * (pred[inverse] - y), ridge * (x - centre[free])])

            return least_squares(
                residuals,
                theta0[free],
                bounds=(lo[free], hi[free]),
                loss="soft_l1",
                f_scale=0.3,
                max_nfev=200,
            )

        everything = np.arange(len(centre))
        ring_free = everything[everything != TREE]
        # The ring alone first, then the tree started from it: min(ring, tree) has no
        # gradient through the slower one, so started where the tree wins everywhere the
        # ring's parameters would not move. The tree stays off unless it fits better.
        # One BLAS thread: the solver's SVDs are of a tall, narrow Jacobian (14 columns and
        # one per type level), which a second thread does not speed up and a busy host
        # slows down many times (seen: 0.14 s instead of 0.007 s an SVD of 8,000 rows on 2
        # shared cores).
        with threadpool_limits(limits=1, user_api="blas"):
            theta = centre.copy()
            theta[TREE] = TREE_OFF
            ring = solve(theta, ring_free)
            theta[ring_free] = ring.x
            if self.tree and r.multi.any():
                start = theta.copy()
                start[TREE] = math.log(ETA_TREE0)
                tree = solve(start, everything)
                if tree.cost < ring.cost:
                    theta = np.asarray(tree.x, dtype=np.float64)
        if m:  # the levels as they act: centred within each class
            theta[TYPES : TYPES + m] = centring @ theta[TYPES : TYPES + m]
            theta[TYPES + m :] = centring @ theta[TYPES + m :]
        self.types_: tuple[str, ...] = types
        _, used = _log_busbw(theta, r)
        seen = sorted({CLASSES[i] for i in np.unique(used)})
        # latency: every class a row hops over; bandwidth: the bottleneck classes
        hopped = set(seen) | {CLASSES[i] for i in np.unique(r.net_k[r.hops_net > 0])}
        hopped |= {CLASSES[i] for i in np.unique(r.intra_k[r.hops_intra > 0])}
        self.classes_: list[str] = seen
        # classes no row crossed: the geometric mean of the learned ones
        idx = [CLASSES.index(c) for c in seen]
        lat = [k + CLASSES.index(c) for c in sorted(hopped)]
        for j, c in enumerate(CLASSES):
            if c not in seen and idx:
                theta[j] = float(np.mean(theta[idx]))
            if c not in hopped and lat:
                theta[k + j] = float(np.mean(theta[lat]))
        self.theta_: NDArray[np.float64] = theta
        return self

    def predict(self, frame: pd.DataFrame) -> NDArray[np.float64]:
        """Bus bandwidth, bytes/s, of each row."""
        if len(frame) == 0:
            return np.zeros(0)
        log_bw, _ = _log_busbw(self.theta_, _rows(frame, self.types_))
        out: NDArray[np.float64] = np.exp(log_bw)
        return out

    def params(self) -> dict[str, Any]:
        """The learned parameters by name (eta per class, alpha in seconds)."""
        k = len(CLASSES)
        return {
            "eta": {c: float(math.exp(self.theta_[i])) for i, c in enumerate(CLASSES)},
            "alpha_s": {c: float(math.exp(self.theta_[k + i])) for i, c in enumerate(CLASSES)},
            "beta": float(self.theta_[2 * k]),
            "eta_tree": float(math.exp(self.theta_[TREE])),  # 0: no tree
            # each type's NIC level as a factor on its class's eta
            "type_levels": {
                t: float(math.exp(v))
                for t, v in zip(
                    self.types_, self.theta_[TYPES : TYPES + len(self.types_)], strict=True
                )
            },
            "type_latency": {
                t: float(math.exp(v))
                for t, v in zip(self.types_, self.theta_[TYPES + len(self.types_) :], strict=True)
            },
            "classes_seen": list(self.classes_),
        }

    def to_dict(self) -> dict[str, Any]:
        return {"classes": list(CLASSES), "types": list(self.types_),
                "theta": [float(v) for v in self.theta_], **self.params()}  # fmt: skip

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LinkPrior:
        if list(d["classes"]) != list(CLASSES):
            raise ValueError(f"link prior: classes {d['classes']} differ from {list(CLASSES)}")
        prior = cls()
        theta = np.asarray(d["theta"], dtype=np.float64)
        if len(theta) == TREE:  # saved before the tree: a ring only
            theta = np.append(theta, TREE_OFF)
        prior.types_ = tuple(d.get("types", ()))  # saved before type levels: none
        if len(theta) != TYPES + 2 * len(prior.types_):
            raise ValueError(
                f"link prior: {len(theta)} parameters for {len(prior.types_)} type levels"
            )
        prior.theta_ = theta
        prior.classes_ = list(d.get("classes_seen", []))
        return prior
