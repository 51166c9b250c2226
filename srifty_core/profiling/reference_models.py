"""The reference networks' published module path: ``srifty_core.profiling.reference_models:NAME``
is the model reference of their stored profiles and shipped operator census (the store's
key digests the reference's text), so it stays; the code is
``srifty_core.workloads.reference_models``."""

from srifty_core.workloads.reference_models import (
    SQUAD_SEQ,
    bert_base_squad,
    bert_large_squad,
    gpt2_from_scratch,
    gpt2_sdpa,
    gpt2_torch_layers,
    resnext101_32x4d,
)

__all__ = [
    "SQUAD_SEQ",
    "bert_base_squad",
    "bert_large_squad",
    "gpt2_from_scratch",
    "gpt2_sdpa",
    "gpt2_torch_layers",
    "resnext101_32x4d",
]
