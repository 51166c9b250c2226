"""The operator census, the roofline fitted on measurements, and profiles estimated for
GPUs nobody profiled (``profiling.census``, ``predictors.roofline``,
``profiling.estimate``, ``ProfileStore.load_or_estimate``)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from srifty_core.catalog import Catalog
from srifty_core.errors import ConfigError
from srifty_core.predictors import roofline as rl
from srifty_core.profiling import estimate
from srifty_core.profiling import roofline_profile as rp
from srifty_core.profiling.census import (
    BATCHES,
    CLASSES,
    SHIPPED_DIR,
    OpCensus,
    load_census,
    shipped_census_path,
    stored_unit_parameters,
    take_census,
)
from srifty_core.profiling.profile import NO_REPLICA
from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore
from srifty_core.simulator.calibration import prior
from srifty_core.simulator.estimator import Simulator
from srifty_core.simulator.types import ClusterConfig, Group, SimInstance, Workload
from srifty_core.training_settings import DEFAULT_SETTINGS, TrainingSettings
from tests.simulator.test_estimator import ConstantBandwidth

MLP = "tests/workload_fixtures/factories.py:sized"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


@pytest.fixture(scope="module")
def specs(catalog: Catalog) -> dict[str, rl.DeviceSpec]:
    return estimate.device_specs(catalog)


@pytest.fixture(scope="module")
def resnet18() -> OpCensus:
    return load_census("resnet18", "full", root=Path("/nonexistent-store"), count=False)


@pytest.fixture(scope="module")
def mlp_full() -> OpCensus:
    """The MLP's census, taken once for the two tests that read it."""
    return take_census(MLP, "full")


def _counted(factory: pytest.TempPathFactory, settings: TrainingSettings) -> Path:
    """A profile store in which ``load_census`` counted MLP/small with ``settings`` (in a
    child process, as it counts a factory) and kept it."""
    root = factory.mktemp("counted")
    load_census(MLP, "small", settings, root=root)
    return root


