"""The published benchmarks' networks (``workloads/reference_models.py``): each builds and
trains a step, and every census the package ships is there."""

from __future__ import annotations

import pytest
import torch

from srifty_core.profiling.census import SHIPPED_MODELS, shipped_census_path, shipped_settings
from srifty_core.workloads.reference_models import (
    bert_base_squad,
    bert_large_squad,
    gpt2_from_scratch,
    gpt2_sdpa,
    gpt2_torch_layers,
    resnext101_32x4d,
)


def test_every_shipped_model_has_its_census() -> None:
    for model, *how in SHIPPED_MODELS:
        path = shipped_census_path(model, "full", shipped_settings(how))
        assert path.is_file(), f"{model}: run python -m srifty_core.profiling.census --ship"


@pytest.mark.parametrize(
    "factory",
    [
        bert_base_squad,
        bert_large_squad,
        resnext101_32x4d,
        gpt2_from_scratch,
        gpt2_torch_layers,
        gpt2_sdpa,
    ],
)
def test_a_reference_network_trains_a_step(factory: object) -> None:
    parts = factory("small")  # type: ignore[operator]
    batch = parts.make_batch(2, torch.Generator().manual_seed(0))
    loss = parts.loss(parts.module, batch)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in parts.module.parameters() if p.requires_grad)


def test_resnext_is_nvidias_32x4d() -> None:
    """44.18 M parameters, as torchvision's ``resnext101_32x4d`` (32 groups of width 4)."""
    module = resnext101_32x4d("full").module
    assert sum(p.numel() for p in module.parameters()) == 44_177_704
    grouped = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d) and m.groups > 1]
    assert len(grouped) == 33 and all(m.groups == 32 for m in grouped)


def test_the_held_out_published_rows_are_in_no_fit() -> None:
    """BERT-large's, ResNeXt's and the decoders' published rows score the estimate
    (``benchmarks/held_out_public.py``): no evidence the roofline learns from holds them."""
    import csv

    from srifty_core.catalog import Catalog
    from srifty_core.profiling import estimate

    with estimate.PUBLIC_THROUGHPUT.open(newline="", encoding="utf-8") as f:
        held = [
            r
            for r in csv.DictReader(f)
            if r["model"] in ("bert_large_squad", "resnext101-32x4d")
            or r["source_id"] == "rasbt_llm_speed"
        ]
    assert len(held) >= 48 and not any(r["zoo_model"] for r in held)
    observations, _ = estimate.evidence(Catalog.load(), store=None)
    keys = {o.census.key for o in observations}
    assert not [k for k in keys if "bert_large" in k or "resnext" in k or "gpt2_" in k], keys
    assert len(observations) == 100  # BENCHMARKS.md's figures were fitted on these


def test_the_decoder_is_the_books_124m_configuration() -> None:
    """163,009,536 parameters (GPT-2 small's shape with an untied head and no qkv bias), in
    each of the chapter's programs (torch's layers, then one qkv projection and SDPA)."""
    for factory in (gpt2_from_scratch, gpt2_torch_layers, gpt2_sdpa):
        with torch.device("meta"):  # shapes only: no 650 MB of weights drawn at random
            module = factory("full").module
        assert sum(p.numel() for p in module.parameters()) == 163_009_536, factory
