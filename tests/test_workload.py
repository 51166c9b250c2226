"""Your model by reference: parsing, store keys, building factories and ``hf:`` configs,
the one-line errors of a bad reference, and profiling and planning a model that is not in
the zoo."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from srifty_core.errors import ConfigError
from srifty_core.profiling.store import ProfileStore
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import (
    ModelRefError,
    build,
    describe,
    model_key,
    parse_model,
    shipped_hf_configs,
)

DIGITS = "examples/digits/model.py:build"
ROOT = Path(__file__).resolve().parents[1]

TINY_BERT = {
    "architectures": ["BertForMaskedLM"],
    "model_type": "bert",
    "vocab_size": 128,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    # no dropout: its draws differ between one process and several ranks, and the test of
    # the worker compares their parameters exactly
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}


@pytest.fixture
def in_repo(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)  # file references are relative to the working directory
    return ROOT


@pytest.fixture
def tiny_hf(tmp_path: Path) -> str:
    folder = tmp_path / "tiny-bert"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_BERT))
    return f"hf:{folder}"


def test_references_parse_and_keep_distinct_stable_keys() -> None:
    assert parse_model("resnet18").kind == "zoo" and model_key("resnet18") == "resnet18"
    file_ref = parse_model("./examples//digits/model.py:build")
    assert file_ref.kind == "file" and file_ref.text == DIGITS
    assert model_key("./examples/digits/model.py:build") == model_key(DIGITS)
    assert parse_model("pkg.mod:make").kind == "module"
    assert parse_model("hf:gpt2").kind == "hf"
    keys = {
        model_key(r)
        for r in (DIGITS, "examples/digits/model.py:other", "other/model.py:build",
                  "pkg.mod:build", "hf:gpt2", "hf:bert-base-uncased")
    }  # fmt: skip
    assert len(keys) == 6
    assert model_key(DIGITS).startswith("file-model.build-")
    assert model_key("m") == "m"  # a stored name: planning needs its profiles only


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("", "must be a zoo model"),
        ("vgg17", "unknown model 'vgg17'"),
        ("x.py:1bad", "is not a Python name"),
        ("hf:", "'hf:' needs a config"),
        ("missing/model.py:build", "file missing/model.py not found"),
        ("examples/digits/model.py:nothere", "has no 'nothere'"),
        ("no_such_package_xyz:build", "importing no_such_package_xyz failed"),
        ("tests.workload_fixtures.factories:NOT_CALLABLE", "not a callable factory"),
        ("tests.workload_fixtures.factories:raises", "raised RuntimeError: no GPU driver"),
        ("tests.workload_fixtures.factories:wrong_type", "returned int; expected"),
        ("tests.workload_fixtures.factories:not_a_module", "not a torch.nn.Module"),
        ("hf:/nonexistent/config.json", "no config at /nonexistent/config.json"),
    ],
)
def test_a_bad_reference_is_one_line_naming_the_model(
    in_repo: Path, ref: str, message: str
) -> None:
    with pytest.raises(ModelRefError) as exc:
        build(ref, "tiny")
    text = str(exc.value)
    assert text.startswith("model: ") and message in text and "\n" not in text, text


def test_a_factory_whose_batch_or_loss_is_wrong_says_which(in_repo: Path) -> None:
    w = build("tests.workload_fixtures.factories:bad_batch", "tiny")
    with pytest.raises(ModelRefError, match=r"first dimension must be the batch size 4"):
        w.make_batch(4, torch.device("cpu"))
    w = build("tests.workload_fixtures.factories:bad_loss", "tiny")
    with pytest.raises(ModelRefError, match=r"loss returned Tensor\(4, 3\); expected a scalar"):
        w.loss(w.make_batch(4, torch.device("cpu")))


def test_factories_in_every_shape_build_with_seeded_weights(in_repo: Path) -> None:
    for ref in (
        "tests.workload_fixtures.factories:good",
        "tests.workload_fixtures.factories:good_tuple",
    ):
        w = build(ref, "small", seed=3)
        batch = w.make_batch(5, torch.device("cpu"), seed=1)
        assert [t.shape[0] for t in batch] == [5, 5] and w.loss(batch).dim() == 0
        again = build(ref, "small", seed=3)
        a, b = w.module.state_dict(), again.module.state_dict()
        assert all(torch.equal(a[k], b[k]) for k in a)
    small = build("tests.workload_fixtures.factories:sized", "small")
    full = build("tests.workload_fixtures.factories:sized", "full")
    assert full.n_parameters > small.n_parameters  # the size preset reaches the factory
    digits = build(DIGITS, "tiny")
    x, y = digits.make_batch(16, torch.device("cpu"))
    assert x.shape == (16, 64) and float(x.min()) >= 0 and float(x.max()) <= 1
    assert y.dtype == torch.long and set(y.tolist()) <= set(range(10))


def test_a_sequence_length_is_part_of_the_reference_and_its_key() -> None:
    ref = parse_model("hf:gpt2 , seq = 512")
    assert (ref.text, ref.seq, ref.base) == ("hf:gpt2,seq=512", 512, "hf:gpt2")
    keys = {model_key(r) for r in ("hf:gpt2", "hf:gpt2,seq=512", "hf:gpt2,seq=1024")}
    assert len(keys) == 3 and model_key("hf:gpt2,seq=512").startswith("hf-gpt2-seq512-")
    factory = parse_model(f"./{DIGITS},seq=8")
    assert factory.text == f"{DIGITS},seq=8" and factory.kind == "file" and factory.seq == 8
    assert parse_model("pkg.mod:make,seq=16").factory == "make"
    assert "16 tokens per sample" in describe("pkg.mod:make,seq=16")
    # the same reference through a request, a job conf and a train plan
    from srifty_core.planner.schema.train_plan import TrainPlan

    plan = TrainPlan(model="hf:gpt2,seq=64", size="tiny", global_batch=2, iterations=1,
                     local_batches=(1, 1), run_dir="runs/r")  # fmt: skip
    assert TrainPlan.parse(plan.to_dict()).model == "hf:gpt2,seq=64"


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("hf:gpt2,seq=0", "seq must be a whole number from 1 to"),
        ("hf:gpt2,seq=2k", "seq must be a whole number from 1 to"),
        ("hf:gpt2,seq=", "seq must be a whole number from 1 to"),
        ("hf:gpt2,sqe=64", "unknown option 'sqe' after ','; the options are seq=N"),
        ("bert_base,seq=512", "seq applies to hf: and factory models"),
        ("hf:gpt2,seq=4096", "seq 4096 is over the config's position limit 1024"),
        ("tests.workload_fixtures.factories:sized,seq=8", "takes no 'seq' parameter"),
    ],
)
def test_a_bad_sequence_length_is_one_line_naming_it(in_repo: Path, ref: str, message: str) -> None:
    with pytest.raises(ModelRefError) as exc:
        build(ref, "tiny")
    text = str(exc.value)
    assert text.startswith("model: ") and message in text and "\n" not in text, text


def test_a_sequence_length_reaches_the_batches_of_hf_and_factory_models(in_repo: Path) -> None:
    cpu = torch.device("cpu")
    long = build("hf:opt-125m,seq=2048", "tiny")  # a shipped decoder with 2048 positions
    ids, labels = long.make_batch(2, cpu)
    assert ids.shape == labels.shape == (2, 2048) and long.knobs["seq"] == 2048
    assert torch.isfinite(long.loss((ids, labels)))
    assert build("hf:opt-125m", "tiny").make_batch(2, cpu)[0].shape == (2, 16)  # HF_SEQUENCE
    made = build("tests.workload_fixtures.factories:sequence,seq=24", "tiny")
    assert made.make_batch(3, cpu)[0].shape == (3, 24)
    assert build("tests.workload_fixtures.factories:sequence", "tiny").make_batch(3, cpu)[
        0
    ].shape == (3, 8)  # the factory's own default


def test_a_vocabulary_is_a_workload_option_too(in_repo: Path) -> None:
    """``,vocab=N`` beside ``,seq=N``: normalised (seq first) into the reference and its
    key; an hf: model's embedding takes it whatever the size preset, a factory gets it."""
    ref = parse_model("hf:gpt2, vocab=32000 ,seq=64")
    assert (ref.text, ref.seq, ref.vocab, ref.base) == (
        "hf:gpt2,seq=64,vocab=32000",
        64,
        32000,
        "hf:gpt2",
    )
    assert model_key("hf:gpt2,seq=64") != model_key(ref.text)
    assert "32000 vocabulary entries" in describe("pkg.mod:make,vocab=32000")
    w = build("hf:gpt2,vocab=1000", "tiny")  # tiny alone would cap it at 512
    ids, _ = w.make_batch(4, torch.device("cpu"))
    assert w.knobs["vocab"] == 1000 and int(ids.max()) < 1000
    emb = w.module.get_input_embeddings()
    assert emb.num_embeddings == 1000
    made = build("tests.workload_fixtures.factories:tokens,seq=12,vocab=5", "tiny")
    ids, _ = made.make_batch(6, torch.device("cpu"))
    assert ids.shape == (6, 12) and int(ids.max()) < 5
    for bad, said in (
        ("hf:gpt2,vocab=0", "vocab must be a whole number from 1 to"),
        ("hf:gpt2,seq=8,seq=9", "seq given twice"),
        ("tests.workload_fixtures.factories:sequence,vocab=9", "takes no 'vocab' parameter"),
    ):
        with pytest.raises(ModelRefError, match=said):
            build(bad, "tiny")


