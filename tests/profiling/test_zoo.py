from __future__ import annotations

import pytest
import torch

from srifty_core.errors import UnknownNameError
from srifty_core.workloads import MODEL_NAMES
from srifty_core.workloads.zoo import build

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_trains_a_step_at_tiny_size(name: str) -> None:
    w = build(name, "tiny")
    batch = w.make_batch(2, CPU)
    loss = w.loss(batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in w.module.parameters() if p.requires_grad]
    assert grads and all(g is not None for g in grads)


def test_batches_are_synthetic_deterministic_and_sized() -> None:
    w = build("dlrm", "tiny")
    a, b = w.make_batch(3, CPU, seed=1), w.make_batch(3, CPU, seed=1)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert all(t.shape[0] == 3 for t in a)
    assert not torch.equal(w.make_batch(3, CPU, seed=2)[0], a[0])


# Parameter counts of the reference definitions (torchvision; Inception v3 without its
# auxiliary head; BERT-base masked LM from transformers): the full sizes are the real networks.
REFERENCE_PARAMETERS = {
    "resnet18": 11_689_512,
    "resnet50": 25_557_032,
    "alexnet": 61_100_840,
    "inception_v3": 23_834_568,
    "shufflenet_v2": 2_278_604,
    "bert_base": 109_514_298,
}


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMETERS))
def test_full_size_matches_the_reference_network(name: str) -> None:
    assert build(name, "full").n_parameters == REFERENCE_PARAMETERS[name]


def test_unknown_model_lists_the_zoo() -> None:
    with pytest.raises(UnknownNameError, match="did you mean 'resnet50'"):
        build("resnet05")
    with pytest.raises(UnknownNameError) as err:
        build("gpt-5")
    assert "resnet18" in str(err.value) and "dlrm" in str(err.value)
    with pytest.raises(UnknownNameError, match="unknown model size 'huge'"):
        build("resnet18", "huge")
