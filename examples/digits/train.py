"""Your own training script under a Srifty plan: the digits classifier of ``model.py``.

    srifty train plan.json -- python examples/digits/train.py --lr 0.1

Every rank runs this file. ``srifty_core.worker.user`` gives it its share of the plan
(local batch, loss scale, which samples), reports each step to the monitor and
checkpoints, so a preempted job resumes here, on other VMs, where it stopped. At the end
rank 0 prints the accuracy on the whole data set and writes it to the run folder
(``result.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # model.py beside this file

from model import DigitNet, digits, loss

from srifty_core.worker import user as srifty


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)

    device = srifty.init()
    torch.manual_seed(srifty.plan().seed)  # the same initial weights on every rank
    net = DigitNet(args.width).to(device, dtype)
    model = srifty.wrap(net)  # DDP, or FSDP2's shards under an fsdp/hsdp plan
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)  # after wrap
    start = srifty.load_checkpoint(model, opt)
    x, y = digits()
    x = x.to(dtype)
    for it in range(start, srifty.iterations()):
        idx = srifty.sample_indices(it, len(x))
        opt.zero_grad(set_to_none=True)
        batch = (x[idx].to(device), y[idx].to(device))
        with srifty.autocast():  # the plan's precision: bf16 on GPUs if it says so
            scaled = loss(model, batch) * srifty.loss_scale()
        scaled.backward()
        opt.step()
        srifty.report(it + 1, scaled, model=model, optimizer=opt)
    with torch.no_grad():  # on every rank: a sharded model's forward gathers its shards
        accuracy = (net(x.to(device)).argmax(1).cpu() == y).float().mean().item()
        full_loss = loss(net, (x.to(device), y.to(device))).item()
    if srifty.rank() == 0:
        result = {"iterations": srifty.iterations(), "accuracy": accuracy, "loss": full_loss}
        Path(srifty.plan().run_dir, "result.json").write_text(json.dumps(result) + "\n")
        print(
            f"digits: {srifty.iterations()} iterations, accuracy {accuracy:.3f}, loss "
            f"{full_loss:.4f}"
        )
    srifty.finish()


if __name__ == "__main__":
    main()