def test_the_census_counts_the_length_asked_for() -> None:
    from srifty_core.profiling.census_count import count

    short, long = (
        count(f"hf:opt-125m,seq={n}", "tiny", TrainingSettings(), 2, 0, "meta") for n in (64, 128)
    )
    ratio = sum(op[2] for op in long.ops) / sum(op[2] for op in short.ops)
    assert 1.9 < ratio < 2.5, ratio  # linear in tokens, plus attention's quadratic part


def test_hf_models_build_from_a_local_or_a_shipped_config(tiny_hf: str) -> None:
    w = build(tiny_hf, "tiny")
    ids, labels = w.make_batch(3, torch.device("cpu"))
    assert ids.shape == (3, 16) and int(ids.max()) < 128
    assert torch.isfinite(w.loss((ids, labels)))
    assert {"bert-base-uncased", "gpt2"} <= set(shipped_hf_configs())
    bert = build("hf:bert-base-uncased", "full")
    assert 109e6 < bert.n_parameters < 111e6  # BERT-base with its MLM head


def test_hf_sizes_scale_the_config_as_the_zoo_sizes_do(tmp_path: Path) -> None:
    """`tiny` and `small` shrink an hf: config (layers, width with its heads and
    feed-forward, vocabulary) as the zoo's BERT presets do, whatever the config names them
    (GPT-2's n_layer/n_embd, DistilBERT's dim/hidden_dim); `full` is the config as it is.
    A config that names no width or heads is one line asking for size full."""
    gpt2 = build("hf:gpt2", "tiny")
    cfg = gpt2.module.config  # type: ignore[union-attr]
    assert (cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size) == (2, 64, 2, 512)
    assert gpt2.n_parameters < 1e6  # not the 124M model
    ids, labels = gpt2.make_batch(2, torch.device("cpu"))
    assert (
        ids.shape == (2, 16) and int(ids.max()) < 512 and torch.isfinite(gpt2.loss((ids, labels)))
    )
    distil = build("hf:distilbert-base-uncased", "small").module.config  # type: ignore[union-attr]
    assert (distil.n_layers, distil.dim, distil.n_heads, distil.hidden_dim) == (4, 256, 4, 1024)
    zoo = build("bert_base", "small")
    hf = build("hf:bert-base-uncased", "small")
    assert abs(hf.n_parameters / zoo.n_parameters - 1) < 0.05  # the same small BERT
    mamba = tmp_path / "mamba.json"
    mamba.write_text(json.dumps({"model_type": "mamba", "architectures": ["MambaForCausalLM"]}))
    with pytest.raises(ModelRefError, match=r"size tiny scales .* give size full"):
        build(f"hf:{mamba}", "tiny")


