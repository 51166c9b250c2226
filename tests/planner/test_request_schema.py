"""The request schema (the ``planner.schema`` package): a malformed request is always a
``ConfigError`` whose one-line message starts with the bad field's path, never another
exception.

Property-based: each example breaks one field of a valid request (a wrong type, a boolean
or a string for a number, NaN or infinity, a 5000-digit integer, a value out of range, an
unknown or a missing key) and checks the error names exactly that field.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from srifty_core.catalog import Catalog
from srifty_core.catalog.types import Market
from srifty_core.errors import ConfigError, FieldError
from srifty_core.planner.request import Offer, Overheads, request_from_dict
from srifty_core.planner.schema import fields
from srifty_core.planner.schema.job_conf import JobConf
from srifty_core.planner.schema.request_spec import OfferSpec, OverheadsSpec, RequestSpec
from srifty_core.planner.schema.strict import Strict
from srifty_core.planner.schema.trigger_form import param_schemas
from srifty_core.simulator.types import SimInstance
from srifty_core.workloads import MODEL_NAMES, SIZES

# Small and quick; the autouse data_dir fixture is shared by a test's examples (unused here).
SETTINGS = settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

REQUEST: dict[str, Any] = {
    "model": "m",
    "size": "full",
    "region": "us-east-1",
    "global_batch": 512,
    "iterations": 500,
    "time_limit_s": 3600,
    "budget_usd": 20.0,
    "objective": "cost",
    "risk_quantile": 0.9,
    "overheads": {"launch_s": 150, "detach_s": 5.0},
    "offers": [
        {"type": "g4dn.xlarge", "market": "spot", "quota": 8},
        {"type": "g3.4xlarge", "market": "on-demand", "quota": 8, "price": 1.2, "min_batch": 4},
    ],
}
CONF: dict[str, Any] = {
    "model": "dlrm",
    "size": "tiny",
    "global_batch": 16,
    "iterations": 30,
    "offers": [{"type": "local.cpu", "market": "on-demand", "quota": 2, "price": 0.1}],
    "provider": "local",
    "objective": "time",
    "time_limit_s": None,
    "overheads": {},
    "ec2": {},
    "resume": None,
}
Path = tuple[str | int, ...]

_catalog: list[Catalog] = []


def catalog() -> Catalog:
    if not _catalog:
        _catalog.append(Catalog.load())
    return _catalog[0]


def no_profiles(*args: Any) -> Any:
    raise AssertionError(f"a malformed request got as far as loading profiles {args}")


def dotted(path: Path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def put(doc: dict[str, Any], path: Path, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    node: Any = d
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value
    return d


def drop(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    node: Any = d
    for p in path[:-1]:
        node = node[p]
    del node[path[-1]]
    return d


def assert_names(exc: BaseException, path: str) -> None:
    """One line, starting with the field's path."""
    text = str(exc)
    assert "\n" not in text and len(text) < 1000, text
    assert text.startswith(f"{path}: "), text


def rejects(doc: Any, path: str) -> None:
    """The schema, and the request reader before any lookup, both name ``path``."""
    with pytest.raises(FieldError) as info:
        RequestSpec.parse(doc)
    assert info.value.path == path, str(info.value)
    assert_names(info.value, path)
    with pytest.raises(ConfigError) as info2:
        request_from_dict(doc, catalog=catalog(), load_profile=no_profiles)
    assert str(info2.value) == str(info.value)


# ---------------------------------------------------------------------- bad values
HUGE = 10**5000 - 1  # 5000 nines; str() of it raises (over Python's 4300-digit limit)
junk = st.one_of(
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.binary(max_size=8),
)
non_finite = st.sampled_from([math.nan, math.inf, -math.inf])
numeric_text = st.from_regex(r"\A-?[0-9]{1,6}(\.[0-9]{1,3})?\Z")


def bad_int(lo: int, hi: int, *, nullable: bool = False) -> st.SearchStrategy[Any]:
    out = st.one_of(
        st.booleans(),
        st.floats(allow_nan=True, allow_infinity=True),  # 8.0 too: whole numbers are ints
        numeric_text,
        st.text(max_size=10),
        st.integers(max_value=lo - 1),
        st.integers(min_value=hi + 1),
        st.just(HUGE),
        st.just(-HUGE),
        junk,
    )
    return out if nullable else out | st.none()


