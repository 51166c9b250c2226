"""Recurrent layers counted as cuDNN runs them (``profiling.census_rnn``)."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from srifty_core.profiling import census_rnn
from srifty_core.profiling.census import CLASSES, take_census

LM = "tests/workload_fixtures/factories.py:lstm_lm"


def _matmul_flops(c: object, phase: int) -> float:
    ph, cls = np.array(c.phase), np.array(c.op_class)  # type: ignore[attr-defined]
    f1 = np.array(c.flops1)  # type: ignore[attr-defined]
    return float(f1[(ph == phase) & (cls == CLASSES.index("matmul"))].sum())


def test_an_lstm_language_model_is_one_fused_operator_a_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The LSTM of a 35-token language model is one operator in the forward pass and one
    in the backward, priced as matrix products, with the forward FLOPs torch's
    per-timestep decomposition counts (which launches 2,598 operators); every parameter
    still gets its gradient (DDP's buckets hold them all)."""
    fused = take_census(LM, "full")
    monkeypatch.setattr(census_rnn, "fused_rnns", contextlib.nullcontext)
    eager = take_census(LM, "full")
    assert len(fused.phase) < 30 < 1000 < len(eager.phase)
    assert _matmul_flops(fused, 0) == pytest.approx(_matmul_flops(eager, 0), rel=1e-9)
    assert _matmul_flops(fused, 1) == pytest.approx(_matmul_flops(eager, 1), rel=0.01)
    assert sum(fused.bucket_params) == sum(eager.bucket_params) == 2 * 4 + 3
    assert fused.saved_bytes1 > 0 and fused.device == "meta"


def test_the_fused_operator_has_the_shapes_and_flops_of_each_recurrent_layer() -> None:
    """GRU and a bidirectional LSTM with their initial states given: the outputs' shapes are
    torch's, the FLOPs are the gate products of every layer, direction and timestep, and
    gradients reach the input, the states and the weights. Outside the context the module
    is torch's again."""
    x = torch.empty(3, 7, 5, device="meta", requires_grad=True)
    for module, gates in (
        (torch.nn.GRU(5, 6, num_layers=2, batch_first=True), 3),
        (torch.nn.LSTM(5, 6, num_layers=2, batch_first=True, bidirectional=True), 4),
    ):
        module = module.to("meta")
        dirs = 2 if module.bidirectional else 1
        h0 = torch.empty(2 * dirs, 3, 6, device="meta", requires_grad=True)
        state = (h0, torch.empty_like(h0)) if isinstance(module, torch.nn.LSTM) else h0
        want_out, want_state = module(x, state)
        with census_rnn.fused_rnns():
            out, got_state = module(x, state)
        assert out.shape == want_out.shape
        for got, want in zip(
            torch.utils._pytree.tree_leaves(got_state),
            torch.utils._pytree.tree_leaves(want_state),
            strict=True,
        ):
            assert got.shape == want.shape
        out.sum().backward()
        assert x.grad is not None and h0.grad is not None
        assert all(p.grad is not None for p in module.parameters())
        layer0 = 2 * 3 * 7 * gates * 6 * (5 + 6)
        layer1 = 2 * 3 * 7 * gates * 6 * (6 * dirs + 6)
        assert census_rnn.rnn_flops(
            (3, 7, 5), module.mode, 2, 6, module.bidirectional, True
        ) == dirs * (layer0 + layer1)
        x.grad = h0.grad = None
    assert torch.nn.LSTM.forward is not None and "fused" not in torch.nn.LSTM.forward.__qualname__
