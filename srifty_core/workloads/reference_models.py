"""Networks of published benchmarks that the zoo does not have, as model factories
(``srifty_core.profiling.reference_models:NAME``: the reference keeps that module path, a
re-export of this one, because a profile's and the shipped census's key digests the
reference's text), so their operator census can be taken like any model's
(``profiling.census``) and their published throughput scored
(``benchmarks/spec_compute.py``).

``bert_base_squad``: BERT-base uncased fine-tuned on SQuAD v1.1 as NVIDIA's
DeepLearningExamples ``run_squad.py`` runs it (the model of Lambda's ``bert_base_squad``
rows): ``BertForQuestionAnswering`` at sequence length 384, the loss the mean of the start
and end positions' cross-entropies. Random weights; the batch is random token ids.
``bert_large_squad`` is the same program with BERT-large (24 x 1024, 16 heads).

``resnext101_32x4d``: NVIDIA's ResNeXt101-32x4d (DeepLearningExamples' ConvNets): the
zoo's ResNet with bottleneck blocks [3, 4, 23, 3] of 32 groups of width 4
(``workloads.vision``), on 224 x 224 images of 1,000 classes, cross-entropy loss.

``gpt2_from_scratch``: the GPT-2-small-shaped decoder of Raschka's *LLMs from scratch*
training-speed baseline (``workloads.gpt_from_scratch``), next-token cross-entropy over
1,024 tokens; ``gpt2_torch_layers`` the same with torch's LayerNorm and GELU (the chapter's
section 6), ``gpt2_sdpa`` also with ``scaled_dot_product_attention`` (section 7).

The published rows of all but BERT-base are held out of every fit
(``benchmarks/held_out_public.py``).
"""

from __future__ import annotations

from typing import Any

from srifty_core.workloads.references import Parts

SQUAD_SEQ = 384


def bert_base_squad(size: str = "full") -> Parts:
    return _bert_squad(size, large=False)


def bert_large_squad(size: str = "full") -> Parts:
    return _bert_squad(size, large=True)


def _bert_squad(size: str, *, large: bool) -> Parts:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if size == "full":
        cfg = transformers.BertConfig()  # bert-base-uncased: 12 x 768, 30522 tokens
        if large:  # bert-large-uncased
            cfg = transformers.BertConfig(
                hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                intermediate_size=4096,
            )  # fmt: skip
        seq = SQUAD_SEQ
    else:  # a CPU-sized stand-in with the same structure
        cfg = transformers.BertConfig(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256
        )
        seq = 32
    module = transformers.BertForQuestionAnswering(cfg)

    def make_batch(b: int, gen: Any) -> tuple[Any, ...]:
        ids = torch.randint(0, cfg.vocab_size, (b, seq), generator=gen)
        start = torch.randint(0, seq, (b,), generator=gen)
        end = torch.randint(0, seq, (b,), generator=gen)
        return ids, start, end

    def loss(m: Any, batch: tuple[Any, ...]) -> Any:
        ids, start, end = batch
        return m(input_ids=ids, start_positions=start, end_positions=end).loss

    return Parts(module, make_batch, loss)


IMAGE_CLASSES = 1000


def resnext101_32x4d(size: str = "full") -> Parts:
    import torch

    from srifty_core.workloads.vision import resnext101_32x4d as network

    side = 224 if size == "full" else 32  # "small": a CPU-sized stand-in, same network
    module = network(IMAGE_CLASSES)

    def make_batch(b: int, gen: Any) -> tuple[Any, ...]:
        x = torch.randn(b, 3, side, side, generator=gen)
        return x, torch.randint(0, IMAGE_CLASSES, (b,), generator=gen)

    def loss(m: Any, batch: tuple[Any, ...]) -> Any:
        x, y = batch
        return torch.nn.functional.cross_entropy(m(x), y)

    return Parts(module, make_batch, loss)


def gpt2_from_scratch(size: str = "full") -> Parts:
    return _gpt2(size, "scratch")


def gpt2_torch_layers(size: str = "full") -> Parts:
    return _gpt2(size, "torch")


def gpt2_sdpa(size: str = "full") -> Parts:
    return _gpt2(size, "sdpa")


def _gpt2(size: str, ops: str) -> Parts:
    import torch

    from srifty_core.workloads.gpt_from_scratch import CONTEXT, VOCAB, GPTFromScratch

    if size == "full":
        vocab, seq = VOCAB, CONTEXT
        module = GPTFromScratch(ops=ops)
    else:  # a CPU-sized stand-in with the same structure
        vocab, seq = 512, 32
        module = GPTFromScratch(vocab=vocab, context=seq, width=64, heads=2, layers=2, ops=ops)

    def make_batch(b: int, gen: Any) -> tuple[Any, ...]:
        ids = torch.randint(0, vocab, (b, seq + 1), generator=gen)
        return ids[:, :-1], ids[:, 1:]

    def loss(m: Any, batch: tuple[Any, ...]) -> Any:
        ids, targets = batch
        return torch.nn.functional.cross_entropy(m(ids).flatten(0, 1), targets.flatten())

    return Parts(module, make_batch, loss)