def bad_number(
    lo: float, *, lo_open: bool, hi: float | None = None, nullable: bool = False
) -> st.SearchStrategy[Any]:
    below = st.floats(max_value=lo, exclude_max=not lo_open, allow_nan=False)
    out = st.one_of(
        st.booleans(),
        non_finite,
        numeric_text,
        st.text(max_size=10),
        below,
        st.integers(max_value=math.floor(lo) - 1) if lo_open is False else st.integers(max_value=0),
        st.just(HUGE),
        junk,
    )
    if hi is not None:
        out |= st.floats(min_value=hi, allow_nan=False, allow_infinity=False)
    return out if nullable else out | st.none()


def bad_text(*, nullable: bool = False, max_len: int = fields.MAX_TEXT) -> st.SearchStrategy[Any]:
    too_long = (
        st.text(min_size=max_len + 1, max_size=max_len + 20)
        if max_len <= fields.MAX_TEXT
        else st.integers(max_len + 1, max_len + 20).map(lambda n: "m" * n)  # a short draw
    )
    out = st.one_of(st.integers(), st.floats(), st.booleans(), st.just(""), too_long, junk)
    return out if nullable else out | st.none()


def bad_choice(valid: Callable[[str], bool]) -> st.SearchStrategy[Any]:
    return st.text(max_size=12).filter(lambda s: not valid(s)) | st.integers() | st.booleans()


def _objective(s: str) -> bool:
    return s.strip().lower().removeprefix("min_").removeprefix("minimize_") in ("time", "cost")


def _provider(s: str) -> bool:
    return s.strip().lower() in ("local", "ec2", "ec2-emulated", "emulated")


def _market(s: str) -> bool:
    try:
        Market.parse(s)
    except LookupError:
        return False
    return True


OFFER = ("offers", 1)
MODEL_MAX_LEN = 4096
BAD_VALUES: dict[Path, st.SearchStrategy[Any]] = {
    # a model may be a file path and factory (up to 4096 characters), not a short name
    ("model",): bad_text(max_len=MODEL_MAX_LEN),
    ("size",): bad_choice(lambda s: s in SIZES),
    ("region",): bad_text(),
    ("provider",): bad_choice(_provider),
    ("global_batch",): bad_int(1, fields.MAX_BATCH),
    ("iterations",): bad_int(1, fields.MAX_ITERATIONS),
    ("time_limit_s",): bad_number(0, lo_open=True, nullable=True),
    ("budget_usd",): bad_number(0, lo_open=True, nullable=True),
    ("objective",): bad_choice(_objective),
    ("risk_quantile",): bad_number(0.5, lo_open=False, hi=1.0),
    ("batch_granularity",): bad_choice(lambda s: s in ("pow2", "any")),
    ("overheads",): st.one_of(st.text(), st.integers(), st.lists(st.integers(), max_size=2)),
    ("overheads", "launch_s"): bad_number(0, lo_open=False, nullable=True),
    ("overheads", "detach_s"): bad_number(0, lo_open=False),
    ("offers",): st.one_of(
        st.text(), st.integers(), st.none(), st.just([]), st.dictionaries(st.text(), st.integers())
    ),
    OFFER: st.one_of(st.text(), st.integers(), st.none(), st.lists(st.integers(), max_size=2)),
    (*OFFER, "type"): bad_text(),
    (*OFFER, "market"): bad_choice(_market),
    (*OFFER, "quota"): bad_int(0, fields.MAX_QUOTA),
    (*OFFER, "price"): bad_number(0, lo_open=True, nullable=True),
    (*OFFER, "zone"): bad_text(nullable=True),
    (*OFFER, "min_batch"): bad_int(1, fields.MAX_BATCH, nullable=True),
}
REQUIRED: list[Path] = [
    ("model",),
    ("global_batch",),
    ("iterations",),
    ("offers",),
    (*OFFER, "type"),
]
MODELS: dict[Path, type[Strict]] = {
    (): RequestSpec,
    OFFER: OfferSpec,
    ("overheads",): OverheadsSpec,
}
identifier = st.from_regex(r"\A[a-z_][a-z0-9_]{0,15}\Z")
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def test_the_base_request_is_valid() -> None:
    spec = RequestSpec.parse(REQUEST)
    assert spec.offers[1].min_batch == 4 and spec.time_limit_s == 3600.0
    assert JobConf.parse(CONF).objective == "time"


