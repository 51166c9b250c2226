"""Which network trains: the zoo's names and sizes, model references (a zoo name,
``module:factory``, ``file.py:factory`` or ``hf:NAME``) and what builds them.

Light to import (no torch): the names below parse and key a reference; ``build``, the
zoo (``workloads.zoo``), its vision models and the reference networks import torch when
used. A model factory returns ``Parts(module, make_batch, loss)``
(``workloads.references``); ``workloads.prepare`` applies the training settings.
"""

from srifty_core.workloads.names import MODEL_NAMES, SIZES
from srifty_core.workloads.prepare import choose_precision, make_optimizer, prepare
from srifty_core.workloads.references import (
    HF_CONFIGS,
    HF_SIZE_LIMITS,
    ModelRef,
    ModelRefError,
    Parts,
    build,
    describe,
    model_key,
    parse_model,
    shipped_hf_configs,
    shrink_hf_config,
)

__all__ = [
    "HF_CONFIGS",
    "HF_SIZE_LIMITS",
    "MODEL_NAMES",
    "SIZES",
    "ModelRef",
    "ModelRefError",
    "Parts",
    "build",
    "choose_precision",
    "describe",
    "make_optimizer",
    "model_key",
    "parse_model",
    "prepare",
    "shipped_hf_configs",
    "shrink_hf_config",
]