@pytest.fixture(scope="module")
def counted_sgd(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MLP/small counted once for the module (each count is a child interpreter)."""
    return _counted(tmp_path_factory, DEFAULT_SETTINGS)


@pytest.fixture(scope="module")
def counted_adamw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _counted(tmp_path_factory, TrainingSettings(optimizer="adamw"))


def _copy_store(counted: Path, tmp_path: Path) -> None:
    """``counted`` copied into this test's ``tmp_path``: the test may damage its copy."""
    import shutil

    shutil.copytree(counted, tmp_path, dirs_exist_ok=True)


def test_census_counts_a_known_network_exactly(mlp_full: OpCensus) -> None:
    """Linear(8, 64) -> ReLU -> Linear(64, 3): the forward's matrix products are 2*8*64 +
    2*64*3 FLOPs a sample, the backward's twice that less the first layer's input
    gradient; buckets hold every parameter once; the counts are linear in the batch."""
    c = mlp_full
    ph, cls = np.array(c.phase), np.array(c.op_class)
    f1 = np.array(c.flops1)
    mm = cls == CLASSES.index("matmul")
    assert f1[(ph == 0) & mm].sum() == pytest.approx(2 * 8 * 64 + 2 * 64 * 3)
    assert f1[(ph == 1) & mm].sum() == pytest.approx(2 * 8 * 64 + 2 * (2 * 64 * 3))
    assert c.n_parameters == 8 * 64 + 64 + 64 * 3 + 3
    assert c.unit_parameters == (0, 8 * 64 + 64, 64 * 3 + 3)  # FSDP's units: the two layers
    assert sum(c.bucket_params) == 4 and sum(c.bucket_sizes) == 4 * c.n_parameters
    assert c.saved_bytes1 > 0 and (ph == 2).sum() >= 1
    assert c.device == "meta"
    assert OpCensus.from_json(c.to_json()) == c
    b = 2 * BATCHES[1]  # the counts at a batch neither step ran at
    assert (np.array(c.flops0) + f1 * b)[(ph == 0) & mm].sum() == pytest.approx(
        b * (2 * 8 * 64 + 2 * 64 * 3)
    )


def test_the_census_keeps_what_autocast_saves_at_its_widths(mlp_full: OpCensus) -> None:
    """The same MLP under bf16/fp16 autocast: the ReLU's output (after a lower-precision
    matrix product) is saved at 2 bytes, cross entropy's log-softmax at 4 (autocast's
    float32 list)."""
    c = mlp_full
    assert c.saved_bytes1 == 64 * 4 + 3 * 4
    assert c.saved_low_bytes1 == 64 * 2 + 3 * 4
    assert c.saved_low_bytes0 == c.saved_bytes0
    for precision in ("bf16", "fp16"):
        assert c.saved_bytes(precision) == (c.saved_low_bytes0, c.saved_low_bytes1)
    assert c.saved_bytes("fp32") == (c.saved_bytes0, c.saved_bytes1)
    old = {k: v for k, v in c.to_dict().items() if not k.startswith("saved_low")}
    before = OpCensus.from_dict(old)  # a census counted before the fields: float32 widths
    assert before.saved_bytes("bf16") == (c.saved_bytes0, c.saved_bytes1)


def test_a_stored_census_without_the_widths_is_counted_again(
    tmp_path: Path, counted_sgd: Path
) -> None:
    from srifty_core.profiling.census import census_path

    _copy_store(counted_sgd, tmp_path)
    first = load_census(MLP, "small", root=tmp_path, count=False)
    path = census_path(tmp_path, MLP, "small", DEFAULT_SETTINGS)
    old = {k: v for k, v in first.to_dict().items() if not k.startswith("saved_low")}
    path.write_text(json.dumps(old))
    assert load_census(MLP, "small", root=tmp_path, count=False).saved_low_bytes1 == -1
    again = load_census(MLP, "small", root=tmp_path)
    assert again.saved_low_bytes1 == first.saved_low_bytes1 > 0
    assert json.loads(path.read_text())["saved_low_bytes1"] == first.saved_low_bytes1
    # a stale store census beside a shipped one that has the widths: the shipped one, no count
    shipped = load_census("resnet18", "full", root=Path("/nonexistent-store"), count=False)
    stale = census_path(tmp_path, "resnet18", "full", DEFAULT_SETTINGS)
    stale.parent.mkdir(parents=True, exist_ok=True)
    old_resnet = {k: v for k, v in shipped.to_dict().items() if not k.startswith("saved_low")}
    stale.write_text(json.dumps(old_resnet))
    assert load_census("resnet18", "full", root=tmp_path) == shipped
    assert "saved_low_bytes1" not in json.loads(stale.read_text())


def test_a_stored_census_counted_before_in_place_writes_is_counted_again(
    tmp_path: Path, counted_adamw: Path
) -> None:
    """A census from before in-place writes were counted (no ``writes_counted``) prices the
    optimizer step on what it reads alone: the store's is counted again where torch is, and
    where it cannot be it is still served as it is. Every shipped census has the writes."""
    from srifty_core.profiling.census import census_path

    _copy_store(counted_adamw, tmp_path)
    first = load_census(
        MLP, "small", TrainingSettings(optimizer="adamw"), root=tmp_path, count=False
    )
    assert first.writes_counted
    path = census_path(tmp_path, MLP, "small", TrainingSettings(optimizer="adamw"))
    step = np.asarray(first.phase) == 2
    old = first.to_dict()
    del old["writes_counted"]
    old["bytes0"] = [b * 2 / 3 if s else b for b, s in zip(first.bytes0, step, strict=True)]
    path.write_text(json.dumps(old))
    settings = TrainingSettings(optimizer="adamw")
    served = load_census(MLP, "small", settings, root=tmp_path, count=False)
    assert not served.writes_counted and served.bytes0 != first.bytes0
    again = load_census(MLP, "small", settings, root=tmp_path)
    assert again.writes_counted and again.bytes0 == first.bytes0
    assert json.loads(path.read_text())["writes_counted"] is True
    for shipped in SHIPPED_DIR.glob("*.json"):
        assert json.loads(shipped.read_text())["writes_counted"] is True, shipped.name


def test_batch_norm_is_a_class_of_its_own_priced_at_norm_times_its_bytes(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec], tmp_path: Path, counted_adamw: Path
) -> None:
    """ResNet-18's 20 batch norms, forward and backward, are ``norm`` operators: their
    memory time scales with ``Efficiencies.norm`` and no other operator's does. A census
    counted before the class is served as it is without a count, counted again with one;
    a class this version does not know is a one-line error."""
    from srifty_core.profiling.census import OLD_CLASSES, census_path

    ph, cls = np.array(resnet18.phase), np.array(resnet18.op_class)
    norm = CLASSES.index("norm")
    assert resnet18.classes == CLASSES and resnet18.current
    assert ((ph == 0) & (cls == norm)).sum() == ((ph == 1) & (cls == norm)).sum() == 20
    dev = specs["A100 SXM4 80GB"]
    for phase in (0, 1):
        one = rl.op_times(resnet18, dev, "fp32", rl.Efficiencies(norm=1.0), 256, phase)
        two = rl.op_times(resnet18, dev, "fp32", rl.Efficiencies(norm=2.0), 256, phase)
        sel = cls[ph == phase] == norm
        launch = rl.Efficiencies().launch_bw_s if phase else rl.Efficiencies().launch_fw_s
        np.testing.assert_allclose(two[sel] - launch, 2 * (one[sel] - launch), rtol=1e-12)
        np.testing.assert_array_equal(two[~sel], one[~sel])

    settings = TrainingSettings(optimizer="adamw")
    _copy_store(counted_adamw, tmp_path)
    first = load_census(MLP, "small", settings, root=tmp_path, count=False)
    path = census_path(tmp_path, MLP, "small", settings)
    old = first.to_dict()
    del old["classes"]
    path.write_text(json.dumps(old))
    served = load_census(MLP, "small", settings, root=tmp_path, count=False)
    assert served.classes == OLD_CLASSES and not served.current
    again = load_census(MLP, "small", settings, root=tmp_path)
    assert again.classes == CLASSES and json.loads(path.read_text())["classes"] == list(CLASSES)
    with pytest.raises(ConfigError, match="operator classes"):
        OpCensus.from_dict({**first.to_dict(), "classes": ["conv", "matmul", "other", "fft"]})
    for shipped in SHIPPED_DIR.glob("*.json"):
        assert json.loads(shipped.read_text())["classes"] == list(CLASSES), shipped.name


