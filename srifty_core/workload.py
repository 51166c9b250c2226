"""The former home of model references, kept for model factories written against it
(``from srifty_core.workload import Parts``): the code is ``srifty_core.workloads``."""

from srifty_core.workloads import (
    HF_CONFIGS,
    HF_SIZE_LIMITS,
    ModelRef,
    ModelRefError,
    Parts,
    build,
    describe,
    make_optimizer,
    model_key,
    parse_model,
    prepare,
    shipped_hf_configs,
    shrink_hf_config,
)

__all__ = [
    "HF_CONFIGS",
    "HF_SIZE_LIMITS",
    "ModelRef",
    "ModelRefError",
    "Parts",
    "build",
    "describe",
    "make_optimizer",
    "model_key",
    "parse_model",
    "prepare",
    "shipped_hf_configs",
    "shrink_hf_config",
]
