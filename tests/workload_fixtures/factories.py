"""Model factories for the tests of ``srifty_core.workload``: good ones and each way a
user's factory can be wrong."""

from __future__ import annotations

import torch
from torch import nn

from srifty_core.workloads import Parts

NOT_CALLABLE = 42


def _batch(b: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(b, 8, generator=gen), torch.randint(0, 3, (b,), generator=gen)


def _loss(m: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    return nn.functional.cross_entropy(m(batch[0]), batch[1])


def good() -> Parts:
    return Parts(nn.Linear(8, 3), _batch, _loss)


def good_tuple() -> tuple[object, object, object]:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)), _batch, _loss


def sized(size: str = "small") -> dict[str, object]:
    width = {"tiny": 4, "small": 16, "full": 64}[size]
    return {
        "module": nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 3)),
        "make_batch": _batch,
        "loss": _loss,
    }


def raises() -> Parts:
    raise RuntimeError("no GPU driver found\nsecond line")


def wrong_type() -> int:
    return 7


def not_a_module() -> Parts:
    return Parts("linear", _batch, _loss)


def bad_batch() -> Parts:
    return Parts(nn.Linear(8, 3), lambda b, gen: torch.randn(b + 1, 8), _loss)


def bad_loss() -> Parts:
    return Parts(nn.Linear(8, 3), _batch, lambda m, batch: m(batch[0]))


def small_cnn(size: str = "small") -> dict[str, object]:
    """A convolution, batch norm and a linear head on 4-D images: what channels-last and
    ``torch.compile`` act on, at a fraction of a zoo network's compile time."""
    width = {"tiny": 4, "small": 8, "full": 16}[size]

    def batch(b: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randn(b, 3, 8, 8, generator=gen), torch.randint(0, 3, (b,), generator=gen)

    return {
        "module": nn.Sequential(
            nn.Conv2d(3, width, 3, padding=1),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(width, 3),
        ),
        "make_batch": batch,
        "loss": _loss,
    }


def sequence(size: str = "small", seq: int = 8) -> Parts:
    """A tiny token model whose samples are ``seq`` tokens long (``,seq=N`` reaches it)."""
    module = nn.Sequential(nn.Embedding(32, 4), nn.Flatten(), nn.Linear(4 * seq, 3))

    def make_batch(b: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(0, 32, (b, seq), generator=gen), torch.randint(
            0, 3, (b,), generator=gen
        )

    return Parts(module, make_batch, _loss)


def tokens(size: str = "small", seq: int = 8, vocab: int = 32) -> Parts:
    """A tiny token model of ``vocab`` entries over ``seq`` tokens (both options reach it)."""
    module = nn.Sequential(nn.Embedding(vocab, 4), nn.Flatten(), nn.Linear(4 * seq, 3))

    def make_batch(b: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(0, vocab, (b, seq), generator=gen)
        return ids, torch.randint(0, 3, (b,), generator=gen)

    return Parts(module, make_batch, _loss)


class _LstmLm(nn.Module):
    """A word-level LSTM language model (embedding, a 2-layer LSTM, a tied-size decoder),
    the shape of PyTorch's word_language_model example."""

    def __init__(self, vocab: int = 1000, width: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
        self.decode = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(self.embed(tokens))
        return self.decode(out)


LSTM_STEPS = 35


def lstm_lm() -> Parts:
    """An LSTM language model at 35 tokens a sample."""

    def batch(b: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, 1000, (b, LSTM_STEPS + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]

    def loss(m: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        logits = m(batch[0])
        flat = logits.reshape(-1, logits.size(-1))
        return nn.functional.cross_entropy(flat, batch[1].reshape(-1))

    return Parts(_LstmLm(), batch, loss)