def _quick(settings: TrainingSettings | None = None) -> object:
    from srifty_core.profiling.config import ProfilerConfig

    return ProfilerConfig(
        batch_sizes=(1, 4, 8), repeats=2, warmup=1, refine=0, threads=1, max_batch=8,
        schedule_repeats=1, share_host=1, settings=settings or TrainingSettings(),
    )  # fmt: skip


def test_a_factory_and_an_hf_model_are_profiled_under_their_own_keys(
    in_repo: Path, tiny_hf: str
) -> None:
    from srifty_core.profiling.job import run_profile_job

    store = ProfileStore()
    for ref in (DIGITS, tiny_hf):
        result = run_profile_job(ref, "tiny", _quick(), log_to_mlflow=False)  # type: ignore[arg-type]
        assert result.profile.model == parse_model(ref).text
        assert result.path == store.path(ref, "tiny", "cpu")
        assert result.path.parent.parent.name == model_key(ref)
        assert store.load(ref, "tiny", "cpu") == result.profile
        assert result.profile.buckets and result.profile.b_max == 8
    adamw = TrainingSettings(optimizer="adamw")
    result = run_profile_job(DIGITS, "tiny", _quick(adamw), log_to_mlflow=False)  # type: ignore[arg-type]
    assert result.path.name == "cpu@adamw.json" and result.profile.settings == adamw
    assert store.load(DIGITS, "tiny", "cpu", adamw).settings == adamw
    assert store.load(DIGITS, "tiny", "cpu").settings == TrainingSettings()


