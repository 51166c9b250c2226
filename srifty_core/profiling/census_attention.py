"""Scaled-dot-product attention as a GPU runs it in bf16, for the census: one fused operator
a call in each pass, not the math path's scores, softmax and dropout mask.

On a GPU, ``F.scaled_dot_product_attention`` on bf16 inputs runs FlashAttention (or the
memory-efficient kernel): the ``s x s`` scores never reach memory and are not saved for the
backward pass. On the meta device, where the census counts, torch takes the math path
instead, upcast to float32. While ``fused_attention`` is entered, each call runs through
``aten._scaled_dot_product_efficient_attention`` and its backward, which have meta kernels
and FLOP counts (``census_count`` classes them as matrix products), and save what the fused
kernels save (the inputs, the output and the log-sum-exp).

Used for ``bf16-true`` censuses only: there flash attention is what a bf16-capable GPU runs.
Counting it so under autocast and fp32 too was investigated and not shipped
(``benchmarks/investigations/fused_attention.py``, BENCHMARKS.md "Attention counted as
the fused kernel"). The FLOPs are torch's count, the full square: a causal kernel skips
about half of them.

Imports torch: import it where a census is counted, not above.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: Any, k: Any, v: Any, mask: Any, p: float, causal: bool, scale: Any
    ) -> Any:
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, True, p, causal, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.rest = (mask, seed, offset, p, causal, scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        mask, seed, offset, p, causal, scale = ctx.rest
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            grad, q, k, v, mask, out, lse, seed, offset, p, [True, True, True, False],
            causal, scale=scale,
        )  # fmt: skip
        return dq, dk, dv, None, None, None, None


class _Mode(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        q, k, v, *rest = args
        names = ("attn_mask", "dropout_p", "is_causal", "scale")
        kwargs.update(zip(names, rest, strict=False))
        mask = kwargs.get("attn_mask")
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        return _Attention.apply(  # type: ignore[no-untyped-call]
            q, k, v, mask, float(kwargs.get("dropout_p", 0.0)),
            bool(kwargs.get("is_causal", False)), kwargs.get("scale"),
        )  # fmt: skip


def fused_attention() -> TorchFunctionMode:
    """A mode under which ``F.scaled_dot_product_attention`` is the memory-efficient
    kernel's forward and backward operators (two operators to the census)."""
    return _Mode()