def test_an_estimate_in_bf16_holds_the_activations_at_two_bytes(
    specs: dict[str, rl.DeviceSpec],
) -> None:
    """ResNet-50's shipped census: about half the float32 bytes a sample in bf16 (the H200
    measured 42.6 against 82.6 MiB, `benchmarks/results/gpu_check_h200_2026-12-04`, kept
    out of every fit), so a bf16 estimate fits about twice the batch."""
    c = load_census("resnet50", "full", root=Path("/nonexistent-store"), count=False)
    assert 0.45 < c.saved_low_bytes1 / c.saved_bytes1 < 0.55
    gpu = specs["A10G"] if "A10G" in specs else next(iter(specs.values()))
    b32, _, per32 = rp.batch_limit(c, gpu, 1, "fp32")
    b16, _, per16 = rp.batch_limit(c, gpu, 1, "bf16")
    # the steepest moment of the passes: the saved tensors and little beside them (a CNN)
    assert per16 == max(b for _, b in c.held_lines("bf16"))
    assert per32 == max(b for _, b in c.held_lines("fp32"))
    assert 1.0 <= per16 / c.saved_low_bytes1 < 1.02 and 1.0 <= per32 / c.saved_bytes1 < 1.02
    assert 1.7 < b16 / b32 < 2.1


def test_tf32_is_a_setting_of_its_own_priced_on_the_tensor_cores(catalog: Catalog) -> None:
    """``tf32: true`` is its own profile (``@tf32``) and roofline mode; on an A100 (TF32
    tensor cores) BERT's estimated step is faster than in FP32 on the vector units, on a V100
    (none) it is the same, and 16-bit precision keeps its own mode whatever the switch."""
    on = TrainingSettings(tf32=True)
    assert on.suffix == "@tf32" and "tf32" in on.label() and not on.is_default
    assert TrainingSettings.from_dict({"tf32": True}) == on
    assert rl.mode_of("fp32", True) == "tf32" and rl.mode_of("fp32") == "fp32"
    assert rl.mode_of("bf16", True) == "amp"
    with pytest.raises(ConfigError, match="tf32: must be true or false"):
        TrainingSettings(tf32="yes")  # type: ignore[arg-type]

    fitted, _ = estimate.roofline_for(catalog, None)
    census = load_census("bert_base", "full", root=Path("/nonexistent-store"), count=False)

    def step(gpu: str, settings: TrainingSettings) -> float:  # from the specs alone
        spec = estimate.device_spec(catalog, gpu)
        assert spec is not None
        p = rp.estimate_profile(dataclasses.replace(census, settings=settings), spec, fitted)
        return float(p.t_iter(8))

    assert step("A100", on) < 0.95 * step("A100", DEFAULT_SETTINGS)
    assert step("V100", on) == pytest.approx(step("V100", DEFAULT_SETTINGS), rel=1e-9)