def test_adamw_steps_cost_more_than_sgd_and_the_profile_says_which() -> None:
    from srifty_core.profiling.timing import optimizer_step_seconds
    from srifty_core.workloads.zoo import Workload

    module = torch.nn.Linear(1024, 2048)
    w = Workload(
        "m", "tiny", module, {}, lambda b, d, g: (torch.randn(b, 1024, generator=g),),
        lambda m, batch: m(batch[0]).square().mean(),
    )  # fmt: skip
    batch = w.make_batch(2, torch.device("cpu"))
    times = {
        opt: optimizer_step_seconds(
            w, batch, lambda: None, repeats=15, settings=TrainingSettings(optimizer=opt)
        )
        for opt in ("sgd", "adamw")
    }
    assert times["adamw"] > 1.2 * times["sgd"], times


def test_adamw_fused_trains_as_adamw_does_from_a_plan_and_a_request() -> None:
    """``adamw_fused`` is torch's fused AdamW (on the CPU too): the same parameters as
    AdamW's multi-tensor steps; a train plan and a request take it, a typo is one line."""
    from srifty_core.planner.schema.request_spec import RequestSpec
    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.workloads.prepare import make_optimizer

    torch.manual_seed(0)
    models = [torch.nn.Linear(8, 4) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [
        make_optimizer(TrainingSettings(optimizer=o), m.parameters(), lr=0.01)
        for o, m in zip(("adamw", "adamw_fused"), models, strict=True)
    ]
    assert opts[1].param_groups[0]["fused"] and not opts[0].param_groups[0]["fused"]
    x = torch.randn(16, 8)
    for _ in range(3):
        for m, o in zip(models, opts, strict=True):
            o.zero_grad()
            m(x).square().mean().backward()
            o.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b)
    plan = TrainPlan(model="dlrm", size="tiny", global_batch=4, iterations=1, local_batches=(4,),
                     run_dir="run", optimizer="adamw_fused")  # fmt: skip
    assert plan.settings.optimizer == "adamw_fused"
    with pytest.raises(ConfigError, match="optimizer: must be 'sgd', 'adamw' or 'adamw_fused'"):
        RequestSpec.parse({"model": "dlrm", "global_batch": 8, "iterations": 1,
                           "offers": [{"type": "g4dn.xlarge"}], "optimizer": "fused"})  # fmt: skip


