"""Which submodules FSDP shards and gathers as one unit: the one wrapping policy, applied
by the trainer (``fully_shard`` on each unit, then on the root) and counted for the memory
model (``sharding.memory.ModelMemory.unit_parameters``).

Contract: ``shard_units(module)`` is the list of units in forward order. A model built of
repeated blocks (a ``ModuleList`` or ``Sequential`` of two or more children of one class,
as transformers and ResNet stages are) has those blocks as units, the list holding the
most parameters chosen; any other model has its parameter-holding children as units. What
no unit holds (embeddings, a final norm, a head) stays with the root, as does a unit whose
parameters are tied to ones outside it (FSDP2 shards a parameter in one group only).
"""

from __future__ import annotations

from torch import nn


def _trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _block_lists(module: nn.Module) -> list[nn.Module]:
    """Every ``ModuleList``/``Sequential`` below ``module`` whose children are two or more
    modules of one class."""
    out: list[nn.Module] = []
    for sub in module.modules():
        if isinstance(sub, nn.ModuleList | nn.Sequential):
            kids = list(sub.children())
            if len(kids) >= 2 and len({type(k) for k in kids}) == 1:
                out.append(sub)
    return out


def _untied(module: nn.Module, units: list[nn.Module]) -> list[nn.Module]:
    """``units`` less those holding a parameter that is also used outside them (weights
    tied across units, as a language model's decoder with its embeddings): FSDP2 shards a
    parameter in one group only, so such a unit's parameters stay with the root."""
    uses: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        uses[id(p)] = uses.get(id(p), 0) + 1
    out = []
    for unit in units:
        inside: dict[int, int] = {}
        for _, p in unit.named_parameters(remove_duplicate=False):
            inside[id(p)] = inside.get(id(p), 0) + 1
        if all(uses[i] == n for i, n in inside.items()):
            out.append(unit)
    return out


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The units of ``module`` (module doc), in forward order; never the root itself, nor
    a unit whose parameters are tied to ones outside it (those stay with the root)."""
    lists = _block_lists(module)
    if lists:
        best = max(lists, key=_trainable)
        if _trainable(best) > 0:
            return _untied(module, [k for k in best.children() if _trainable(k) > 0])
    return _untied(module, [k for k in module.children() if _trainable(k) > 0])


def unit_parameters(module: nn.Module) -> tuple[int, ...]:
    """Trainable parameters of the root's own (those in no unit) first, then of each unit:
    ``ModelMemory.unit_parameters``."""
    units = [_trainable(u) for u in shard_units(module)]
    return (_trainable(module) - sum(units), *units)
