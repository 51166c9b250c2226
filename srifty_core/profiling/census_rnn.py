"""Recurrent layers as a GPU runs them, for the census: one fused operator a layer stack in
each pass, not a handful per timestep.

On a GPU, ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run as cuDNN's fused kernels (every layer
and timestep inside one call, and one call back); on the meta device, where the census
counts, torch decomposes them into operators of each timestep, whose launches then price a
language model's LSTM at hundreds of times its work. While ``fused_rnns`` is entered, these
modules run through ``srifty_census::fused_rnn`` and its backward: operators with meta
kernels of the right shapes, the FLOPs of the gate products (``rnn_flops``), and what
cuDNN keeps for the backward pass (its reserve: every layer's gates at every timestep).
Packed sequences, unbatched inputs and projected LSTMs keep torch's own path.

Imports torch: import it where a census is counted, not above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence
from torch.utils.flop_counter import register_flop_formula

GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
"""Gate blocks a cell multiplies its input and its state by (each ``hidden`` wide)."""
FORWARD, BACKWARD = "fused_rnn", "fused_rnn_backward"
"""The operators' names as the census sees them (``census_count`` classes them as matrix
products)."""


def _dims(
    x: Sequence[int], mode: str, layers: int, hidden: int, bidirectional: bool, batch_first: bool
) -> tuple[int, int, int, int, int]:
    """(batch, timesteps, input width, directions, gate width) of a call."""
    batch, steps = (x[0], x[1]) if batch_first else (x[1], x[0])
    return batch, steps, x[2], 2 if bidirectional else 1, GATES[mode] * hidden


def rnn_flops(
    x: Sequence[int], mode: str, layers: int, hidden: int, bidirectional: bool, batch_first: bool
) -> int:
    """The forward's FLOPs: each layer's and direction's gate products with its input and
    its state at every timestep (the elementwise gate arithmetic is a few percent beside
    them, as the matrix-product class prices it)."""
    batch, steps, width, dirs, gates = _dims(x, mode, layers, hidden, bidirectional, batch_first)
    total = 0
    for layer in range(layers):
        inputs = width if layer == 0 else hidden * dirs
        total += dirs * 2 * batch * steps * gates * (inputs + hidden)
    return total


@torch.library.custom_op(f"srifty_census::{FORWARD}", mutates_args=(), device_types="meta")
def fused_rnn(
    x: Tensor,
    hx: list[Tensor],
    weights: list[Tensor],
    mode: str,
    layers: int,
    hidden: int,
    bidirectional: bool,
    batch_first: bool,
) -> list[Tensor]:
    """[output, final states (h, and c for an LSTM), cuDNN's reserve]: a meta kernel only
    (counted, never run)."""
    batch, steps, _, dirs, gates = _dims(x.shape, mode, layers, hidden, bidirectional, batch_first)
    out_shape = (batch, steps, dirs * hidden) if batch_first else (steps, batch, dirs * hidden)
    return [
        x.new_empty(out_shape),
        *(h.new_empty(h.shape) for h in hx),
        x.new_empty((layers * dirs, steps, batch, gates)),
    ]


@torch.library.custom_op(f"srifty_census::{BACKWARD}", mutates_args=(), device_types="meta")
def fused_rnn_backward(
    grads: list[Tensor | None],
    x: Tensor,
    hx: list[Tensor],
    weights: list[Tensor],
    output: Tensor,
    reserve: Tensor,
    mode: str,
    layers: int,
    hidden: int,
    bidirectional: bool,
    batch_first: bool,
) -> list[Tensor]:
    """[input's gradient, the initial states', the weights']: a meta kernel only."""
    return [t.new_empty(t.shape) for t in (x, *hx, *weights)]


def _setup(ctx: Any, inputs: tuple[Any, ...], output: list[Tensor]) -> None:
    x, hx, weights, *config = inputs
    ctx.config = config
    ctx.counts = (len(hx), len(weights))
    ctx.save_for_backward(x, output[0], output[-1], *hx, *weights)
    ctx.mark_non_differentiable(output[-1])  # the reserve
    ctx.set_materialize_grads(False)  # an unused state's gradient stays None, no zeros


def _backward(ctx: Any, grads: list[Tensor | None]) -> tuple[Any, ...]:
    x, output, reserve, *rest = ctx.saved_tensors
    n_hx, _ = ctx.counts
    hx, weights = rest[:n_hx], rest[n_hx:]
    got = fused_rnn_backward(
        list(grads[: 1 + n_hx]), x, list(hx), list(weights), output, reserve, *ctx.config
    )
    return (got[0], got[1 : 1 + n_hx], got[1 + n_hx :], None, None, None, None, None)


fused_rnn.register_autograd(_backward, setup_context=_setup)


@register_flop_formula(torch.ops.srifty_census.fused_rnn)
def _forward_flops(
    x: Sequence[int], hx: Any, weights: Any, mode: str, layers: int, hidden: int,
    bidirectional: bool, batch_first: bool, *args: Any, **kwargs: Any,
) -> int:  # fmt: skip
    return rnn_flops(x, mode, layers, hidden, bidirectional, batch_first)


@register_flop_formula(torch.ops.srifty_census.fused_rnn_backward)
def _backward_flops(
    grads: Any, x: Sequence[int], hx: Any, weights: Any, output: Any, reserve: Any, mode: str,
    layers: int, hidden: int, bidirectional: bool, batch_first: bool, *args: Any, **kwargs: Any,
) -> int:  # fmt: skip
    """Twice the forward's: the gradients of the inputs and of the weights."""
    return 2 * rnn_flops(x, mode, layers, hidden, bidirectional, batch_first)


def _fused_forward(original: Any) -> Any:
    def forward(self: nn.RNNBase, input: Any, hx: Any = None) -> Any:
        if isinstance(input, PackedSequence) or input.dim() != 3 or getattr(self, "proj_size", 0):
            return original(self, input, hx)
        batch = input.size(0) if self.batch_first else input.size(1)
        dirs = 2 if self.bidirectional else 1
        lstm = self.mode == "LSTM"
        if hx is None:
            shape = (self.num_layers * dirs, batch, self.hidden_size)
            states = [input.new_zeros(shape) for _ in range(2 if lstm else 1)]
        else:
            states = list(hx) if lstm else [hx]
        out = torch.ops.srifty_census.fused_rnn(
            input, states, list(self._flat_weights), self.mode, self.num_layers,
            self.hidden_size, self.bidirectional, self.batch_first,
        )  # fmt: skip
        return (out[0], (out[1], out[2])) if lstm else (out[0], out[1])

    return forward


@contextlib.contextmanager
def fused_rnns() -> Iterator[None]:
    """Within: ``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` run as the fused operators above."""
    classes = (nn.LSTM, nn.GRU, nn.RNN)
    saved = {c: c.forward for c in classes}
    try:
        for c in classes:
            c.forward = _fused_forward(saved[c])  # type: ignore[method-assign]
        yield
    finally:
        for c, f in saved.items():
            c.forward = f  # type: ignore[method-assign]
