"""The most a step's passes hold at once (``OpCensus.peak_bytes``), at the counted widths
and at autocast's, and B_max read from the larger of it and the saved tensors
(``roofline_profile.batch_limit``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from srifty_core.catalog import Catalog
from srifty_core.predictors.roofline import MEMORY_HEADROOM
from srifty_core.profiling import estimate
from srifty_core.profiling import roofline_profile as rp
from srifty_core.profiling.census import BATCHES, OpCensus, take_census
from srifty_core.profiling.census_count import peak_hull
from srifty_core.training_settings import TrainingSettings
from srifty_core.workloads import build

DECODER = "srifty_core.profiling.reference_models:gpt2_torch_layers"
ADAMW = TrainingSettings(optimizer="adamw")


@pytest.fixture(scope="module")
def decoder() -> OpCensus:
    """The small decoder's census (fp32 counted, autocast's widths beside; about 2 s)."""
    return take_census(DECODER, "small", ADAMW)


def _saved(c: OpCensus, precision: str, b: int) -> float:
    fixed, per = c.saved_bytes(precision)
    return fixed + per * b


def _held(c: OpCensus, precision: str, b: float) -> float:
    held = c.held_at(precision, b)
    assert held is not None
    return held


def test_the_peak_holds_the_saved_tensors_and_the_logits_gradient_beside_them(
    decoder: OpCensus,
) -> None:
    """At either width the passes hold at least what the forward pass saves (all of it is
    alive when it ends); beside it, at the start of the backward pass, the gradient of the
    logits (float32 under autocast too: the loss's softmax runs in float32)."""
    import torch

    workload = build(DECODER, "small")
    vocab = workload.module.out_head.out_features
    seq = workload.make_batch(1, torch.device("cpu"))[0].shape[-1]
    logits = vocab * seq * 4  # a sample's logits' gradient, float32
    for precision in ("fp32", "bf16", "fp16"):
        for b in (1, *BATCHES, 64, 4096):
            held = _held(decoder, precision, b)
            assert held >= _saved(decoder, precision, b) + logits * b, (precision, b)
    assert decoder.held_lines("bf16") == decoder.held_lines("fp16")
    for b in BATCHES:  # the matrix products' outputs at 2 bytes
        assert 0.5 < _held(decoder, "bf16", b) / _held(decoder, "fp32", b) < 0.9
    assert OpCensus.from_json(decoder.to_json()) == decoder


def test_the_lines_are_the_top_of_every_moment() -> None:
    """``peak_hull``: the moments' lines through their bytes at the two counted batches,
    only those on top somewhere from batch 1 on; the largest of them at any batch is the
    largest of all the moments' there."""
    rng = np.random.default_rng(0)
    at_a = rng.uniform(0, 100, 500)
    at_b = at_a + rng.uniform(-5, 60, 500)  # some moments hold less at the larger batch
    hull = peak_hull(list(at_a), list(at_b))
    assert 1 <= len(hull) < 50 and [b for _, b in hull] == sorted(b for _, b in hull)
    span = BATCHES[1] - BATCHES[0]
    per = np.maximum((at_b - at_a) / span, 0.0)
    fixed = at_a - per * BATCHES[0]
    for batch in (1, 1.5, 2, 3, 8, 100, 1e6):
        assert max(a + b * batch for a, b in hull) == pytest.approx((fixed + per * batch).max())
    # a flat moment overtaken before batch 1 is left out; one overtaken at 2 is kept
    [(fixed1, per1)] = peak_hull([5.0, 6.8], [5.0, 12.8])
    assert (fixed1, per1) == pytest.approx((4.8, 1.0))
    kept = [x for line in peak_hull([5.0, 5.0], [5.0, 7.0]) for x in line]
    assert kept == pytest.approx([5.0, 0.0, 13 / 3, 1 / 3])


def test_autocast_keeps_the_gradients_it_accumulates_in_float32() -> None:
    """A model whose weights outweigh its activations holds most at the end of the backward
    pass: every parameter's gradient, float32 under autocast too, though the products they
    come from run at 2 bytes."""
    mlp = take_census("tests/workload_fixtures/factories.py:sized", "full")
    for b in BATCHES:
        assert mlp.gradient_bytes <= _held(mlp, "bf16", b) <= _held(mlp, "fp32", b)


def test_b_max_is_under_every_line_and_the_steepest_is_the_profiles(decoder: OpCensus) -> None:
    """The saved tensors with the weights, gradients and state, and each moment's bytes
    with the weights and state: B_max is the largest batch under every line; the line
    returned (a profile's fixed bytes and bytes a sample) is the steepest."""
    a100 = estimate.device_spec(Catalog.load(), "A100-40GB")
    assert a100 is not None
    gpu = dataclasses.replace(a100, memory_gib=1.0)  # the small decoder's B_max under the cap
    g, states = decoder.gradient_bytes, 2
    room = gpu.memory_gib * 2**30 * MEMORY_HEADROOM

    def need(c: OpCensus, precision: str, b: int, k: float = 1.0) -> float:
        """What the step holds at batch ``b``, each moment's share a sample times ``k``."""
        saved0, saved1 = c.saved_bytes(precision)
        lines = [(saved0 + (2 + states) * g, saved1)]
        lines += [(a + (1 + states) * g, per) for a, per in c.held_lines(precision)]
        return max(a + per * k * b for a, per in lines)

    for precision in ("fp32", "bf16"):
        b_max, fixed, per = rp.batch_limit(decoder, gpu, states, precision)
        assert need(decoder, precision, b_max) <= room < need(decoder, precision, b_max + 1)
        steepest = max(b for _, b in decoder.held_lines(precision))
        assert per == steepest > decoder.saved_bytes(precision)[1]  # the logits beside
        assert (fixed - (1 + states) * g, per) in decoder.held_lines(precision)
        # uncounted (a census from before): the saved tensors alone, more batches
        old = dataclasses.replace(decoder, peak_lines=(), peak_low_lines=())
        more, _, alone = rp.batch_limit(old, gpu, states, precision)
        assert alone == decoder.saved_bytes(precision)[1] and more > b_max
        # a measured GPU's memory a sample (the scaled path): every moment scaled by it
        k = 1.5
        fewer, _, measured = rp.batch_limit(decoder, gpu, states, precision, steepest * k)
        assert measured == pytest.approx(steepest * k) and fewer < b_max
        assert need(decoder, precision, fewer, k) <= room < need(decoder, precision, fewer + 1, k)
    # a moment that holds more than the GPU at any batch, its share a sample 0 (gradients
    # being reduced after the activations are gone): nothing fits (it raised OverflowError)
    flat = ((2 * room, 0.0),)
    over = dataclasses.replace(
        decoder, peak_lines=flat + decoder.peak_lines, peak_low_lines=flat + decoder.peak_low_lines
    )
    assert rp.batch_limit(over, gpu, states, "fp32")[0] == 0


def test_a_census_counted_before_the_moments_is_not_current(decoder: OpCensus) -> None:
    assert decoder.current
    old = {k: v for k, v in decoder.to_dict().items() if not k.endswith("_lines")}
    before = OpCensus.from_dict(old)
    assert not before.current and before.held_at("bf16", 8) is None