def test_fused_adamw_is_counted_as_its_one_kernel_and_priced_below_adamw(
    catalog: Catalog, tmp_path: Path
) -> None:
    """``adamw_fused`` is its own setting and census: its step is counted on the meta device
    as the fused kernel it runs (fewer operators, less traffic than AdamW's multi-tensor
    kernels: 32 counted bytes a parameter against 84), so from the specs its optimizer step
    is cheaper on a GPU; its forward and backward and its memory are AdamW's."""
    fused, plain = TrainingSettings(optimizer="adamw_fused"), TrainingSettings(optimizer="adamw")
    assert fused.suffix == "@adamw_fused" and TrainingSettings.from_dict(fused.to_dict()) == fused
    with pytest.raises(ConfigError, match="optimizer: must be one of sgd, adamw, adamw_fused"):
        TrainingSettings(optimizer="adam")
    counted = {s.optimizer: take_census(MLP, "tiny", s) for s in (fused, plain)}

    def step_ops(c: OpCensus) -> tuple[int, float]:
        phases = np.asarray(c.phase)
        return int((phases == 2).sum()), float(np.asarray(c.bytes0)[phases == 2].sum())

    (n_fused, b_fused), (n_plain, b_plain) = (
        step_ops(counted[o]) for o in ("adamw_fused", "adamw")
    )
    assert n_fused < n_plain and b_fused < 0.5 * b_plain, (n_fused, n_plain, b_fused, b_plain)
    # an update in place that returns nothing counts what it writes too: SGD with momentum
    # reads and writes the buffer twice and the parameter once, and reads the gradient
    # (8 float32 accesses a parameter); AdamW's multi-tensor passes make 21 (and count
    # their steps: a scalar a tensor)
    sgd = take_census(MLP, "tiny")
    assert step_ops(sgd)[1] == 32 * sgd.n_parameters
    assert b_plain == pytest.approx(84 * counted["adamw"].n_parameters, rel=0.01)
    assert counted["adamw_fused"].saved_bytes1 == counted["adamw"].saved_bytes1

    fitted, _ = estimate.roofline_for(catalog, None)
    spec = estimate.device_spec(catalog, "A100")
    assert spec is not None
    prof = {o: rp.estimate_profile(c, spec, fitted) for o, c in counted.items()}
    assert prof["adamw_fused"].optimizer_step_s < 0.7 * prof["adamw"].optimizer_step_s
    assert prof["adamw_fused"].b_max == prof["adamw"].b_max


def test_the_shipped_census_is_what_counting_gives_now(resnet18: OpCensus) -> None:
    fresh = take_census("resnet18", "full")
    strip = {"created_at": "", "torch_version": ""}
    assert dataclasses.replace(fresh, **strip) == dataclasses.replace(resnet18, **strip)
    assert shipped_census_path("resnet18", "full", DEFAULT_SETTINGS).is_file()


def test_a_census_is_taken_once_and_kept_in_the_store(tmp_path: Path, counted_sgd: Path) -> None:
    """``counted_sgd`` is a store in which ``load_census`` counted MLP/small: it kept it,
    and a second load serves it without counting."""
    assert stored_unit_parameters(MLP, "small", DEFAULT_SETTINGS, root=tmp_path) == ()
    _copy_store(counted_sgd, tmp_path)
    first = load_census(MLP, "small", root=tmp_path, count=False)
    # the planner reads the units of a census already counted, under either optimizer
    adamw = TrainingSettings(optimizer="adamw")
    assert stored_unit_parameters(MLP, "small", adamw, root=tmp_path) == (0, 8 * 16 + 16, 51)
    kept = list(tmp_path.glob("*/small/census.json"))
    assert len(kept) == 1
    assert load_census(MLP, "small", root=tmp_path) == first
    assert ProfileStore(tmp_path).list_paths() == []  # not mistaken for a profile
    with pytest.raises(ConfigError, match=r"srifty_core\.profiling\.census --model nowhere"):
        load_census("nowhere.py:build", "small", root=tmp_path, count=False)