@SETTINGS
@given(data=st.data())
def test_a_bad_value_is_a_config_error_naming_the_field(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(BAD_VALUES, key=str)), label="field")
    value = data.draw(BAD_VALUES[path], label="value")
    rejects(put(REQUEST, path, value), dotted(path))


@SETTINGS
@given(where=st.sampled_from(sorted(MODELS, key=str)), key=identifier)
def test_an_unknown_key_is_named(where: Path, key: str) -> None:
    if key in MODELS[where].model_fields:
        return
    rejects(put(REQUEST, (*where, key), 1), dotted((*where, key)))


@pytest.mark.parametrize("path", REQUIRED, ids=dotted)
def test_a_missing_key_is_named(path: Path) -> None:
    rejects(drop(REQUEST, path), dotted(path))


@SETTINGS
@given(
    where=st.sampled_from(sorted(MODELS, key=str)),
    key=st.one_of(st.text(max_size=300), st.integers(), st.none(), st.booleans(), st.floats()),
    value=json_like,
)
def test_any_key_and_value_is_a_config_error_or_valid(where: Path, key: Any, value: Any) -> None:
    doc = put(REQUEST, (*where, key), value)
    try:
        RequestSpec.parse(doc)
    except FieldError as exc:
        assert_names(exc, exc.path)
    else:  # only a known field with a valid value passes
        assert key in MODELS[where].model_fields


@SETTINGS
@given(doc=json_like)
def test_any_document_is_a_config_error(doc: Any) -> None:
    with pytest.raises(FieldError) as info:
        RequestSpec.parse(doc)
    assert_names(info.value, info.value.path)
    with pytest.raises(ConfigError):
        request_from_dict(doc, catalog=catalog(), load_profile=no_profiles)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"gloabl_batch": 512},
            "gloabl_batch: unknown request field 'gloabl_batch'; did you mean 'global_batch'?",
        ),
        (
            {"offers": [{"type": "g4dn.xlarge", "qouta": 8}]},
            "offers[0].qouta: unknown offer field 'qouta'; did you mean 'quota'?",
        ),
        (
            {"offers": [{"type": "g4dn.xlarge", "quota": 8}, {"type": "g3.4xlarge", "quota": -2}]},
            "offers[1].quota: must be a whole number from 0 to 100000, got -2",
        ),
        (
            {"global_batch": True},
            "global_batch: must be a whole number from 1 to 1000000000, got true",
        ),
        (
            {"iterations": HUGE},
            "iterations: must be a whole number from 1 to 1000000000000, got a 5000-digit integer",
        ),
        (
            {"budget_usd": math.nan},
            "budget_usd: must be a positive number (leave it out for no limit), got nan",
        ),
        (
            {"time_limit_s": "1h"},
            "time_limit_s: must be a positive number (leave it out for no limit), got '1h'",
        ),
        (
            {"overheads": {"launch_s": -1}},
            "overheads.launch_s: must be a number of seconds >= 0, got -1",
        ),
        ({"objective": "speed"}, "objective: must be 'time' or 'cost', got 'speed'"),
    ],
)
def test_messages(change: dict[str, Any], message: str) -> None:
    with pytest.raises(FieldError) as info:
        RequestSpec.parse(REQUEST | change)
    assert str(info.value) == message


def test_the_first_problem_is_named_and_the_others_listed() -> None:
    doc = {k: v for k, v in REQUEST.items() if k != "global_batch"} | {"gloabl_batch": 5}
    doc["iterations"] = 0
    with pytest.raises(FieldError) as info:
        RequestSpec.parse(doc)
    assert info.value.path == "gloabl_batch"  # an unknown key first: most often the typo
    assert str(info.value).endswith("(also wrong: global_batch (missing), iterations)")


def test_spellings_the_planner_accepted_still_work() -> None:
    spec = RequestSpec.parse(
        REQUEST | {"objective": "Minimize_Time", "offers": [{"type": "x", "market": "OnDemand"}]}
    )
    assert spec.objective == "time" and spec.offers[0].market == "on-demand"
    assert spec.offers[0].quota == 0  # as before: an offer without a quota offers nothing


