"""The method's seven case studies on the emulated EC2, and Srifty's plan for each.

Every case is a training job (model, global batch, per-type quotas, objective, limits). For
each one, ``case_setup`` builds the planner's inputs as on the emulated cloud:

1. the model's reference compute profile, shipped in
   ``srifty_core/shipped/reference_profiles/`` (made on a CPU by
   ``benchmarks/case_studies.py --reprofile``; its README says how);
2. per offered GPU, what the profiler would measure there (``emulated_profiles``; a GPU
   the network does not fit is dropped with its offers);
3. an emulated probe sweep of the offered types (world sizes up to each quota's ranks),
   fitted with the bandwidth model (default the probe table), for the ``Simulator``;
4. the ``PlanRequest``: catalog spot prices (us-east-1) where the catalog has one, else
   on-demand; launch overheads 0 (the limits are about training).

``plan_case_studies`` then calls ``planner.search.plan`` on each case and
``format_case_plans`` prints the plans as a table (a few seconds for all cases).
``benchmarks/case_studies.py`` uses the same setup to compare Srifty with the baselines on
the emulator's ground truth.

It lives outside ``planner/`` on purpose: the learned side (predictors, simulator,
planner) never imports the emulator; this module wires the two together, and the planner
only ever sees what a profiler and a probe sweep would measure.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from srifty_core.catalog import Catalog
from srifty_core.cloud import emulator_truth as truth
from srifty_core.cloud.emulated.measurements import emulated_probe_sweep, emulated_profiles
from srifty_core.cloud.emulator_truth import DeviceRate
from srifty_core.errors import ConfigError
from srifty_core.planner.request import Objective, Overheads, PlanRequest, offers_from_catalog
from srifty_core.profiling.store import load_reference_profile
from srifty_core.simulator.types import Workload

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from srifty_core.planner.request import Offer
    from srifty_core.planner.result import Candidate, PlanResult
    from srifty_core.predictors.base import BandwidthPredictor
    from srifty_core.profiling.profile import ComputeProfile

REGION = "us-east-1"
ONE_CORE = (0.05, 10.0)
"""The reference profiles ran on 1 CPU thread (as each DDP rank does): the ground truth's
``CPU_REFERENCE`` describes 2 cores (0.1 TFLOPS, 20 GB/s), so the reference device of these
profiles is half of it, in TFLOPS and GB/s. Emulated profiles and runs both use it."""
PROFILE_SEED = 11
"""Seed of the emulated provider that profiles each case's GPUs (at ``seed=0``)."""
PROBE_SEED = 7
"""Seed of the emulated probe sweeps (at ``seed=0``)."""
PROBE_WORLD_SIZES = (2, 4, 8, 16, 32, 64, 128, 256)
"""World sizes a probe sweep may cover; each type's stops at its quota's ranks."""

BandwidthFit = Callable[["pd.DataFrame"], "BandwidthPredictor"]
"""Fits a bandwidth model on a probe frame (e.g. ``ProbeTableBandwidth().fit``)."""


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    global_batch: int
    quotas: Mapping[str, int]
    objective: str
    iterations: int = 1000
    time_limit_s: float = math.inf
    budget_usd: float = math.inf
    note: str = ""


G4, G3, P3 = "g4dn.8xlarge", "g3.8xlarge", "p3.8xlarge"
CASES = (
    Case("1", "resnet50", 128, {G4: 64}, "time"),
    Case("2", "vgg16", 512, {G3: 64}, "time"),
    Case("3", "alexnet", 1024, {G3: 64}, "time", note="quota read as case 2's (64 g3.8xlarge)"),
    Case("4", "dlrm", 1024, {G4: 32, G3: 32}, "cost"),
    Case("5a", "xlm", 512, {G4: 32, G3: 32}, "cost"),
    Case("5b", "bert_base", 1024, {G4: 32, G3: 32}, "cost"),
    Case("6", "inception_v3", 2112, {P3: 4, G3: 8, G4: 8}, "time", 500, 300.0, 1.4,
         note="2.1K read as 2112 = 33 x 64"),
    Case("6x", "inception_v3", 2112, {P3: 4, G3: 8, G4: 8}, "time", 500, 600.0, 2.8,
         note="case 6 with both limits doubled: the emulated GPUs miss the original ones"),
    Case("7", "shufflenet_v2", 6144, {P3: 4, G3: 8, G4: 8}, "time", 1000, 360.0, 2.5),
)  # fmt: skip
QUICK = ("1", "4", "6")


