"""The zoo's model names and the size presets: plain tuples, no torch, so the schema, the
CLI's help and the DAGs' parameters can list them (``workloads.zoo`` builds the models)."""

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
"""Every model of the zoo (``srifty_core.workloads.zoo`` builds them)."""

SIZES: tuple[str, ...] = ("tiny", "small", "full")
"""Size presets: ``full`` is the real network; ``small`` profiles on a CPU in seconds;
``tiny`` is for tests."""
