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
"""

from __future__ import annotations

from typing import Any

from srifty_core.workloads.references import Parts

SQUAD_SEQ = 384


def bert_base_squad(size: str = "full") -> Parts:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    if size == "full":
        cfg = transformers.BertConfig()  # bert-base-uncased: 12 x 768, 30522 tokens
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
