"""``bf16-true``: the model cast to bf16 (parameters, gradients, optimizer states and
activations at 2 bytes, no autocast), as a setting, in the census, the roofline, the memory
models and the ranks' preparation."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

from srifty_core.catalog import Catalog
from srifty_core.errors import ConfigError
from srifty_core.planner.schema.fields import PrecisionName
from srifty_core.predictors import roofline as rl
from srifty_core.profiling import estimate
from srifty_core.profiling import roofline_profile as rp
from srifty_core.profiling.census import OpCensus, load_census, take_census
from srifty_core.profiling.census_count import CLASSES
from srifty_core.profiling.store import ProfileStore
from srifty_core.sharding.memory import Layout, ModelMemory, rank_memory
from srifty_core.training_settings import PRECISIONS, STATE_BYTES, TrainingSettings
from srifty_core.workloads import build, choose_precision, prepare

REF = "srifty_core.profiling.reference_models:"
PURE = TrainingSettings(optimizer="adamw_fused", precision="bf16-true")
FP32 = TrainingSettings(optimizer="adamw_fused")


def _census(model: str, settings: TrainingSettings) -> OpCensus:
    return take_census(REF + model, "small", settings)


@pytest.fixture(scope="module")
def counted() -> dict[tuple[str, str], OpCensus]:
    """The small decoders' censuses, fp32 and bf16-true (about 5 s in all)."""
    return {
        (m, s.precision): _census(m, s)
        for m in ("gpt2_torch_layers", "gpt2_sdpa")
        for s in (FP32, PURE)
    }


def test_the_setting_is_named_everywhere_precisions_are() -> None:
    pure = TrainingSettings(precision="bf16-true")
    assert pure.suffix == "@bf16-true" and "bf16-true" in pure.label()
    assert TrainingSettings.from_dict(pure.to_dict()) == pure
    assert set(typing.get_args(typing.get_args(PrecisionName)[0])) == set(PRECISIONS)
    assert set(STATE_BYTES) == set(PRECISIONS)
    with pytest.raises(ConfigError, match=r"^precision: must be one of .*bf16-true.*'bf16_true'"):
        TrainingSettings(precision="bf16_true")


@pytest.mark.parametrize(
    ("device", "bf16_everywhere", "runs"),
    [("cuda", True, "bf16-true"), ("cuda", False, "fp16"), ("cpu", True, "fp32")],
)
def test_where_bf16_true_runs(device: str, bf16_everywhere: bool, runs: str) -> None:
    """On GPUs that all support bf16, as asked; else autocast fp16 with a scaler, as bf16
    falls back; a CPU computes fp32 whatever the setting."""
    assert choose_precision("bf16-true", device, bf16_everywhere) == runs


def test_a_bf16_true_rank_holds_its_model_and_float_inputs_in_bf16() -> None:
    """What ``prepare`` does where bf16-true runs: the parameters and the floating inputs
    in bf16, token ids untouched, and a step runs without autocast."""
    w = build(REF + "gpt2_torch_layers", "small", seed=0)
    assert prepare(w, PURE, precision="bf16-true") == "bf16-true"
    assert {p.dtype for p in w.module.parameters()} == {torch.bfloat16}
    ids, targets = w.make_batch(2, torch.device("cpu"), seed=0)
    assert ids.dtype == torch.int64 and targets.dtype == torch.int64
    loss = w.loss((ids, targets))
    loss.backward()
    assert loss.dtype == torch.bfloat16 and torch.isfinite(loss.float())
    v = build("tests/workload_fixtures/factories.py:sized", "small", seed=0)
    prepare(v, PURE, precision="bf16-true")
    assert all(t.dtype == torch.bfloat16 for t in v.make_batch(2, torch.device("cpu"))[:1])
    # the CPU path of every other precision leaves the model as built
    u = build(REF + "gpt2_torch_layers", "small", seed=0)
    assert prepare(u, PURE) == "fp32"
    assert {p.dtype for p in u.module.parameters()} == {torch.float32}


def test_the_census_counts_a_bf16_true_step_at_two_bytes(
    counted: dict[tuple[str, str], OpCensus],
) -> None:
    """The same program: the same operators and FLOPs, every tensor's bytes halved (within
    the few float32 scalars a step keeps), gradients and AdamW's states included."""
    a, b = counted["gpt2_torch_layers", "fp32"], counted["gpt2_torch_layers", "bf16-true"]
    assert b.settings == PURE and b.key.endswith("@adamw_fused+bf16-true")
    assert len(a.phase) == len(b.phase) and a.flops1 == b.flops1
    assert b.gradient_bytes * 2 == a.gradient_bytes
    for x, y in ((a.bytes1, b.bytes1), (a.bytes0, b.bytes0)):
        assert sum(y) / sum(x) == pytest.approx(0.5, abs=0.01)
    opt = np.array(a.phase) == 2
    opt16, opt32 = np.array(b.bytes0)[opt].sum(), np.array(a.bytes0)[opt].sum()
    assert opt16 * 2 == pytest.approx(opt32, rel=1e-3)
    assert b.saved_bytes("bf16-true") == (b.saved_bytes0, b.saved_bytes1)
    assert b.saved_bytes1 * 2 == pytest.approx(a.saved_bytes1, rel=0.01)


