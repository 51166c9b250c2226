"""Which model references a DAG trigger may name (``srifty_core.trigger_models``)."""

from __future__ import annotations

import pytest

from srifty_core.errors import ConfigError
from srifty_core.jobs.job import JobSpec
from srifty_core.trigger_models import ENV_VAR, registered_model

CONF = {
    "model": "resnet18",
    "size": "tiny",
    "global_batch": 16,
    "iterations": 10,
    "offers": [{"type": "local.cpu", "quota": 2}],
}


@pytest.mark.parametrize(
    "model",
    ["resnet18", "hf:gpt2", "srifty_core.profiling.reference_models:bert_base_squad", "mlp"],
)
def test_zoo_shipped_and_package_models_and_stored_names_pass(model: str) -> None:
    assert registered_model(model, env={}) == model


@pytest.mark.parametrize(
    "model",
    [
        "examples/digits/model.py:build",
        "./examples/digits/model.py:build",
        "/tmp/evil.py:f",
        "evil.py:f",
    ],
)
def test_a_file_path_is_refused_even_when_listed(model: str) -> None:
    env = {ENV_VAR: model}
    with pytest.raises(ConfigError, match=r"^model: '.*' is a file path: a trigger may name") as e:
        registered_model(model, env=env)
    assert "\n" not in str(e.value) and ENV_VAR in str(e.value)


def test_modules_and_hf_paths_pass_only_when_the_deployment_lists_them() -> None:
    refused = ("mypkg.models:build", "os:system", "hf:/etc/configs/x.json")
    for model in refused:
        with pytest.raises(ConfigError, match=r"is not registered: a trigger may name only"):
            registered_model(model, env={})
    env = {ENV_VAR: " mypkg.models:build , hf:/etc/configs/x.json, other.pkg:*"}
    assert registered_model("mypkg.models:build", env=env) == "mypkg.models:build"
    assert registered_model("hf:/etc/configs/x.json", env=env) == "hf:/etc/configs/x.json"
    assert registered_model("other.pkg:anything", env=env) == "other.pkg:anything"
    # a listed model at a sequence length of its own (the list is comma-separated)
    at = registered_model("mypkg.models:build,seq=2048", env=env)
    assert at == "mypkg.models:build,seq=2048"
    assert registered_model("hf:gpt2,seq=512", env={}) == "hf:gpt2,seq=512"
    with pytest.raises(ConfigError, match="not registered"):
        registered_model("mypkg.models:other", env=env)
    with pytest.raises(ConfigError, match="not registered"):
        registered_model("other.pkg.sub:f", env=env)


def test_the_dags_conf_refuses_a_file_path_and_the_shell_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    conf = {**CONF, "model": "examples/digits/model.py:build"}
    with pytest.raises(ConfigError, match=r"^model: 'examples/digits/model.py:build' is a file"):
        JobSpec.from_params(conf)
    assert JobSpec.from_params(conf, shell=True).model == "examples/digits/model.py:build"
    assert JobSpec.from_params(CONF).model == "resnet18"


def test_the_profiling_dags_cloud_request_refuses_a_file_path() -> None:
    from srifty_core.jobs.cloud_request import CloudProfileRequest

    with pytest.raises(ConfigError, match=r"^model: '/tmp/evil.py:f' is a file path"):
        CloudProfileRequest.from_params({"model": "/tmp/evil.py:f"})
    assert CloudProfileRequest.from_params({"model": "resnet18"}).model == "resnet18"


def test_the_what_if_report_refuses_a_file_path_before_planning() -> None:
    from srifty_core.planner.whatif_report import what_if_report

    with pytest.raises(ConfigError, match=r"^model: '/tmp/evil.py:f' is a file path"):
        what_if_report({"model": "/tmp/evil.py:f"}, ["budget_usd=4"])