# ---------------------------------------------------------------------- the dataclasses
FAST = SimInstance("fast.x", "V100", 1)


def test_a_local_worker_may_be_free_a_cloud_vm_may_not() -> None:
    """local.cpu has no market price: the user states what a worker counts for, and 0 is
    a valid answer (a plan file's job, with no rate given, is priced so); a cloud type's
    price of 0 is a mistake, refused wherever it is given."""
    from srifty_core.cloud.local import LOCAL_CPU

    assert fields.LOCAL_TYPE == LOCAL_CPU
    free = Offer(SimInstance.local_cpu(), Market.ON_DEMAND, quota=2, usd_per_hour=0.0)
    assert free.usd_per_hour == 0.0
    with pytest.raises(FieldError, match="must be a number >= 0") as info:
        Offer(SimInstance.local_cpu(), Market.ON_DEMAND, quota=2, usd_per_hour=-0.1)
    assert info.value.path == "offers[local.cpu/on-demand].usd_per_hour"
    with pytest.raises(FieldError, match="must be a positive number") as info:
        Offer(FAST, Market.ON_DEMAND, quota=1, usd_per_hour=0.0)
    assert info.value.path == "offers[fast.x/on-demand].usd_per_hour"
    # the DAG's conf: the same rule, by the offer's type
    conf = JobConf.parse(put(CONF, ("offers", 0, "price"), 0.0))
    assert conf.offers[0].price == 0.0
    gpu = {"type": "g4dn.xlarge", "market": "on-demand", "quota": 1, "price": 0}
    with pytest.raises(FieldError, match=r"only local\.cpu may be free") as info:
        JobConf.parse({**CONF, "offers": [gpu]})
    assert info.value.path == "offers[0].price"
    with pytest.raises(FieldError) as info:  # and a request for srifty plan: never 0
        RequestSpec.parse({**REQUEST, "offers": [gpu]})
    assert info.value.path == "offers[0].price"


@SETTINGS
@given(quota=bad_int(0, fields.MAX_QUOTA), price=bad_number(0, lo_open=True))
def test_the_dataclasses_check_with_the_same_rules(quota: Any, price: Any) -> None:
    with pytest.raises(FieldError) as info:
        Offer(FAST, Market.SPOT, quota=quota, usd_per_hour=1.0)
    assert info.value.path == "offers[fast.x/spot].quota"
    assert_names(info.value, info.value.path)
    with pytest.raises(FieldError) as info:
        Offer(FAST, Market.SPOT, quota=1, usd_per_hour=price)
    assert info.value.path == "offers[fast.x/spot].usd_per_hour"
    with pytest.raises(FieldError, match=r"^overheads\.launch_s: "):
        Overheads(launch_s=price if price != 0 else -1.0)


# ---------------------------------------------------------------------- the DAG's conf
CONF_BAD: dict[Path, st.SearchStrategy[Any]] = {
    ("model",): bad_choice(lambda s: s in MODEL_NAMES),
    ("size",): bad_choice(lambda s: s in SIZES),
    ("global_batch",): bad_int(1, fields.MAX_BATCH),
    ("iterations",): bad_int(1, fields.MAX_ITERATIONS),
    ("offers", 0, "quota"): bad_int(0, fields.MAX_QUOTA),
    # CONF's offer is local.cpu, which may be free (test_a_local_worker_may_be_free...)
    ("offers", 0, "price"): bad_number(0, lo_open=False, nullable=True),
    ("provider",): bad_choice(lambda s: s in ("local", "ec2")),
    ("bandwidth",): bad_choice(lambda s: s in ("champion", "probes")),
    ("overheads", "launch_s"): bad_number(0, lo_open=False, nullable=True),
    ("risk_quantile",): bad_number(0.5, lo_open=False, hi=1.0),
    ("checkpoint_every",): bad_int(1, fields.MAX_ITERATIONS),
    ("step_sleep_s",): bad_number(0, lo_open=False),
    ("seed",): bad_int(0, fields.MAX_SEED),
    ("ec2", "poll_s"): bad_number(0, lo_open=True, nullable=True),
    ("resume",): st.one_of(st.text(), st.integers(), st.lists(st.integers(), max_size=2)),
}