def test_bf16_true_attention_is_counted_as_the_fused_kernel(
    counted: dict[tuple[str, str], OpCensus],
) -> None:
    """In fp32 the meta device takes scaled-dot-product attention's math path, which saves
    what the masked attention of the torch-layers program saves; in bf16-true it is the
    fused kernel (flash attention on a GPU): no scores saved, fewer operators."""
    math_path, masked = counted["gpt2_sdpa", "fp32"], counted["gpt2_torch_layers", "fp32"]
    assert math_path.saved_bytes1 == masked.saved_bytes1
    fused, unfused = counted["gpt2_sdpa", "bf16-true"], counted["gpt2_torch_layers", "bf16-true"]
    assert fused.saved_bytes1 < 0.95 * unfused.saved_bytes1
    assert len(fused.phase) < len(unfused.phase)
    mm = np.array(fused.op_class) == CLASSES.index("matmul")
    assert (
        np.array(fused.flops1)[mm].sum()
        >= np.array(unfused.flops1)[np.array(unfused.op_class) == CLASSES.index("matmul")].sum()
    )


def test_the_roofline_prices_bf16_true_on_the_16_bit_units_at_the_counted_bytes(
    counted: dict[tuple[str, str], OpCensus],
) -> None:
    """``pure16``: the tensor cores of ``amp``, but the census's bytes as counted (no
    learned share of float32 bytes): changing ``half_bytes`` moves an amp step only."""
    assert rl.mode_of("bf16-true") == rl.mode_of("bf16-true", True) == "pure16"
    gpu = estimate.device_spec(Catalog.load(), "A100-80GB")
    assert gpu is not None
    assert gpu.units("pure16") == gpu.units("amp")
    c = counted["gpt2_torch_layers", "bf16-true"]
    lo, hi = rl.Efficiencies(half_bytes=0.3), rl.Efficiencies(half_bytes=0.9)
    assert rl.pass_times(c, gpu, "pure16", lo, 8) == rl.pass_times(c, gpu, "pure16", hi, 8)
    assert rl.pass_times(c, gpu, "amp", lo, 8) != rl.pass_times(c, gpu, "amp", hi, 8)


def test_memory_of_a_bf16_true_step_holds_its_state_at_two_bytes(
    counted: dict[tuple[str, str], OpCensus],
) -> None:
    """B_max from the census (the state is 2 + AdamW's 2 copies of the bf16 gradients'
    bytes) and the sharded strategies' rank memory (2-byte parameters, gradients, states)."""
    gpu = estimate.device_spec(Catalog.load(), "A100-40GB")
    assert gpu is not None
    a, b = counted["gpt2_torch_layers", "fp32"], counted["gpt2_torch_layers", "bf16-true"]
    _, _, per32 = rp.batch_limit(a, gpu, 2, "fp32")
    _, _, per16 = rp.batch_limit(b, gpu, 2, "bf16-true")
    assert b.saved_bytes1 <= per16 < per32
    # the saved tensors' line alone (the moments of the passes left out): the state
    a, b = (dataclasses.replace(c, peak_lines=(), peak_low_lines=()) for c in (a, b))
    _, fixed32, per32 = rp.batch_limit(a, gpu, 2, "fp32")
    _, fixed16, per16 = rp.batch_limit(b, gpu, 2, "bf16-true")
    assert fixed16 - b.saved_bytes0 == 4 * b.gradient_bytes
    assert (fixed16 - b.saved_bytes0) * 2 == fixed32 - a.saved_bytes0
    assert per16 == b.saved_bytes1 < per32
    model = ModelMemory(unit_parameters=(100, 300, 300, 300), activation_bytes_per_sample=0.0)
    for strategy in ("ddp", "fsdp"):
        layout = Layout(strategy=strategy, world=4, ranks_per_vm=4)
        full = rank_memory(model, FP32, layout, 0)
        half = rank_memory(model, PURE, layout, 0)
        for part in ("parameters", "gradients", "optimizer"):
            assert getattr(half, part) * 2 == getattr(full, part), (strategy, part)


def test_the_public_entry_answers_a_bf16_true_decoder(tmp_path: Path) -> None:
    """An estimate of the shipped bf16-true decoder on an A100 40 GB from its sheet: the
    published batch (8) fits, and about twice the fp32 program's B_max."""
    store = ProfileStore(tmp_path)
    pure = store.load_or_estimate(REF + "gpt2_sdpa", "full", "A100-40GB", PURE)
    fp32 = store.load_or_estimate(REF + "gpt2_from_scratch", "full", "A100-40GB", FP32)
    assert pure.estimate and pure.settings == PURE
    assert pure.b_max >= 8 and pure.b_max > 2 * fp32.b_max
    assert load_census(REF + "gpt2_sdpa", "full", PURE, root=tmp_path, count=False).settings == PURE


