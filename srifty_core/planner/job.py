"""The planning job behind ``srifty plan``: read a request file, load what the estimator
needs (profiles, a bandwidth model), plan, and render the answer."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from srifty_core.catalog import Catalog
from srifty_core.errors import ConfigError
from srifty_core.planner.request import PlanRequest, build_request
from srifty_core.planner.result import PlanResult
from srifty_core.planner.schema.field_errors import HugeInt
from srifty_core.planner.schema.request_spec import RequestSpec
from srifty_core.planner.whatif import profile_loader
from srifty_core.predictors.base import BandwidthPredictor
from srifty_core.profiling.census import stored_unit_parameters
from srifty_core.profiling.store import ProfileStore

MAX_REQUEST_BYTES = 1 << 20
"""A request file is a few hundred bytes; anything over 1 MiB is refused unread."""


def read_request_file(path: Path) -> dict[str, Any]:
    """The mapping in a request file (``.json``: JSON, else YAML). Unreadable, binary or
    malformed files are a ``ConfigError`` naming the file and, where the parser knows it,
    the line; the fields are checked later (``planner.schema.request_spec.RequestSpec``)."""
    if not path.is_file():
        raise ConfigError(f"request file not found: {path}")
    try:
        if path.stat().st_size > MAX_REQUEST_BYTES:
            raise ConfigError(f"{path}: larger than {MAX_REQUEST_BYTES} bytes; not a request")
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{path}: not UTF-8 text (byte {exc.start}); a request is YAML or JSON"
        ) from None
    if "\x00" in text:
        raise ConfigError(f"{path}: binary data (a NUL byte); a request is YAML or JSON")
    data = _parse_json(path, text) if path.suffix.lower() == ".json" else _parse_yaml(path, text)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a request is a mapping of fields (model, global_batch, ...)")
    return data


def _int_or_huge(text: str) -> int | HugeInt:
    try:
        return int(text)
    except ValueError:
        return HugeInt(len(text.lstrip("+-").replace("_", "")))


def _parse_json(path: Path, text: str) -> Any:
    try:
        return json.loads(text, parse_int=_int_or_huge)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{path}: not valid JSON ({_one_line(exc)})") from None


def _parse_yaml(path: Path, text: str) -> Any:
    import yaml

    try:
        return yaml.load(text, Loader=_request_loader())  # a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = exc.problem or exc.context or "malformed"
        raise ConfigError(f"{path}: not valid YAML ({where}{_one_line(problem)})") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise ConfigError(f"{path}: not valid YAML ({_one_line(exc)})") from None


def _one_line(x: object) -> str:
    return " ".join(str(x).split())[:200]


@functools.cache
def _request_loader() -> Any:
    """``yaml.SafeLoader`` that keeps an over-long integer as ``HugeInt`` and refuses a key
    given twice in one mapping (the second would silently win)."""
    import yaml

    class Loader(yaml.SafeLoader):  # type: ignore[misc]
        pass

    def construct_int(loader: Any, node: Any) -> Any:
        try:
            return yaml.SafeLoader.construct_yaml_int(loader, node)
        except ValueError:
            return HugeInt(sum(c.isdigit() for c in str(node.value)))

    def construct_mapping(loader: Any, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = loader.construct_object(key_node, deep=deep)
            try:
                twice = key in seen
                seen.add(key)
            except TypeError:  # an unhashable key: the base class says so
                break
            if twice:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {_short(key)} given twice", key_node.start_mark
                )
        return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)

    Loader.add_constructor("tag:yaml.org,2002:int", construct_int)
    Loader.add_constructor("tag:yaml.org,2002:map", Loader.construct_yaml_map)
    Loader.construct_mapping = construct_mapping
    return Loader


def _short(key: Any) -> str:
    if isinstance(key, str):
        return repr(key) if len(key) <= 40 else repr(key[:37]) + "..."
    return "a key" if isinstance(key, int) and abs(key) > 10**20 else repr(key)[:40]


def store_requests(
    catalog: Any, store: Any
) -> Callable[[Mapping[str, Any] | RequestSpec], PlanRequest]:
    """Request (a dict, checked by ``RequestSpec``, or a checked one) -> ``PlanRequest``
    (``planner.request.build_request``) with the profiles of ``store`` (a
    ``ProfileStore``; a GPU it has no profile of, estimated: ``load_or_estimate``): each
    profile read once (``whatif.profile_loader``: every request
    built holds the same profile objects, which the simulator's caches key on) and the
    store's VM spreads (``ProfileStore.vm_spreads``, the workloads' ``vm_evidence``) read
    once for all of them. ``srifty plan``, the what-if DAG and a job's plan build with it."""
    load = profile_loader(functools.partial(store.load_or_estimate, catalog=catalog))
    evidence = store.vm_spreads()

    units = functools.partial(stored_unit_parameters, root=getattr(store, "root", None))

    def build(d: Mapping[str, Any] | RequestSpec) -> PlanRequest:
        spec = d if isinstance(d, RequestSpec) else RequestSpec.parse(d)
        return build_request(
            spec, catalog=catalog, load_profile=load, vm_evidence=evidence, load_units=units
        )

    return build


