"""Does DDP reduce its buckets one at a time, in order? Per-bucket timing of real DDP.

The simulator's default schedule (``Simulator(schedule="ddp")``) sends the gradient
buckets in their order on one communication stream: a bucket starts when it is ready and
the one before it has ended. The method's event model instead runs every ready bucket at
once under a shared bandwidth cap (``schedule="concurrent"``). This benchmark times what
DDP does: two gloo ranks (1 thread each) train a zoo model with a comm hook that wraps the
default allreduce and notes, per bucket, when DDP handed it over (``ready``) and when its
allreduce completed (``done``, a callback on the future).

Per model it reports, over the timed iterations of rank 0:

- ``in_order``: share of iterations whose buckets complete in the order they were issued;
- ``max_in_flight``: the most buckets handed over and not yet done at one moment (1 means
  strictly one after the other, as on a single stream);
- ``serial_fit``: the sum of each bucket's service time (done minus the later of its
  ready time and the previous bucket's done) over the span from the first ready to the
  last done; 1 when the stream never idles between buckets, under 1 where it waits for
  the backward pass.
- ``service / alone``: each bucket's service time over the same allreduce timed alone
  afterwards. On one stream a bucket's service is its whole transfer (about 1, more where
  the backward pass competes for the cores); concurrent transfers would overlap, and a
  bucket's service counted from the previous one's end would come out well under 1.

Run:  .venv/bin/python benchmarks/investigations/ddp_buckets.py
      [--iterations 10] [--cases dlrm:32,...]
Writes benchmarks/results/ddp_buckets.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

OUT = Path(__file__).resolve().parent.parent / "results"
CASES = {"resnet18": 32, "dlrm": 32, "alexnet": 16, "bert_base": 4}


def _timed_allreduce(state, bucket):  # type: ignore[no-untyped-def]  # DDP reads annotations
    """Default allreduce (average), noting when the bucket was handed over and done."""
    buf = bucket.buffer()
    entry = {"index": bucket.index(), "bytes": buf.numel() * buf.element_size()}
    entry["ready"] = time.perf_counter()
    state.append(entry)
    fut = dist.all_reduce(buf.div_(dist.get_world_size()), async_op=True).get_future()

    def done(f):  # type: ignore[no-untyped-def]
        entry["done"] = time.perf_counter()
        return f.value()[0]

    return fut.then(done)


def _worker(
    rank: int, world: int, port: int, name: str, batch: int, iterations: int, out_dir: str
) -> None:
    from srifty_core.workloads.zoo import build

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        w = build(name, "small", seed=0)
        w.module.train()
        ddp = nn.parallel.DistributedDataParallel(w.module)
        log: list[dict[str, Any]] = []
        ddp.register_comm_hook(log, _timed_allreduce)
        w.module = ddp
        data = w.make_batch(batch, torch.device("cpu"), seed=rank)
        iters = []
        for i in range(iterations + 3):
            log.clear()
            ddp.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            w.loss(data).backward()
            t1 = time.perf_counter()
            if i >= 3:  # DDP rebuilds its buckets after the first iterations
                iters.append({"start": t0, "backward_end": t1, "buckets": [dict(e) for e in log]})
        # each bucket's size alone, the way the probes measure it
        alone = []
        for e in iters[-1]["buckets"]:
            buf = torch.ones(max(1, e["bytes"] // 4))
            ts = []
            for _ in range(5):
                dist.barrier()
                t = time.perf_counter()
                dist.all_reduce(buf)
                ts.append(time.perf_counter() - t)
            alone.append(statistics.median(ts[1:]))
        if rank == 0:
            with open(os.path.join(out_dir, "buckets.json"), "w") as fh:
                json.dump({"iterations": iters, "alone": alone}, fh)
    finally:
        dist.destroy_process_group()


def analyse(iters: list[dict[str, Any]], alone: list[float]) -> dict[str, Any]:
    in_order = 0
    ratios: list[float] = []
    in_flight = []
    fits = []
    for it in iters:
        bs = it["buckets"]
        if not bs:
            continue
        done = [b["done"] for b in bs]
        in_order += int(done == sorted(done))
        events = sorted([(b["ready"], 1) for b in bs] + [(b["done"], -1) for b in bs])
        level = peak = 0
        for _, d in events:
            level += d
            peak = max(peak, level)
        in_flight.append(peak)
        prev = bs[0]["ready"]
        busy = 0.0
        for j, b in enumerate(bs):
            service = b["done"] - max(b["ready"], prev)
            busy += service
            if j < len(alone) and alone[j] > 0:
                ratios.append(service / alone[j])
            prev = b["done"]
        span = max(done) - bs[0]["ready"]
        fits.append(busy / span if span > 0 else 1.0)
    n = len(iters)
    return {
        "iterations": n,
        "buckets": len(iters[0]["buckets"]) if iters else 0,
        "in_order": in_order / n if n else float("nan"),
        "max_in_flight": max(in_flight) if in_flight else 0,
        "median_in_flight": statistics.median(in_flight) if in_flight else 0,
        "serial_fit": statistics.median(fits) if fits else float("nan"),
        "service_over_alone_median": statistics.median(ratios) if ratios else float("nan"),
        "service_over_alone_min": min(ratios) if ratios else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument(
        "--cases",
        type=lambda v: {c.split(":")[0]: int(c.split(":")[1]) for c in v.split(",")},
        default=CASES,
        help="model:batch per rank, comma separated",
    )
    parser.add_argument("--out", type=Path, default=OUT / "ddp_buckets.json")
    args = parser.parse_args()
    import torch.multiprocessing as mp

    from srifty_core.lifetime import free_port

    report = {}
    for name, batch in args.cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                _worker,
                args=(2, free_port(), name, batch, args.iterations, tmp),
                nprocs=2,
                start_method="spawn",
            )
            got = json.loads(Path(tmp, "buckets.json").read_text())
        report[name] = {"batch_per_rank": batch, **analyse(got["iterations"], got["alone"])}
        r = report[name]
        print(
            f"{name:10s} {r['buckets']} buckets: complete in issue order in "
            f"{100 * r['in_order']:.0f}% of iterations, at most {r['max_in_flight']} in "
            f"flight (median {r['median_in_flight']}), serial fit {r['serial_fit']:.2f}, "
            f"service / alone median {r['service_over_alone_median']:.2f} "
            f"(min {r['service_over_alone_min']:.2f})",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