def test_a_damaged_census_and_a_bad_reference_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from srifty_core.profiling.census import census_path, main

    path = census_path(tmp_path, "resnet50", "full", DEFAULT_SETTINGS)
    path.parent.mkdir(parents=True)
    path.write_text("{bad")
    with pytest.raises(ConfigError, match=r"census\.json: not an operator census .*delete it"):
        load_census("resnet50", "full", root=tmp_path)
    with pytest.raises(ProfileNotFoundError, match=r"no estimate either: .*not an operator census"):
        ProfileStore(tmp_path).load_or_estimate("resnet50", "full", "V100")
    with pytest.raises(SystemExit) as exit_:
        main(["--model", "nowhere.py:build"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere.py" in err[0]


def test_the_fits_flat_design_predicts_what_predict_does(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """The fit evaluates every observation at once (``_Design``): the same times as
    ``predict`` one by one, for every kind, mode, unit and the fused flag."""
    bert = load_census("bert_base", "full", root=Path("/nonexistent-store"), count=False)
    rng = np.random.default_rng(0)
    obs = [
        rl.Observation(census, specs[v], mode, b, 1.0, what, fused=fused)
        for v in sorted(specs)
        for census in (resnet18, bert)
        for mode in rl.MODES
        for what in ("fw", "bw", "step")
        for b, fused in ((1, False), (48, True), (256, False))
    ]
    for _ in range(3):
        eff = rl.Efficiencies.from_log(rng.uniform(rl._LOWER, rl._UPPER))
        got = rl._Design(obs).times(np.exp(eff.as_log()))
        np.testing.assert_allclose(got, [rl.predict(o, eff) for o in obs], rtol=1e-12)


def test_the_fit_recovers_efficiencies_it_was_given(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """Times made by known efficiencies on three GPUs, both passes, fp32 and amp, small and
    large batches: the fit finds the efficiencies again and predicts a fourth GPU."""
    truth = rl.Efficiencies(
        simt=0.9, tf32=0.45, half=0.5, conv=0.8, memory=0.6, half_bytes=0.55,
        launch_fw_s=2e-5, launch_bw_s=4e-5, norm=1.6,
    )  # fmt: skip
    bert = load_census("bert_base", "full", root=Path("/nonexistent-store"), count=False)
    obs = []
    for variant in ("Tesla V100 SXM2 16GB", "A100 SXM4 80GB", "H100 SXM5 80GB"):
        dev = specs[variant]
        for census in (resnet18, bert):
            for mode in ("fp32", "amp"):
                for b in (1, 8, 64, 256):
                    fw, bw, _ = rl.pass_times(census, dev, mode, truth, b)
                    obs.append(rl.Observation(census, dev, mode, b, fw, "fw", "", dev.name))
                    obs.append(rl.Observation(census, dev, mode, b, bw, "bw", "", dev.name))
    fitted = rl.fit(obs)
    h200 = specs["H200 SXM 141GB"]
    for mode in ("fp32", "amp"):
        want = rl.pass_times(resnet18, h200, mode, truth, 128)
        got = rl.pass_times(resnet18, h200, mode, fitted, 128)
        assert got[0] == pytest.approx(want[0], rel=0.02)
        assert got[1] == pytest.approx(want[1], rel=0.02)
    assert fitted.launch_bw_s == pytest.approx(truth.launch_bw_s, rel=0.05)


def test_a_faster_sheet_is_never_slower(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    eff = rl.Efficiencies()
    base = specs["Tesla T4 16GB (PCIe)"]
    for change in (
        {"fp32_flops": 2 * base.fp32_flops},
        {"memory_bytes_per_s": 2 * base.memory_bytes_per_s},
    ):
        faster = dataclasses.replace(base, **change)
        for b in (1, 32, 256):
            slow = sum(rl.pass_times(resnet18, base, "fp32", eff, b))
            fast = sum(rl.pass_times(resnet18, faster, "fp32", eff, b))
            assert fast <= slow
    with pytest.raises(ConfigError, match="mode"):
        base.peaks("int8")


def test_an_estimate_fits_memory_and_scaling_to_the_same_gpu_changes_nothing(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    fitted = rl.Roofline(rl.Efficiencies(), 10, ("V100", "A100"), 0.3, 0.15)
    t4 = rp.estimate_profile(resnet18, specs["Tesla T4 16GB (PCIe)"], fitted)
    h200 = rp.estimate_profile(resnet18, specs["H200 SXM 141GB"], fitted)
    assert t4.estimate == "specs" and t4.estimate_cv == 0.3
    assert t4.b_max < h200.b_max or h200.b_max == rl.MAX_BATCH
    assert float(t4.memory_bytes(t4.b_max)) <= 16 * 2**30
    assert t4.t_iter(64) > h200.t_iter(64)
    assert all(0 <= b.ready_fraction <= 1 for b in t4.buckets)
    assert [b.ready_fraction for b in t4.buckets] == sorted(b.ready_fraction for b in t4.buckets)
    same = rp.estimate_profile(
        resnet18,
        specs["Tesla T4 16GB (PCIe)"],
        fitted,
        source=t4,
        source_device=specs["Tesla T4 16GB (PCIe)"],
    )
    assert same.estimate == "scaled from T4" and same.estimate_cv == 0.15
    for b in (1, 16, 128):
        assert float(same.t_iter(b)) == pytest.approx(float(t4.t_iter(b)), rel=0.03)
    # activations of one sample that no T4 holds: B_max 0, timed at one sample (an offer of
    # it holds nothing under any strategy; the request plans on the other offers)
    huge = dataclasses.replace(resnet18, saved_bytes1=1e12)
    none = rp.estimate_profile(huge, specs["Tesla T4 16GB (PCIe)"], fitted)
    assert none.b_max == 0 and none.fw.batch_sizes == (1,)
    # a training state no T4 holds (3 x 5 GiB), activations it would: timed, B_max 0
    state = dataclasses.replace(resnet18, gradient_bytes=5 * 2**30)
    est = rp.estimate_profile(state, specs["Tesla T4 16GB (PCIe)"], fitted)
    assert est.b_max == 0 and est.b_max_limit == NO_REPLICA
    est.check()
    top = max(est.fw.batch_sizes)
    assert top > 1 and float(est.fw_fit.at(top)) > float(est.fw_fit.at(1)) > 0


def test_a_scaled_estimate_keeps_the_memory_a_sample_its_source_measured(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """A program whose kernels save less (or more) than the eager census counts: scaled
    from a GPU that measured it, the target's B_max comes from the measured bytes a sample
    (the same program and settings), not the census's; from the specs, the census's."""
    fitted = rl.Roofline(rl.Efficiencies(), 10, ("V100", "A100"), 0.3, 0.15)
    t4, a100 = specs["Tesla T4 16GB (PCIe)"], specs["A100 SXM4 40GB"]
    by_specs = rp.estimate_profile(resnet18, t4, fitted)
    for factor in (0.5, 2.0):
        measured = dataclasses.replace(
            rp.estimate_profile(resnet18, a100, fitted),
            memory_per_sample_bytes=by_specs.memory_per_sample_bytes * factor,
        )
        scaled = rp.estimate_profile(resnet18, t4, fitted, source=measured, source_device=a100)
        assert scaled.memory_per_sample_bytes == measured.memory_per_sample_bytes
        assert scaled.memory_fixed_bytes == by_specs.memory_fixed_bytes
        assert scaled.b_max == pytest.approx(by_specs.b_max / factor, rel=0.02)
        assert float(scaled.memory_bytes(scaled.b_max)) <= 16 * 2**30


def test_the_store_estimates_only_what_it_lacks_and_keeps_the_fit(
    tmp_path: Path, catalog: Catalog
) -> None:
    store = ProfileStore(tmp_path)
    got = store.load_or_estimate("resnet50", "full", "V100-16GB", catalog=catalog)
    assert got.estimate == "scaled from H200"  # the shipped H200 profile of resnet50
    assert got.device_type == "V100-16GB" and "estimated" in got.device_name
    kept = json.loads((tmp_path / "roofline.json").read_text())
    assert kept["observations"] > 50 and kept["specs_cv"] > 0 and kept["scaled_cv"] > 0
    mtime = (tmp_path / "roofline.json").stat().st_mtime_ns
    again = store.load_or_estimate("resnet18", "full", "A100-40GB", catalog=catalog)
    assert again.estimate == "specs"  # no measured resnet18 on any GPU
    assert (tmp_path / "roofline.json").stat().st_mtime_ns == mtime  # same evidence
    measured = dataclasses.replace(got, estimate="", estimate_cv=0.0, device_name="V100")
    store.save(measured)
    assert store.load_or_estimate("resnet50", "full", "V100-16GB", catalog=catalog) == measured
    with pytest.raises(ProfileNotFoundError, match="on cpu"):
        store.load_or_estimate("resnet50", "full", "cpu", catalog=catalog)
    adamw = store.load_or_estimate(
        "resnet50",
        "full",
        "T4",
        TrainingSettings(optimizer="adamw", precision="fp16"),
        catalog=catalog,
    )
    assert adamw.settings.optimizer == "adamw" and adamw.estimate == "specs"


def test_an_estimate_widens_the_p90_and_the_recalibration_prior(
    tmp_path: Path, catalog: Catalog
) -> None:
    est = ProfileStore(tmp_path).load_or_estimate("resnet50", "full", "T4", catalog=catalog)
    sure = dataclasses.replace(est, estimate="", estimate_cv=0.0)
    t4 = SimInstance(name="g4dn.xlarge", device_type="T4", ranks_per_vm=1)
    config = ClusterConfig((Group(t4, 2, 32),))
    sim = Simulator(ConstantBandwidth(5e9))
    wide = sim.estimate(Workload("resnet50", {"T4": est}), config)
    narrow = sim.estimate(Workload("resnet50", {"T4": sure}), config)
    assert wide.t_iter == pytest.approx(narrow.t_iter)
    assert wide.t_iter_p90 is not None and narrow.t_iter_p90 is not None
    assert wide.t_iter_p90 > narrow.t_iter_p90 * (1 + est.estimate_cv)
    assert wide.estimated == (est.estimate_note,) and narrow.estimated == ()
    p_wide = prior(Workload("resnet50", {"T4": est}), [t4], None)
    p_narrow = prior(Workload("resnet50", {"T4": sure}), [t4], None)
    assert p_wide.compute["T4"].sd > p_narrow.compute["T4"].sd


def test_units_fusion_and_the_carried_share(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """Convolutions run on TF32 tensor cores where the sheet has them, else on the FP32
    vector units; a sheet whose FP16 figure is the vector units' (A10G) costs ``amp`` there,
    never slower than FP32. The fused factor touches only rows flagged fused. A program
    that departs from the roofline by the same factor on every GPU carries all of it."""
    v100, a100, a10g = (
        specs[k]
        for k in ("Tesla V100 SXM2 16GB", "A100 SXM4 80GB", next(k for k in specs if "A10G" in k))
    )
    assert v100.units("fp32")[0][1] == "simt" and a100.units("fp32")[0][1] == "tf32"
    assert a100.units("fp32")[1][1] == "simt" and a100.units("tf32")[1][1] == "tf32"
    assert v100.units("amp")[0][1] == "half" and a10g.units("amp")[0][1] == "simt"
    eff = rl.Efficiencies(fused=0.3)
    assert sum(rl.pass_times(resnet18, a10g, "amp", eff, 64)) < sum(
        rl.pass_times(resnet18, a10g, "fp32", eff, 64)
    )
    eager = rl.pass_times(resnet18, a100, "amp", eff, 64)
    assert rl.pass_times(resnet18, a100, "amp", rl.Efficiencies(), 64) == eager
    assert sum(rl.pass_times(resnet18, a100, "amp", eff, 64, fused=True)) < sum(eager)
    obs = [
        rl.Observation(
            resnet18, dev, "amp", b, 1.3 * rl.pass_times(resnet18, dev, "amp", eff, b)[0],
            "fw", "x", dev.name,
        )
        for dev in (v100, a100)
        for b in (8, 64)
    ]  # fmt: skip
    obs += [dataclasses.replace(o, source="y", seconds=o.seconds / 1.3 / 1.2) for o in obs]
    assert rl.carry_share(obs, eff) == pytest.approx(1.0)
    assert rl.scale(2.0, 1.0, 3.0, 0.0) == 3.0 and rl.scale(2.0, 1.0, 3.0, 1.0) == 6.0


def test_a_published_step_holds_host_time_a_sample_and_an_estimate_does_not(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """``host_s`` adds the same seconds a sample to a published step on every GPU and
    nothing to a pass; the fit finds it again from steps made with it on two GPUs, and an
    estimated profile (the passes srifty's profiler times) is the same whatever it is."""
    a100, v100 = specs["A100 SXM4 80GB"], specs["Tesla V100 SXM2 16GB"]
    eff = rl.Efficiencies(host_s=4e-5)
    bare = dataclasses.replace(eff, host_s=0.0)
    for dev in (a100, v100):
        fw, bw, opt = rl.pass_times(resnet18, dev, "fp32", eff, 256)
        step = rl.Observation(resnet18, dev, "fp32", 256, 1.0, "step")
        assert rl.predict(step, eff) == pytest.approx(fw + bw + opt + 256 * 4e-5, rel=1e-12)
        assert rl.predict(step, bare) == pytest.approx(fw + bw + opt, rel=1e-12)
        fw_obs = dataclasses.replace(step, what="fw")
        assert rl.predict(fw_obs, eff) == rl.predict(fw_obs, bare) == fw
    truth = rl.Efficiencies(memory=0.6, host_s=3e-5)
    obs = [
        rl.Observation(resnet18, dev, mode, b, 0.0, what, "", dev.name)
        for dev in (a100, v100, specs["H100 SXM5 80GB"])
        for mode in ("fp32", "amp")
        for b in (8, 64, 256, 1024)
        for what in ("fw", "bw", "step")
    ]
    obs = [dataclasses.replace(o, seconds=rl.predict(o, truth)) for o in obs]
    assert rl.fit(obs).host_s == pytest.approx(3e-5, rel=0.05)
    roof = rl.Roofline(eff, 10, ("V100", "A100"), 0.3, 0.15)
    bare_roof = dataclasses.replace(roof, efficiencies=bare)
    got, want = (rp.estimate_profile(resnet18, a100, r) for r in (roof, bare_roof))
    assert got.fw_fit.at(128) == want.fw_fit.at(128)
    assert got.optimizer_step_s == want.optimizer_step_s


def test_the_estimates_spread_is_of_the_step_a_plan_adds_up(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """Leaving a GPU out, a profile's forward and backward at one batch are scored as one
    step (their errors weighted by their times), a published step as it is; the roofline's
    ``specs_cv`` is the spread of those."""
    truth = rl.Efficiencies(memory=0.6, launch_fw_s=2e-5, launch_bw_s=6e-5)
    devs = [specs[k] for k in ("A100 SXM4 80GB", "Tesla V100 SXM2 16GB", "H100 SXM5 80GB")]
    obs = [
        rl.Observation(resnet18, dev, "fp32", b, 0.0, what, "p", dev.name)
        for dev in devs
        for b in (1, 8, 256)
        for what in ("fw", "bw", "step")
    ]
    jitter = {"fw": 0.7, "bw": 1.4, "step": 1.1}  # a profile's passes err apart
    obs = [dataclasses.replace(o, seconds=rl.predict(o, truth) * jitter[o.what]) for o in obs]
    held = rl.held_out(obs)
    for g, errs in held.specs.items():
        left = [o for o in obs if o.group == g]
        by = {(o.batch, o.what): (e, o.seconds) for o, e in zip(left, errs, strict=True)}
        want = sorted(
            [by[b, "step"][0] for b in (1, 8, 256)]
            + [
                sum((1 + by[b, w][0]) * by[b, w][1] for w in ("fw", "bw"))
                / sum(by[b, w][1] for w in ("fw", "bw"))
                - 1
                for b in (1, 8, 256)
            ]
        )
        assert sorted(held.specs_steps[g]) == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert rl.learn(obs, held).specs_cv == pytest.approx(held.log_sd("specs_steps"))


def test_a_network_the_evidence_does_not_hold_carries_the_spread_of_one_left_out(
    resnet18: OpCensus, specs: dict[str, rl.DeviceSpec]
) -> None:
    """``learn`` leaves each census model out in turn (``model_cv``); a spec estimate of a
    network the evidence holds carries the by-GPU spread, of any other network both in
    quadrature, and a scaled estimate the scaled spread whatever the network."""
    bert = load_census("bert_base", "full", root=Path("/nonexistent-store"), count=False)
    truth = rl.Efficiencies(memory=0.6)
    devs = [specs[k] for k in ("A100 SXM4 80GB", "Tesla V100 SXM2 16GB", "H100 SXM5 80GB")]
    obs = []
    for census, off in ((resnet18, 1.3), (bert, 0.8)):  # each network departs its own way
        for dev in devs:
            for b in (8, 64, 256):
                o = rl.Observation(census, dev, "fp32", b, 0.0, "step", "p", dev.name)
                obs.append(dataclasses.replace(o, seconds=rl.predict(o, truth) * off))
    roof = rl.learn(obs)
    assert roof.networks == tuple(sorted({"resnet18", "bert_base"}))
    assert roof.model_cv > 0.1  # one network's departure is not the other's
    assert roof.spec_cv("resnet18") == roof.specs_cv
    assert roof.spec_cv("my_model") == pytest.approx(math.hypot(roof.specs_cv, roof.model_cv))
    assert rl.Roofline.from_dict(roof.to_dict()) == roof
    new = dataclasses.replace(resnet18, model="my_model")
    est = rp.estimate_profile(new, specs["A100 SXM4 80GB"], roof)
    assert est.estimate_cv == pytest.approx(roof.spec_cv("my_model"))
    assert est.estimate_note == f"A100-80GB: specs ({est.estimate_cv:.0%} held-out spread)"
    zoo = rp.estimate_profile(resnet18, specs["A100 SXM4 80GB"], roof)
    assert zoo.estimate_cv == roof.specs_cv
