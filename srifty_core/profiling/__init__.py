"""Compute profiling: runs ON the device it measures (CPU here, CUDA where present).

Light to import: the names below, the contract (``profile``) and the store need no torch;
the zoo, the profiler and the DDP bucket check import torch when used.
"""

MODEL_NAMES: tuple[str, ...] = (
    "resnet18",
    "resnet50",
    "vgg16",
    "alexnet",
    "inception_v3",
    "shufflenet_v2",
    "bert_base",
    "xlm",
    "dlrm",
)
"""Every model of the zoo (``srifty_core.profiling.zoo`` builds them)."""

SIZES: tuple[str, ...] = ("tiny", "small", "full")
"""Size presets: ``full`` is the real network; ``small`` profiles on a CPU in seconds;
``tiny`` is for tests."""