def test_a_user_script_s_model_is_cast_by_wrap_where_bf16_true_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``worker.user.wrap`` under a rank that computes in bf16-true (a GPU rank; here its
    state set as ``init`` would on one): the model is bf16 inside DDP, and ``autocast()``
    adds nothing. A one-rank gloo group stands in for the plan's ranks."""
    from torch import distributed as dist

    from srifty_core.planner.schema.train_plan import TrainPlan
    from srifty_core.worker import user

    plan = TrainPlan(
        model="tests/workload_fixtures/factories.py:sized", size="small", global_batch=4,
        iterations=1, local_batches=(4,), run_dir=str(tmp_path / "run"), precision="bf16-true",
    )  # fmt: skip
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan.to_dict()))
    monkeypatch.setenv(user.PLAN_ENV, str(path))
    monkeypatch.setattr(user._state, "device", torch.device("cpu"))
    monkeypatch.setattr(user._state, "precision", "bf16-true")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = user.wrap(torch.nn.Linear(4, 2))
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        with user.autocast():
            out = model(torch.ones(3, 4, dtype=torch.bfloat16))
        assert out.dtype == torch.bfloat16
        assert user.precision() == "bf16-true"
    finally:
        dist.destroy_process_group()


def test_measured_profiles_in_two_precisions_each_learn_with_their_own_census(
    tmp_path: Path,
) -> None:
    """The roofline's evidence from a store holding the same model measured in fp32 and in
    bf16-true: each profile's observations carry the census counted for its precision (one
    cached by model and optimizer alone would hand the first to both)."""

    from srifty_core.profiling.profile import ComputeProfile

    h200 = ComputeProfile.from_json(
        (estimate.GPU_PROFILES / "h200_resnet50.json").read_text(encoding="utf-8")
    )
    store = ProfileStore(tmp_path)
    for settings in (FP32, PURE):
        store.save(dataclasses.replace(h200, model=REF + "gpt2_from_scratch", settings=settings))
    observations, _ = estimate.evidence(Catalog.load(), store)
    mine = {o.census.settings.precision: o for o in observations if "gpt2" in o.census.model}
    assert set(mine) == {"fp32", "bf16-true"}
    assert mine["bf16-true"].mode == "pure16" and mine["fp32"].mode == "fp32"
    assert mine["bf16-true"].census.gradient_bytes * 2 == mine["fp32"].census.gradient_bytes


def test_the_census_counts_the_most_its_passes_hold_at_once(
    counted: dict[tuple[str, str], OpCensus],
) -> None:
    """``peak_bytes``: what the forward and backward passes hold at once (the saved tensors
    and the transients beside them, gradients as they accumulate) is at least what they
    save (all of it is held when the forward pass ends), halves with the widths under
    bf16-true, survives a round trip, and reads as not counted (-1) from a census that
    predates it."""
    from srifty_core.profiling.census import BATCHES

    for (_, precision), c in counted.items():
        for b in BATCHES:
            peak, saved = c.peak_bytes0 + c.peak_bytes1 * b, c.saved_bytes0 + c.saved_bytes1 * b
            assert peak >= saved > 0, (precision, b)
        assert OpCensus.from_json(c.to_json()) == c
    a, b = counted["gpt2_torch_layers", "fp32"], counted["gpt2_torch_layers", "bf16-true"]
    assert b.peak_bytes1 * 2 == pytest.approx(a.peak_bytes1, rel=0.02)
    old = {k: v for k, v in a.to_dict().items() if not k.startswith("peak")}
    assert OpCensus.from_dict(old).peak_bytes1 == -1.0


def test_a_model_counted_only_in_bf16_true_keeps_its_fsdp_units_for_the_planner(
    tmp_path: Path,
) -> None:
    """A census counted in bf16-true alone (a user's decoder planned in it) is keyed by its
    precision: the planner's sharded strategies still read its units from it (they read the
    fp32 censuses alone, so the whole model was one unit and nothing fit a rank)."""
    from srifty_core.profiling.census import stored_unit_parameters

    model = REF + "gpt2_sdpa"
    assert stored_unit_parameters(model, "tiny", PURE, root=tmp_path) == ()
    counted = load_census(model, "tiny", PURE, root=tmp_path)  # counted and kept
    units = stored_unit_parameters(model, "tiny", PURE, root=tmp_path)
    assert len(units) > 2 and units == counted.unit_parameters
    assert sum(units) == counted.n_parameters
    # autocast's fp16 is counted as the shared bf16 census, and found under it
    half = TrainingSettings(optimizer="adamw", precision="fp16")
    other = tmp_path / "other"
    load_census(model, "tiny", half, root=other)  # counted and kept
    assert stored_unit_parameters(model, "tiny", half, root=other) == units
