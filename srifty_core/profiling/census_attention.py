"""Scaled-dot-product attention as a GPU runs it in 16 bits, for the census: one fused
operator a call in each pass, not the math path's scores, softmax and dropout mask.

On a GPU, ``F.scaled_dot_product_attention`` on bf16/fp16 inputs runs FlashAttention (or the
memory-efficient kernel): the ``s x s`` scores never reach memory and are not saved for the
backward pass. On the meta device, where the census counts, torch takes the math path
instead, upcast to float32. While ``attention(fuse=True)`` is entered, each call runs
through ``aten._scaled_dot_product_efficient_attention`` and its backward, which have meta
kernels and FLOP counts (``census_count`` classes them as matrix products), and save what
the fused kernels save (the inputs, the output and the log-sum-exp). Either way the mode
counts the calls (``calls``): a census without any is the same in every precision.

Used for 16-bit censuses (``bf16-true``, and autocast's bf16/fp16, which share one): there
flash attention is what the GPU runs. In fp32 the census keeps the math path (counting it
fused there too was investigated and not shipped: BENCHMARKS.md "Attention counted as the
fused kernel"). The FLOPs are torch's count, the full square: a causal kernel skips about
half of them.

Imports torch: import it where a census is counted, not above.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes


def _grouped(t: Any, kv_heads: int) -> Any:
    """``t`` (``... x H x S x D``, a query-side tensor) as ``... x Hkv x (H/Hkv * S) x D``:
    each key/value head's group of query heads one longer sequence, the shapes a kernel with
    grouped-query attention (GQA) computes over, K and V read once a group. A layout change
    only (on meta: no data), made outside the census's count: a GPU's kernel launches
    nothing for it."""
    if t.size(-3) == kv_heads:
        return t
    *lead, h, s, d = t.shape
    with _disable_current_modes():
        return t.reshape(*lead, kv_heads, h // kv_heads * s, d)


def _grouped_mask(mask: Any, q: Any, k: Any) -> Any:
    """An attention mask for ``_grouped`` queries: broadcast to every query head, then
    grouped (outside the count; a mask that broadcast over heads is then read at full
    size, an overcount of a rare case: Hugging Face repeats K and V where it has a mask)."""
    kv_heads = k.size(-3)
    if mask is None or q.size(-3) == kv_heads:
        return mask
    with _disable_current_modes():
        full = mask.expand(*q.shape[:-1], k.size(-2))
    return _grouped(full, kv_heads)


def _ungrouped(t: Any, like: Any) -> Any:
    """``t`` (``_grouped``'s shape) in ``like``'s shape, laid out as the kernel lays out a
    multi-head output (``... x S x H x D`` in memory), so that what the model does with it
    next is the same views as without groups (a reshape would copy: a kernel the GPU does
    not launch). A view only: on meta, where the census counts, there are no values to
    misplace."""
    if t.shape == like.shape:
        return t
    *lead, h, s, d = like.shape
    with _disable_current_modes():
        layout = torch.empty((*lead, s, h, d), device="meta").transpose(-3, -2)
        return t.as_strided(like.shape, layout.stride(), t.storage_offset())


class _Attention(torch.autograd.Function):
    """The memory-efficient kernel's forward and backward operators on meta (shapes, FLOPs
    and bytes, no values: a grouped causal flag over ``_grouped``'s longer rows would mask
    the wrong keys on data, and the FLOP count ignores it)."""

    @staticmethod
    def forward(
        ctx: Any, q: Any, k: Any, v: Any, mask: Any, p: float, causal: bool, scale: Any
    ) -> Any:
        kv = k.size(-3)
        out, lse, seed, offset = torch.ops.aten._scaled_dot_product_efficient_attention(
            _grouped(q, kv), k, v, _grouped_mask(mask, q, k), True, p, causal, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.rest = (mask, seed, offset, p, causal, scale)
        return _ungrouped(out, q)

    @staticmethod
    def backward(ctx: Any, grad: Any) -> Any:
        q, k, v, out, lse = ctx.saved_tensors
        mask, seed, offset, p, causal, scale = ctx.rest
        kv = k.size(-3)
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            _grouped(grad, kv), _grouped(q, kv), k, v, _grouped_mask(mask, q, k), out, lse,
            seed, offset, p, [True, True, True, False], causal, scale=scale,
        )  # fmt: skip
        return _ungrouped(dq, q), dk, dv, None, None, None, None


class Attention(TorchFunctionMode):
    """Counts ``F.scaled_dot_product_attention`` calls (``calls``); with ``fuse``, runs
    each as the memory-efficient kernel's forward and backward operators (two operators to
    the census)."""

    def __init__(self, fuse: bool) -> None:
        super().__init__()
        self.fuse = fuse
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        self.calls += 1
        if not self.fuse:
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


def fused_attention() -> Attention:
    """A mode under which ``F.scaled_dot_product_attention`` is the memory-efficient
    kernel's forward and backward operators (``Attention(fuse=True)``)."""
    return Attention(fuse=True)