def get_case(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    known = ", ".join(c.name for c in CASES)
    raise ConfigError(f"case {name!r}: not one of the case studies ({known})")


# ---------------------------------------------------------------------------- inputs
def one_core() -> DeviceRate:
    """The reference device of the reference profiles (``ONE_CORE``)."""
    return DeviceRate(*ONE_CORE)


def offers_for(
    case: Case, catalog: Catalog, workload_gpus: set[str]
) -> tuple[tuple[Offer, ...], list[str]]:
    """The case's offers (spot where the catalog has a spot price, else on-demand; types
    whose GPU is not in ``workload_gpus`` dropped) and notes on what was changed."""
    spec, notes = [], []
    for name, q in case.quotas.items():
        t = catalog.get(name, REGION)
        if t.device_type not in workload_gpus:
            notes.append(f"{name} dropped: {case.model} does not fit one {t.device_type}")
            continue
        try:
            catalog.cheapest_spot(name, REGION)
            market = "spot"
        except Exception:
            market = "on-demand"
            notes.append(f"{name} on-demand (the catalog has no spot price)")
        spec.append({"type": name, "market": market, "quota": q})
    return offers_from_catalog(catalog, spec, REGION), notes


@dataclass
class CaseCache:
    """What repeats across cases, kept by ``plan_case_studies``: the shipped reference
    profiles per model, the emulated profiles made from them per (model, types, seed) and
    probe sweeps per (type, world sizes, seed). The keys hold every other input, so a
    cached value is the one a fresh run would make."""

    references: dict[str, tuple[ComputeProfile, dict[str, Any]]] = field(default_factory=dict)
    profiles: dict[tuple[str, tuple[str, ...], int], dict[str, ComputeProfile]] = field(
        default_factory=dict
    )
    probes: dict[tuple[str, tuple[int, ...], int], pa.Table] = field(default_factory=dict)


def probe_frame(
    quotas: Mapping[str, int],
    catalog: Catalog,
    *,
    seed: int = PROBE_SEED,
    cache: CaseCache | None = None,
) -> pd.DataFrame:
    """An emulated probe sweep of each type, world sizes up to its quota's ranks (at least
    2), as one frame for a bandwidth model's ``fit``."""
    import pyarrow as pa

    tables = []
    for name, q in sorted(quotas.items()):
        ranks = q * max(1, catalog.get(name, REGION).gpus_per_vm)
        ws = tuple(w for w in PROBE_WORLD_SIZES if w <= max(2, ranks))
        key = (name, ws, seed)
        table = cache.probes.get(key) if cache is not None else None
        if table is None:
            table = emulated_probe_sweep([name], world_sizes=ws, seed=seed)
            if cache is not None:
                cache.probes[key] = table
        tables.append(table)
    frame: pd.DataFrame = pa.concat_tables(tables).to_pandas()
    return frame


def case_profiles(
    case: Case,
    reference: ComputeProfile,
    catalog: Catalog,
    *,
    seed: int = PROFILE_SEED,
    cache: CaseCache | None = None,
) -> dict[str, ComputeProfile]:
    """``{device_type: profile}``: what the profiler would measure on the GPU of each of the
    case's types, in quota order on one emulated provider; GPUs the network does not fit
    (one sample over the GPU's memory) are left out."""
    fits = tuple(
        name
        for name in case.quotas
        if truth.max_batch_in_memory(reference, catalog.get(name, REGION), 1) >= 1
    )
    key = (case.model, fits, seed)
    if cache is not None and key in cache.profiles:
        return dict(cache.profiles[key])
    out = emulated_profiles(
        fits,
        reference,
        probes=4,
        repeats=5,
        region=REGION,
        seed=seed,
        catalog=catalog,
        reference_rate=one_core(),
    )
    if cache is not None:
        cache.profiles[key] = dict(out)
    return out


def probe_table_fit(frame: pd.DataFrame) -> BandwidthPredictor:
    """The default bandwidth model: the probe table fitted on ``frame``."""
    from srifty_core.predictors.table import ProbeTableBandwidth

    return ProbeTableBandwidth().fit(frame)


@dataclass(frozen=True)
class CaseSetup:
    """A case's planner inputs on the emulated cloud."""

    case: Case
    request: PlanRequest
    reference: ComputeProfile
    reference_meta: dict[str, Any]
    bandwidth: BandwidthPredictor
    bandwidth_fit_s: float
    """Seconds of the probe sweep and the bandwidth model's fit."""
    notes: tuple[str, ...]


def case_setup(
    case: Case,
    catalog: Catalog | None = None,
    *,
    seed: int = 0,
    fit_bandwidth: BandwidthFit | None = None,
    reference: tuple[ComputeProfile, dict[str, Any]] | None = None,
    cache: CaseCache | None = None,
) -> CaseSetup:
    """The case's request and bandwidth model (steps 1-4 of the module's docstring).

    ``seed`` shifts the emulator's draws (profiling and probe sweep); 0 gives the
    benchmark's. ``reference``: the reference profile and its meta (default the shipped
    one). ``fit_bandwidth``: default ``probe_table_fit``."""
    catalog = catalog or Catalog.load()
    profile_cache = cache
    if reference is not None:
        profile_cache = None  # the cache's profiles are of the shipped reference profiles
    elif cache is not None and case.model in cache.references:
        reference = cache.references[case.model]
    else:
        reference = load_reference_profile(case.model)
        if cache is not None:
            cache.references[case.model] = reference
    ref, meta = reference
    profiles = case_profiles(case, ref, catalog, seed=PROFILE_SEED + seed, cache=profile_cache)
    offers, notes = offers_for(case, catalog, set(profiles))
    t0 = time.perf_counter()
    frame = probe_frame(
        {o.instance.name: o.quota for o in offers}, catalog, seed=PROBE_SEED + seed, cache=cache
    )
    bandwidth = (fit_bandwidth or probe_table_fit)(frame)
    fit_s = time.perf_counter() - t0
    request = PlanRequest(
        workload=Workload(case.model, profiles),
        global_batch=case.global_batch,
        iterations=case.iterations,
        offers=offers,
        time_limit_s=case.time_limit_s,
        budget_usd=case.budget_usd,
        objective=Objective.parse(case.objective),
        overheads=Overheads(launch_s=0.0),
    )
    all_notes = [case.note, *notes] if case.note else notes
    return CaseSetup(case, request, ref, meta, bandwidth, fit_s, tuple(all_notes))


# ---------------------------------------------------------------------------- plans
def short_label(label: str) -> str:
    """``2xp3.8xlarge@512+...`` (the method's notation; market dropped)."""
    return label.replace("/spot", "").replace("/on-demand", "")


@dataclass(frozen=True)
class CasePlan:
    """Srifty's plan for one case: the choice and its predicted numbers, or, when nothing
    meets the limits, ``feasible`` False and the nearest miss."""

    case: Case
    label: str | None
    """The chosen configuration (``<n>x<type>/<market>@<batch per VM>+...``); None when
    no configuration meets the limits."""
    t_iter_s: float | None
    time_s: float | None
    cost_usd: float | None
    feasible: bool
    solve_s: float
    nearest_miss: Candidate | None
    """The configuration closest to meeting the limits, when none meets them."""
    result: PlanResult
    notes: tuple[str, ...]

    @classmethod
    def of(cls, case: Case, result: PlanResult, notes: Sequence[str] = ()) -> CasePlan:
        best = result.best
        miss = None if best is not None or not result.nearest_misses else result.nearest_misses[0]
        return cls(
            case=case,
            label=best.label if best else None,
            t_iter_s=best.estimate.t_iter if best else None,
            time_s=best.time_s if best else None,
            cost_usd=best.cost_usd if best else None,
            feasible=best is not None,
            solve_s=result.solve_s,
            nearest_miss=miss,
            result=result,
            notes=tuple(notes),
        )


def plan_case_studies(
    names: Sequence[str] | None = None,
    *,
    seed: int = 0,
    catalog: Catalog | None = None,
    fit_bandwidth: BandwidthFit | None = None,
) -> list[CasePlan]:
    """Srifty's plan for each case study (``names``, default all, in ``CASES`` order) on the
    emulated cloud: ``case_setup`` then ``plan`` with the ``Simulator``. Same seed, same
    plans. Raises ``ConfigError`` for an unknown case name."""
    from srifty_core.planner.search import plan
    from srifty_core.simulator.estimator import Simulator

    cases = [get_case(n) for n in names] if names is not None else list(CASES)
    catalog = catalog or Catalog.load()
    cache = CaseCache()
    out = []
    for case in cases:
        setup = case_setup(case, catalog, seed=seed, fit_bandwidth=fit_bandwidth, cache=cache)
        result = plan(setup.request, Simulator(setup.bandwidth))
        out.append(CasePlan.of(case, result, setup.notes))
    return out


def _limits(case: Case) -> str:
    parts = []
    if not math.isinf(case.time_limit_s):
        parts.append(f"{case.time_limit_s:g} s")
    if not math.isinf(case.budget_usd):
        parts.append(f"${case.budget_usd:.2f}")
    return ", ".join(parts) or "-"


def format_case_plans(plans: Sequence[CasePlan]) -> str:
    """A fixed-width table, one row per case: the job (global batch, ``type:quota``,
    objective, limits), the choice (``<n>x<type>@<batch per
    VM>``, market left out) with its predicted training time and cost, and whether it meets
    the limits; below it, for each case where nothing does, the nearest miss."""
    head = "case model batch quotas_(VMs) minimize limits choice time_s cost_$ feasible"
    header = tuple(h.replace("_", " ") for h in head.split())
    rows: list[tuple[str, ...]] = []
    misses: list[str] = []
    for p in plans:
        c = p.case
        quotas = " ".join(f"{t}:{n}" for t, n in c.quotas.items())
        cells = (c.name, c.model, str(c.global_batch), quotas, c.objective, _limits(c))
        if p.feasible and p.label is not None:
            assert p.time_s is not None and p.cost_usd is not None
            rows.append(
                (*cells, short_label(p.label), f"{p.time_s:.0f}", f"{p.cost_usd:.2f}", "yes")
            )
            continue
        rows.append((*cells, "none", "-", "-", "no"))
        m = p.nearest_miss
        if m is not None:
            misses.append(
                f"case {c.name}: no configuration meets the limits; nearest miss "
                f"{short_label(m.label)}: {m.time_s:.0f} s, ${m.cost_usd:.2f} "
                f"({', '.join(m.violations)})"
            )
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    numeric = {2, 7, 8}

    def line(r: Sequence[str]) -> str:
        cells = (
            x.rjust(w) if i in numeric else x.ljust(w)
            for i, (x, w) in enumerate(zip(r, widths, strict=True))
        )
        return "  ".join(cells).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows), *misses])