@SETTINGS
@given(data=st.data())
def test_a_bad_conf_value_is_a_config_error_naming_the_field(data: st.DataObject) -> None:
    path = data.draw(st.sampled_from(sorted(CONF_BAD, key=str)), label="field")
    value = data.draw(CONF_BAD[path], label="value")
    with pytest.raises(FieldError) as info:
        JobConf.parse(put(CONF, path, value))
    assert info.value.path == dotted(path), str(info.value)
    assert_names(info.value, dotted(path))


@pytest.mark.parametrize(
    ("change", "path"),
    [
        ({"gloabl_batch": 16}, "gloabl_batch"),
        ({"offers": [{"type": "local.cpu", "qouta": 2, "price": 0.1}]}, "offers[0].qouta"),
        ({"offers": [{"type": "local.cpu", "price": 0.1}]}, "offers[0].quota"),  # required here
        (
            {"resume": {"checkpoint": "/x/checkpoint.pt", "iterations_done": -1}},
            "resume.iterations_done",
        ),
        ({"provider": "ec2"}, "ec2.image_id"),
        ({"ec2": {"image_id": "ami-1", "pol_s": 1}}, "ec2.pol_s"),
    ],
)
def test_the_conf_names_the_field(change: dict[str, Any], path: str) -> None:
    with pytest.raises(FieldError) as info:
        JobConf.parse(CONF | change)
    assert info.value.path == path, str(info.value)


@pytest.mark.parametrize(
    ("offers", "provider"),
    [
        ([{"type": "local.cpu", "quota": 2, "price": 0.1}], "local"),
        ([{"type": "g4dn.xlarge", "quota": 2}], "ec2"),
        ([{"type": "local.cpu", "quota": 2, "price": 0.1}, {"type": "g4dn.xlarge", "quota": 1}],
         "ec2"),
    ],
)  # fmt: skip
def test_a_request_without_a_provider_gets_the_one_its_offers_imply(
    offers: list[dict[str, Any]], provider: str
) -> None:
    """One default for ``srifty plan`` and a job: ``local`` when every offer is
    ``local.cpu``, else ``ec2``; a stated provider (or null, the trigger form's) is kept or
    inferred alike."""
    base = {k: v for k, v in REQUEST.items() if k != "offers"}
    assert RequestSpec.parse({**base, "offers": offers}).provider == provider
    assert RequestSpec.parse({**base, "offers": offers, "provider": None}).provider == provider
    assert RequestSpec.parse({**base, "offers": offers, "provider": "emulated"}).provider == (
        "ec2-emulated"
    )
    job = {**CONF, "offers": offers, "ec2": {"image_id": "ami-1"}}
    del job["provider"]
    assert JobConf.parse(job).provider == provider


def test_the_dag_params_schemas_come_from_the_model() -> None:
    import jsonschema

    params = param_schemas(JobConf)
    assert set(params) == set(JobConf.model_fields)
    assert "$ref" not in repr(params) and "anyOf" not in repr(params)
    for name, value in CONF.items():
        jsonschema.validate(value, params[name]["schema"])
    for name, bad in [("global_batch", True), ("global_batch", 0), ("time_limit_s", -1),
                      ("offers", [{"type": "local.cpu", "qouta": 2}]), ("model", "vgg17"),
                      ("resume", {"iterations_done": 1})]:  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, params[name]["schema"])


@pytest.mark.parametrize(
    ("key", "setting"),
    [("aws_conn_id", "SRIFTY_AWS_CONN_ID"), ("package", "SRIFTY_WORKER_WHEEL_URI")],
)
def test_a_trigger_cannot_choose_the_aws_connection_or_what_vms_install(
    key: str, setting: str
) -> None:
    """Credentials and the code VMs run are the deployment's choice: a conf naming either
    is refused, and the error says where the deployment sets it."""
    with pytest.raises(FieldError) as info:
        JobConf.parse(CONF | {"ec2": {"image_id": "ami-1", key: "x"}})
    assert info.value.path == f"ec2.{key}"
    assert setting in str(info.value) and "\n" not in str(info.value)


def test_the_aws_connection_comes_from_the_deployment() -> None:
    from srifty_core.cloud.ec2.provider import deployment_conn_id

    assert deployment_conn_id({}) == "aws_default"
    assert deployment_conn_id({"SRIFTY_AWS_CONN_ID": " aws_training "}) == "aws_training"