def test_srifty_plan_plans_a_factory_model_from_its_profile_alone(
    in_repo: Path, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store holding only the user model's profile. It was taken on this CPU and is
    filed as a T4's (a real T4 profile needs a T4): what this checks is that the request's
    reference finds its profile and plans, not the T4's speed."""
    from datetime import date

    import yaml

    from srifty_core.cli import main
    from srifty_core.probing.store import records_to_table, write_partition
    from srifty_core.profiling.profiler import profile_model
    from tests.planner.test_cli_plan import _probes

    profile = profile_model(DIGITS, "full", _quick())  # type: ignore[arg-type]
    store = ProfileStore()
    store.save(dataclasses.replace(profile, device_type="T4"))
    assert [p.name for p in store.list_paths()] == ["T4.json"]
    write_partition(
        records_to_table(_probes("g4dn.xlarge", "T4", 1.0)),
        day=date(2026, 3, 1), provider="ec2-emulated", instance_type="g4dn.xlarge",
    )  # fmt: skip
    request = data_dir / "req.yaml"
    request.write_text(yaml.safe_dump({
        "model": "./examples/digits/model.py:build", "size": "full", "global_batch": 16,
        "iterations": 100, "offers": [{"type": "g4dn.xlarge", "market": "on-demand", "quota": 2}],
    }))  # fmt: skip
    written = data_dir / "plan.json"
    argv = ["plan", str(request), "--bandwidth", "probes", "--write-plan", str(written)]
    assert main([*argv, "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["best"] is not None
    from srifty_core.cli.training import read_train_plan

    train = read_train_plan(written)  # what `srifty train` reads
    assert train.model == DIGITS and train.size == "full" and train.global_batch == 16
    assert sum(train.local_batches) == 16 and train.iterations == 100
    launches = train.extra["launches"]
    assert {x["instance_type"] for x in launches} == {"g4dn.xlarge"}
    assert len(train.local_batches) == sum(x["count"] * x["ranks_per_vm"] for x in launches)
    # no profile at this size on any GPU: planned on an estimate from the model's census
    # and the T4's sheet, which the plan names, with the command that would measure it
    request.write_text(request.read_text().replace("size: full", "size: small"))
    assert main(["plan", str(request), "--bandwidth", "probes"]) == 0
    out = capsys.readouterr().out
    assert "Compute estimated, not measured: T4: specs" in out
    assert "To plan on measurements: `srifty profile --model examples/digits/model.py:build" in out


@pytest.mark.slow
def test_the_built_in_worker_trains_a_factory_and_an_hf_model(
    in_repo: Path, tiny_hf: str, tmp_path: Path
) -> None:
    """Two local ranks with unequal batches end with the parameters of one process on the
    whole global batch, for a model that is not in the zoo."""
    from srifty_core.cloud.local import LocalProvider
    from srifty_core.jobs.local_run import train_local
    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.worker.checkpoint import load_checkpoint
    from srifty_core.worker.worker import train_single

    for i, ref in enumerate((DIGITS, tiny_hf)):
        plan = TrainPlan(
            model=ref, size="tiny", global_batch=6, iterations=4, local_batches=(4, 2),
            run_dir=str(tmp_path / f"run{i}"), dtype="float64", checkpoint_every=2,
            optimizer="adamw", lr=1e-3,
        )  # fmt: skip
        report = train_local(plan, LocalProvider(tmp_path / f"cloud{i}"), timeout_s=240)
        assert report.iterations == 4
        ck = load_checkpoint(plan.checkpoint_path)
        assert ck is not None and ck.iteration == 4
        assert ck.optimizer["state"][0].keys() >= {"exp_avg", "exp_avg_sq"}  # AdamW's
        straight = train_single(plan)
        for k, v in straight.items():
            assert torch.allclose(ck.model[k], v, atol=1e-10), (ref, k)


@pytest.mark.slow
def test_tf32_travels_from_a_request_and_the_cli_to_the_plan_and_the_profile(
    tmp_path: Path,
) -> None:
    """``tf32`` is a training setting like ``compile``: the profile CLI flag, the profile
    command a plan hints, a request and the train plan carry it; on the CPU it changes
    nothing (float32 stays exact)."""
    from srifty_core.cli.parser import build_parser
    from srifty_core.planner.schema.request_spec import RequestSpec
    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.profiling.store import profile_flags
    from srifty_core.workloads import prepare

    args = build_parser().parse_args(["profile", "--model", "hf:gpt2", "--tf32"])
    assert args.tf32 is True
    assert profile_flags("hf:gpt2", "full", TrainingSettings(tf32=True)).endswith("--tf32")
    spec = RequestSpec.parse({"model": "resnet18", "global_batch": 8, "iterations": 1,
                              "offers": [{"type": "g5.xlarge"}], "tf32": True})  # fmt: skip
    assert TrainingSettings.from_dict(spec.model_dump()).tf32
    plan = TrainPlan(model="resnet18", size="tiny", global_batch=2, iterations=1,
                     local_batches=(2,), run_dir=str(tmp_path), tf32=True)  # fmt: skip
    assert plan.settings.suffix == "@tf32" and TrainPlan.parse(plan.to_dict()).tf32
    with pytest.raises(ConfigError, match=r"^tf32: must be true or false"):
        plan.replace(tf32="on")
    before = torch.get_float32_matmul_precision()
    prepare(build("resnet18", "tiny"), TrainingSettings(tf32=True))
    assert torch.get_float32_matmul_precision() == before  # the CPU: nothing changes


def test_compile_and_channels_last_keep_the_loss_and_the_state_dict() -> None:
    from srifty_core.workloads import prepare

    cnn = "tests/workload_fixtures/factories.py:small_cnn"  # compiles in seconds, not a minute
    eager = build(cnn, "tiny", seed=1)
    batch = eager.make_batch(2, torch.device("cpu"), seed=2)
    want = eager.loss(batch).item()
    fast = build(cnn, "tiny", seed=1)
    precision = prepare(fast, TrainingSettings(compile=True, channels_last=True))
    assert precision == "fp32"
    x, _ = fast.make_batch(2, torch.device("cpu"), seed=2)
    assert x.is_contiguous(memory_format=torch.channels_last)
    assert fast.loss(fast.make_batch(2, torch.device("cpu"), seed=2)).item() == pytest.approx(
        want, rel=1e-4
    )
    assert list(fast.module.state_dict()) == list(eager.module.state_dict())
    assert hasattr(fast.module.forward, "_torchdynamo_orig_callable")  # compiled


def test_a_missing_profile_hints_a_command_that_would_make_it() -> None:
    from srifty_core.profiling.store import ProfileNotFoundError

    store = ProfileStore()
    with pytest.raises(ProfileNotFoundError) as exc:
        store.load("resnet18", "small", "cpu", TrainingSettings(optimizer="adamw"))
    assert "run `srifty profile --model resnet18 --size small --optimizer adamw --device cpu`" in (
        str(exc.value)
    )
    with pytest.raises(ProfileNotFoundError) as exc:
        store.load("resnet50", "full", "V100")
    text = str(exc.value)
    assert (
        "srifty profile --model resnet50 --size full --device cuda` on a machine with a V100"
        in (text)
    )
    with pytest.raises(ProfileNotFoundError) as exc:
        store.load("m", "full", "T4")  # a stored name, not a model Srifty can build
    assert "'m' is a stored name, not a model Srifty can build" in str(exc.value)
    assert "srifty profile --model m" not in str(exc.value)
