"""The GPT-2-small-shaped decoder of Raschka's *Build a Large Language Model (From
Scratch)*, as its training-speed chapter's baseline runs it
(rasbt/LLMs-from-scratch ``ch05/10_llm-training-speed/00_orig.py``, Apache-2.0): written
here from that description, operator for operator, because the census counts the operators
a program runs and this one writes its own.

12 blocks of 768 with 12 heads over 1,024 tokens and GPT-2's 50,257-token vocabulary; the
query, key and value projections without bias; a causal mask kept as a buffer and applied
with ``masked_fill_`` before a softmax of the scaled scores; dropout 0.1 after the
embeddings, on the attention weights and on both residual branches; LayerNorm from its
mean and biased variance; GELU's tanh approximation from ``tanh`` and ``pow``; an output head
of its own (not tied to the embedding). About 163 M parameters.

The chapter's later steps change the program, and ``ops`` builds each: ``"scratch"`` (the
baseline's own LayerNorm and GELU), ``"torch"`` (section 6: ``nn.LayerNorm`` and
``nn.GELU(approximate="tanh")``), ``"sdpa"`` (section 7, ``01_opt_single_gpu.py``'s
``PyTorchMultiHeadAttention``: one ``qkv`` projection without bias and
``F.scaled_dot_product_attention(is_causal=True)`` with the attention dropout, on top of
section 6). The parameter count is the same in all three.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

VOCAB = 50257
CONTEXT = 1024
WIDTH = 768
HEADS = 12
LAYERS = 12
DROP = 0.1


class _Attention(nn.Module):
    def __init__(self, width: int, heads: int, context: int, drop: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.w_query = nn.Linear(width, width, bias=False)
        self.w_key = nn.Linear(width, width, bias=False)
        self.w_value = nn.Linear(width, width, bias=False)
        self.out_proj = nn.Linear(width, width)
        self.dropout = nn.Dropout(drop)
        self.register_buffer("mask", torch.triu(torch.ones(context, context), diagonal=1))

    def forward(self, x: Tensor) -> Tensor:
        b, t, width = x.shape

        def split(y: Tensor) -> Tensor:
            return y.view(b, t, self.heads, self.head_dim).transpose(1, 2)

        keys, queries, values = split(self.w_key(x)), split(self.w_query(x)), split(self.w_value(x))
        scores = queries @ keys.transpose(2, 3)
        mask: Tensor = self.mask  # type: ignore[assignment]
        scores.masked_fill_(mask.bool()[:t, :t], -torch.inf)
        weights = self.dropout(torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1))
        context = (weights @ values).transpose(1, 2).reshape(b, t, width)
        return self.out_proj(context)  # type: ignore[no-any-return]


class _SdpaAttention(nn.Module):
    def __init__(self, width: int, heads: int, drop: float) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width)
        self.drop = drop

    def forward(self, x: Tensor) -> Tensor:
        b, t, width = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        queries, keys, values = qkv
        context = nn.functional.scaled_dot_product_attention(
            queries, keys, values, dropout_p=self.drop if self.training else 0.0, is_causal=True
        )
        return self.proj(context.transpose(1, 2).contiguous().view(b, t, width))  # type: ignore[no-any-return]


class _LayerNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(width))
        self.shift = nn.Parameter(torch.zeros(width))

    def forward(self, x: Tensor) -> Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)
        return self.scale * ((x - mean) / torch.sqrt(var + self.eps)) + self.shift


class _GELU(nn.Module):
    def forward(self, x: Tensor) -> Tensor:
        c = torch.sqrt(torch.tensor(2.0 / math.pi, device=x.device))
        return 0.5 * x * (1 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3))))


OPS = ("scratch", "torch", "sdpa")
"""The chapter's programs (module doc)."""


def _norm(width: int, ops: str) -> nn.Module:
    return _LayerNorm(width) if ops == "scratch" else nn.LayerNorm(width)


class _Block(nn.Module):
    def __init__(self, width: int, heads: int, context: int, drop: float, ops: str) -> None:
        super().__init__()
        self.att: nn.Module = (
            _SdpaAttention(width, heads, drop)
            if ops == "sdpa"
            else _Attention(width, heads, context, drop)
        )
        gelu = _GELU() if ops == "scratch" else nn.GELU(approximate="tanh")
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), gelu, nn.Linear(4 * width, width))
        self.norm1, self.norm2 = _norm(width, ops), _norm(width, ops)
        self.drop_shortcut = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop_shortcut(self.att(self.norm1(x)))
        return x + self.drop_shortcut(self.ff(self.norm2(x)))  # type: ignore[no-any-return]


class GPTFromScratch(nn.Module):
    def __init__(
        self,
        vocab: int = VOCAB,
        context: int = CONTEXT,
        width: int = WIDTH,
        heads: int = HEADS,
        layers: int = LAYERS,
        drop: float = DROP,
        ops: str = "scratch",
    ) -> None:
        super().__init__()
        if ops not in OPS:
            raise ValueError(f"ops: one of {', '.join(OPS)}, got {ops!r}")
        self.tok_emb = nn.Embedding(vocab, width)
        self.pos_emb = nn.Embedding(context, width)
        self.drop_emb = nn.Dropout(drop)
        self.trf_blocks = nn.Sequential(
            *[_Block(width, heads, context, drop, ops) for _ in range(layers)]
        )
        self.final_norm = _norm(width, ops)
        self.out_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: Tensor) -> Tensor:
        pos = self.pos_emb(torch.arange(ids.shape[1], device=ids.device))
        x = self.drop_emb(self.tok_emb(ids) + pos)
        return self.out_head(self.final_norm(self.trf_blocks(x)))  # type: ignore[no-any-return]
