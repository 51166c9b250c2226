"""Checkpoints go to any fsspec URI (memory:// here; s3:// with s3fs installed)."""

from __future__ import annotations

import torch
from torch import nn

from srifty_core.worker.checkpoint import load_checkpoint, save_checkpoint


def test_checkpoint_round_trips_through_an_fsspec_uri() -> None:
    import fsspec

    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    uri = "memory://srifty-test/run-1/checkpoint.pt"
    assert load_checkpoint(uri) is None
    save_checkpoint(uri, model=model, optimizer=opt, iteration=7, global_batch=32, config_id="c1")
    save_checkpoint(uri, model=model, optimizer=opt, iteration=8, global_batch=32, config_id="c1")
    ck = load_checkpoint(uri)
    assert ck is not None and ck.iteration == 8 and ck.samples == 256
    for k, v in model.state_dict().items():
        assert torch.equal(ck.model[k], v)
    fs = fsspec.filesystem("memory")
    assert sorted(fs.ls("/srifty-test/run-1", detail=False)) == [
        "/srifty-test/run-1/checkpoint.json",  # its summary (``checkpoint_iteration``)
        "/srifty-test/run-1/checkpoint.pt",
    ]
