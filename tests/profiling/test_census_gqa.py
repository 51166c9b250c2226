"""Grouped-query attention (GQA: fewer key/value heads than query heads, as Llama, Mistral
and Qwen have) counted as the fused kernel in a 16-bit census: its step runs on meta (it
raised there, and the census fell back to building the model on the CPU), with the
attention FLOPs of its query heads and K and V at their own heads
(``census_attention._grouped``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from srifty_core.profiling.census import OpCensus, take_census
from srifty_core.profiling.census_count import CLASSES
from srifty_core.training_settings import TrainingSettings

GQA = """
import torch
from torch import nn
from torch.nn import functional as F

HEADS, KV_HEADS, DIM, SEQ, VOCAB, MASK = 8, {kv}, 16, 32, 100, {mask}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(HEADS * DIM, HEADS * DIM, bias=False)
        self.kv = nn.Linear(HEADS * DIM, 2 * KV_HEADS * DIM, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, HEADS, DIM).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, KV_HEADS, DIM).permute(2, 0, 3, 1, 4)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril() if MASK else None
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=not MASK, enable_gqa=KV_HEADS != HEADS
        )
        return x + out.transpose(1, 2).reshape(b, s, HEADS * DIM)


def build():
    model = nn.Sequential(
        nn.Embedding(VOCAB, HEADS * DIM), Block(), Block(), nn.Linear(HEADS * DIM, VOCAB)
    )

    def batch(b, gen):
        return (torch.randint(0, VOCAB, (b, SEQ), generator=gen),)

    def loss(m, batch):
        return m(batch[0]).float().logsumexp(-1).mean()

    return model, batch, loss
"""
PURE = TrainingSettings(optimizer="adamw", precision="bf16-true")


@pytest.mark.parametrize(
    ("settings", "mask"), [(PURE, False), (TrainingSettings(precision="bf16"), False), (PURE, True)]
)
def test_gqa_is_counted_fused_on_meta_with_its_query_heads_flops(
    tmp_path: Path, settings: TrainingSettings, mask: bool
) -> None:
    censuses = {}
    for kv in (2, 8):  # grouped, and the same queries over as many key/value heads
        path = tmp_path / f"gqa{kv}.py"
        path.write_text(GQA.format(kv=kv, mask=mask))
        censuses[kv] = take_census(f"{path}:build", "tiny", settings)
    gqa, mha = censuses[2], censuses[8]
    assert gqa.device == mha.device == "meta" and gqa.attention_calls == 2
    # the same kernels in the same order: grouping the queries launches nothing
    assert (gqa.phase, gqa.op_class) == (mha.phase, mha.op_class)
    # the K/V projection has a quarter of the weights
    assert mha.n_parameters - gqa.n_parameters == 2 * (128 * 2 * 6 * 16)
    matmul = CLASSES.index("matmul")

    def attention_flops(c: OpCensus) -> list[float]:  # the matrix products a sample
        return [f for f, k in zip(c.flops1, c.op_class, strict=True) if k == matmul]

    # attention's FLOPs are the query heads', whatever the key/value heads
    seq, heads, dim = 32, 8, 16
    fw = 4 * heads * seq * seq * dim
    assert fw in attention_flops(gqa) and fw in attention_flops(mha)
    assert sum(attention_flops(gqa)) < sum(attention_flops(mha))  # smaller K/V projections
