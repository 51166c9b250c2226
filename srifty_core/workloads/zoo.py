"""The model zoo: the method's workloads, built offline with synthetic batches.

Each model has size presets: ``full`` is the real network at its native input size;
``small`` is narrower with smaller inputs, for profiling on a CPU in seconds; ``tiny`` is for
tests. BERT-base and XLM come from ``transformers`` configs with random weights (nothing is
downloaded); the vision models and DLRM are written in torch (``vision.py`` and below).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from srifty_core.errors import ConfigError, UnknownNameError
from srifty_core.workloads.names import MODEL_NAMES, SIZES
from srifty_core.workloads.vision import VISION_BUILDERS

# name -> size -> knobs. Vision: width multiplier, image side, classes.
_VISION_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "resnet18": {
        "full": {"width": 1.0, "image": 224, "classes": 1000},
        "small": {"width": 0.5, "image": 64, "classes": 100},
        "tiny": {"width": 0.125, "image": 64, "classes": 10},
    },
    "resnet50": {
        "full": {"width": 1.0, "image": 224, "classes": 1000},
        "small": {"width": 0.25, "image": 64, "classes": 100},
        "tiny": {"width": 0.125, "image": 64, "classes": 10},
    },
    "vgg16": {
        "full": {"width": 1.0, "image": 224, "classes": 1000},
        "small": {"width": 0.125, "image": 64, "classes": 100},
        "tiny": {"width": 0.0625, "image": 32, "classes": 10},
    },
    "alexnet": {
        "full": {"width": 1.0, "image": 224, "classes": 1000},
        "small": {"width": 0.25, "image": 128, "classes": 100},
        "tiny": {"width": 0.125, "image": 64, "classes": 10},
    },
    "inception_v3": {
        "full": {"width": 1.0, "image": 299, "classes": 1000},
        "small": {"width": 0.25, "image": 107, "classes": 100},
        "tiny": {"width": 0.125, "image": 107, "classes": 10},
    },
    "shufflenet_v2": {
        "full": {"width": 1.0, "image": 224, "classes": 1000},
        "small": {"width": 0.5, "image": 64, "classes": 100},
        "tiny": {"width": 0.25, "image": 64, "classes": 10},
    },
}

# Transformers: encoder depth/width, sequence length, vocabulary.
_NLP_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "bert_base": {
        "full": {"layers": 12, "hidden": 768, "heads": 12, "seq": 128, "vocab": 30522},
        "small": {"layers": 4, "hidden": 256, "heads": 4, "seq": 64, "vocab": 8192},
        "tiny": {"layers": 2, "hidden": 64, "heads": 2, "seq": 16, "vocab": 512},
    },
    "xlm": {
        "full": {"layers": 12, "hidden": 2048, "heads": 16, "seq": 128, "vocab": 30145},
        "small": {"layers": 4, "hidden": 256, "heads": 4, "seq": 64, "vocab": 8192},
        "tiny": {"layers": 2, "hidden": 64, "heads": 2, "seq": 16, "vocab": 512},
    },
}

# DLRM (Criteo-like: 13 dense features, 26 categorical tables), data-parallel: the embedding
# tables are dense parameters, so their gradients are allreduced like any other.
_DLRM_PRESETS: dict[str, dict[str, Any]] = {
    "full": {"tables": 26, "rows": 100_000, "dim": 64, "bottom": (512, 256), "top": (512, 256)},
    "small": {"tables": 26, "rows": 10_000, "dim": 32, "bottom": (128, 64), "top": (128, 64)},
    "tiny": {"tables": 4, "rows": 100, "dim": 8, "bottom": (16,), "top": (16,)},
}

DESCRIPTIONS: dict[str, str] = {
    "resnet18": "ResNet-18, ImageNet-style classification",
    "resnet50": "ResNet-50 (bottleneck blocks)",
    "vgg16": "VGG-16 with the 4096-wide classifier",
    "alexnet": "AlexNet (torchvision variant)",
    "inception_v3": "Inception v3 without the auxiliary head",
    "shufflenet_v2": "ShuffleNet v2 1.0x",
    "bert_base": "BERT-base masked language model (transformers config, random weights)",
    "xlm": "XLM language model (transformers config, random weights)",
    "dlrm": "DLRM-style recommender: embedding tables, bottom/top MLPs, dot interaction",
}


def model_names() -> list[str]:
    """Every model of the zoo."""
    return list(MODEL_NAMES)


Batch = tuple[Tensor, ...]


@dataclass
class Workload:
    """A built model with its synthetic-batch maker and loss. Not frozen: it owns a module."""

    name: str
    size: str
    module: nn.Module
    knobs: Mapping[str, Any]
    _make_batch: Callable[[int, torch.device, torch.Generator], Batch]
    _loss: Callable[[nn.Module, Batch], Tensor]

    def make_batch(self, batch_size: int, device: torch.device, seed: int = 0) -> Batch:
        """A deterministic synthetic batch of ``batch_size`` samples on ``device``."""
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        gen = torch.Generator().manual_seed(seed)
        return tuple(t.to(device) for t in self._make_batch(batch_size, device, gen))

    def loss(self, batch: Batch) -> Tensor:
        """Forward pass and loss (a scalar) on ``batch``."""
        return self._loss(self.module, batch)

    def to(self, device: torch.device) -> Workload:
        self.module.to(device)
        return self

    @property
    def n_parameters(self) -> int:
        return sum(p.numel() for p in self.module.parameters() if p.requires_grad)


def _check(name: str, size: str) -> None:
    if name not in DESCRIPTIONS:
        raise UnknownNameError("model", name, model_names(), context="(the zoo)")
    if size not in SIZES:
        raise UnknownNameError("model size", size, SIZES)


def build(name: str, size: str = "small", seed: int = 0) -> Workload:
    """Build zoo model ``name`` at ``size`` with seeded random weights."""
    _check(name, size)
    torch.manual_seed(seed)  # weight init; the batch has its own generator
    if name in _VISION_PRESETS:
        return _vision(name, size)
    if name in _NLP_PRESETS:
        return _nlp(name, size)
    return _dlrm(size)


def _ce(module: nn.Module, batch: Batch) -> Tensor:
    x, y = batch
    return nn.functional.cross_entropy(module(x), y)


def _vision(name: str, size: str) -> Workload:
    k = _VISION_PRESETS[name][size]
    module = VISION_BUILDERS[name](classes=k["classes"], width=k["width"])

    def make(b: int, device: torch.device, gen: torch.Generator) -> Batch:
        x = torch.randn(b, 3, k["image"], k["image"], generator=gen)
        y = torch.randint(0, k["classes"], (b,), generator=gen)
        return x, y

    return Workload(name, size, module, k, make, _ce)


def _nlp(name: str, size: str) -> Workload:
    import transformers

    transformers.logging.set_verbosity_error()
    k = _NLP_PRESETS[name][size]
    module: nn.Module
    if name == "bert_base":
        cfg = transformers.BertConfig(
            vocab_size=k["vocab"],
            hidden_size=k["hidden"],
            num_hidden_layers=k["layers"],
            num_attention_heads=k["heads"],
            intermediate_size=4 * k["hidden"],
            max_position_embeddings=max(512, k["seq"]),
        )
        module = transformers.BertForMaskedLM(cfg)
    else:
        xcfg = transformers.XLMConfig(
            vocab_size=k["vocab"],
            emb_dim=k["hidden"],
            n_layers=k["layers"],
            n_heads=k["heads"],
            max_position_embeddings=max(512, k["seq"]),
        )
        module = transformers.XLMWithLMHeadModel(xcfg)

    def make(b: int, device: torch.device, gen: torch.Generator) -> Batch:
        ids = torch.randint(0, k["vocab"], (b, k["seq"]), generator=gen)
        labels = torch.randint(0, k["vocab"], (b, k["seq"]), generator=gen)
        return ids, labels

    def loss(m: nn.Module, batch: Batch) -> Tensor:
        ids, labels = batch
        out: Tensor = m(input_ids=ids, labels=labels).loss
        return out

    return Workload(name, size, module, k, make, loss)


class DLRM(nn.Module):
    """Embedding tables + bottom MLP over dense features, pairwise dot interaction, top MLP."""

    def __init__(
        self,
        tables: int,
        rows: int,
        dim: int,
        bottom: tuple[int, ...],
        top: tuple[int, ...],
        dense_features: int = 13,
    ) -> None:
        super().__init__()
        self.embeddings = nn.ModuleList(nn.Embedding(rows, dim) for _ in range(tables))
        self.bottom = _mlp((dense_features, *bottom, dim))
        n = tables + 1
        self.top = _mlp((dim + n * (n - 1) // 2, *top, 1), last_relu=False)
        idx = torch.triu_indices(n, n, offset=1)
        self.register_buffer("pairs", idx, persistent=False)

    def forward(self, dense: Tensor, sparse: Tensor) -> Tensor:
        x = self.bottom(dense)
        emb = [table(sparse[:, i]) for i, table in enumerate(self.embeddings)]
        feats = torch.stack([x, *emb], dim=1)  # (B, n, dim)
        inter = torch.bmm(feats, feats.transpose(1, 2))
        pairs: Tensor = self.pairs  # type: ignore[assignment]
        flat = inter[:, pairs[0], pairs[1]]
        out: Tensor = self.top(torch.cat([x, flat], dim=1)).squeeze(1)
        return out


def _mlp(sizes: tuple[int, ...], last_relu: bool = True) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def _dlrm(size: str) -> Workload:
    k = _DLRM_PRESETS[size]
    module = DLRM(k["tables"], k["rows"], k["dim"], k["bottom"], k["top"])

    def make(b: int, device: torch.device, gen: torch.Generator) -> Batch:
        dense = torch.randn(b, 13, generator=gen)
        sparse = torch.randint(0, k["rows"], (b, k["tables"]), generator=gen)
        clicks = torch.randint(0, 2, (b,), generator=gen).float()
        return dense, sparse, clicks

    def loss(m: nn.Module, batch: Batch) -> Tensor:
        dense, sparse, clicks = batch
        return nn.functional.binary_cross_entropy_with_logits(m(dense, sparse), clicks)

    return Workload("dlrm", size, module, k, make, loss)
