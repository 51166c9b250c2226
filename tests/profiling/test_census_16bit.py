"""Autocast's 16 bits (bf16 and fp16) have a census of their own, ``bf16``, counted with
scaled-dot-product attention as the fused kernel a GPU runs there; a step that calls no
attention is served by its fp32 census."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.errors import ConfigError
from srifty_core.profiling import census as census_mod
from srifty_core.profiling.census import OpCensus, census_path, load_census, take_census
from srifty_core.profiling.estimate import census_settings
from srifty_core.training_settings import TrainingSettings

REF = "srifty_core.profiling.reference_models:"
SDPA, LAYERS = REF + "gpt2_sdpa", REF + "gpt2_torch_layers"
FP32 = TrainingSettings(optimizer="adamw")
BF16 = TrainingSettings(optimizer="adamw", precision="bf16")


@pytest.mark.parametrize(
    ("precision", "counted"),
    [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "bf16"), ("bf16-true", "bf16-true")],
)
def test_autocast_bf16_and_fp16_share_one_census(precision: str, counted: str) -> None:
    asked = TrainingSettings(optimizer="adamw", precision=precision, tf32=precision == "fp32")
    assert census_settings(asked) == TrainingSettings(optimizer="adamw", precision=counted)


def test_attention_is_fused_in_autocast_and_counted_in_both() -> None:
    """The SDPA decoder: in fp32 the math path (the ``s x s`` scores and softmax saved), in
    bf16 the fused kernel (fewer operators, less saved at autocast's widths, and less held
    at once); the calls are counted either way, once per layer."""
    wide, narrow = take_census(SDPA, "small", FP32), take_census(SDPA, "small", BF16)
    assert wide.attention_calls == narrow.attention_calls > 0
    assert len(narrow.phase) < len(wide.phase)
    assert narrow.saved_bytes("bf16")[1] < 0.9 * wide.saved_bytes("bf16")[1]
    assert narrow.held_at("bf16", 8) < wide.held_at("bf16", 8)  # type: ignore[operator]
    assert narrow.current and OpCensus.from_json(narrow.to_json()) == narrow


def test_a_step_without_attention_is_served_its_fp32_census(tmp_path: Path) -> None:
    """No counting for the 16-bit census where the step calls no attention: the fp32
    census, under the bf16 settings; one that calls it has its own (none here to count:
    ``count=False`` says how to make it)."""
    wide = take_census(LAYERS, "small", FP32)
    assert wide.attention_calls == 0
    path = census_path(tmp_path, LAYERS, "small", FP32)
    path.parent.mkdir(parents=True)
    path.write_text(wide.to_json())
    served = load_census(LAYERS, "small", BF16, root=tmp_path, count=False)
    assert served.settings == BF16 and served.saved_bytes("bf16") == wide.saved_bytes("bf16")
    assert not census_path(tmp_path, LAYERS, "small", BF16).exists()

    sdpa = take_census(SDPA, "small", FP32)
    path = census_path(tmp_path, SDPA, "small", FP32)
    path.parent.mkdir(parents=True)
    path.write_text(sdpa.to_json())
    with pytest.raises(ConfigError, match=r"--precision bf16"):
        load_census(SDPA, "small", BF16, root=tmp_path, count=False)
    # a census from before the calls were counted is not current: counted again
    old = {k: v for k, v in wide.to_dict().items() if k != "attention_calls"}
    assert not OpCensus.from_dict(old).current


def test_the_census_command_counts_fp16_as_the_shared_bf16_census(data_dir: Path) -> None:
    argv = ["--model", LAYERS, "--size", "tiny", "--optimizer", "adamw", "--precision", "fp16"]
    assert census_mod.main(argv) == 0
    stored = census_path(paths.profiles_dir(), LAYERS, "tiny", BF16)
    assert json.loads(stored.read_text())["settings"]["precision"] == "bf16"