def load_request(
    data: Mapping[str, Any] | RequestSpec, profiles_root: Path | None = None
) -> PlanRequest:
    """``data``'s ``PlanRequest`` with the catalog and the profile store
    (``store_requests``)."""
    return store_requests(Catalog.load(), ProfileStore(profiles_root))(data)


def load_bandwidth(
    source: str, probe_root: Path | None = None, *, refresh_model: bool = False
) -> BandwidthPredictor:
    """``champion``: the MLflow champion of the XGBoost bus-bandwidth model (``srifty
    fit-bandwidth`` or the srifty_model_refresh DAG makes one), from its local copy when
    that is still the champion's (``refresh_model``: asked of the store);
    ``probes``: the measured-table model over the probe store (no learning, only probed
    types); ``public``: the model fitted on the shipped public nccl-tests tables, which
    ``champion`` falls back to while there is no champion (a fresh install) where
    ``public_fallback`` (``srifty plan``; a training job's plan keeps the champion's error,
    which names the DAG that makes one)."""
    return load_bandwidth_with_source(source, probe_root, refresh_model=refresh_model)[0]


def load_bandwidth_with_source(
    source: str,
    probe_root: Path | None = None,
    *,
    refresh_model: bool = False,
    public_fallback: bool = False,
) -> tuple[BandwidthPredictor, dict[str, Any]]:
    """``load_bandwidth``, and what was loaded: ``{"kind", "text", ...}`` (for the champion,
    ``champion_cache.ChampionSource.to_dict()``: version, run, store, local copy or store)."""
    if source == "champion":
        from srifty_core.predictors.registry import NoChampionError, load_champion_with_source

        try:
            model, where = load_champion_with_source(refresh=refresh_model)
        except NoChampionError as exc:
            if not public_fallback:
                raise
            fitted, text = public_bandwidth()  # a fresh install: plan on public measurements
            return fitted, {"kind": "public", "text": f"{text} ({exc})"}
        return model, {"kind": "champion", **where.to_dict(), "text": where.describe()}
    if source == "public":
        fitted, text = public_bandwidth()
        return fitted, {"kind": "public", "text": text}
    if source == "probes":
        from srifty_core.predictors.table import ProbeTableBandwidth
        from srifty_core.probing.store import read_probes

        probes = read_probes(root=probe_root)
        if len(probes) == 0:
            raise ConfigError(
                "the probe store is empty: run `srifty probe` or the srifty_probe_sweep DAG"
            )
        text = f"probe table over {len(probes)} probe rows"
        return ProbeTableBandwidth().fit(probes), {"kind": "probes", "text": text}
    raise ConfigError(f"bandwidth: {source!r} is not one of champion, probes, public")


def public_bandwidth() -> tuple[BandwidthPredictor, str]:
    """The bus-bandwidth model fitted on the shipped public nccl-tests tables
    (``predictors.nccl_tests``; about 3 s the first time, then kept in the data folder:
    ``predictors.public_model``): what planning uses before this deployment has probed
    anything (its held-out error on those tables: BENCHMARKS.md)."""
    from srifty_core.predictors.nccl_tests import nccl_tests_frame
    from srifty_core.predictors.public_model import public_model

    rows = nccl_tests_frame()
    text = (
        f"fitted on the {len(rows)} rows of the shipped public nccl-tests tables, no "
        "probes of yours: run `srifty probe` and `srifty fit-bandwidth` for a model of your "
        "cloud"
    )
    return public_model(rows), text


def render(result: PlanResult, bandwidth: str | None = None) -> str:
    """The explanation, the search's size and time, and the frontier; ``bandwidth``: a line
    saying which bandwidth model was used (``load_bandwidth_with_source``'s ``text``)."""
    lines = list(result.explanation())
    if bandwidth:
        lines.append(f"bandwidth model: {bandwidth}")
    from srifty_core.planner.search import SIZE_LIMIT

    space = (
        f"more than {SIZE_LIMIT:.0e}" if result.space_size > SIZE_LIMIT else f"{result.space_size}"
    )
    lines.append(
        f"({result.method} search: {result.evaluated} configurations evaluated of "
        f"{space}, {result.solve_s:.2f} s)"
    )
    if result.frontier:
        lines.append("")
        lines.append(f"{'frontier':48s} {'time s':>9s} {'cost $':>9s} {'t_iter ms':>10s}")
        for c in result.frontier[:12]:
            mark = "*" if result.best is not None and c.choice == result.best.choice else " "
            note = "" if c.feasible else f"  ({', '.join(c.violations)})"
            lines.append(
                f"{mark}{c.label[:47]:47s} {c.time_s:9.0f} {c.cost_usd:9.2f} "
                f"{c.estimate.t_iter * 1e3:10.1f}{note}"
            )
    return "\n".join(lines)
