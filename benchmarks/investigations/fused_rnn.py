"""Recurrent layers counted as cuDNN runs them, against torch's per-timestep decomposition.

    .venv/bin/python benchmarks/investigations/fused_rnn.py  # about 10 s; prints only

The census of an LSTM language model (``tests/workload_fixtures/factories.py:lstm_lm``:
embedding, a 2-layer LSTM 64 wide, a 1,000-word decoder, 35 tokens a sample) counted two
ways: as the census counts it now (``profiling.census_rnn``: one fused operator a pass)
and with the fused operators switched off (each timestep's operators, as the meta device
decomposes them). Each is priced by the roofline fitted on the shipped evidence, on a V100
and an A100, at batch 20 and 256. No public LSTM measurement ships: this shows what the
count changes, not accuracy.
"""

from __future__ import annotations

import contextlib
import sys
import time

import numpy as np

from srifty_core.catalog import Catalog
from srifty_core.predictors import roofline as rl
from srifty_core.profiling import census_rnn, estimate
from srifty_core.profiling.census import CLASSES, OpCensus, take_census

MODEL = "tests/workload_fixtures/factories.py:lstm_lm"
GPUS = ("Tesla V100 SXM2 16GB", "A100 SXM4 80GB")


def matmul_flops(c: OpCensus, phase: int) -> float:
    ph, cls = np.array(c.phase), np.array(c.op_class)
    return float(np.array(c.flops1)[(ph == phase) & (cls == CLASSES.index("matmul"))].sum())


def main() -> int:
    t0 = time.perf_counter()
    catalog = Catalog.load()
    evidence, _ = estimate.evidence(catalog, store=None)
    eff = rl.fit(evidence)
    specs = estimate.device_specs(catalog)
    fused = take_census(MODEL, "full")
    saved = census_rnn.fused_rnns
    census_rnn.fused_rnns = contextlib.nullcontext  # type: ignore[assignment]
    try:
        eager = take_census(MODEL, "full")
    finally:
        census_rnn.fused_rnns = saved
    for name, c in (("fused (now)", fused), ("per timestep", eager)):
        print(
            f"{name:13s} {len(c.phase):5d} operators; matrix-product FLOPs a sample: forward "
            f"{matmul_flops(c, 0):.4g}, backward {matmul_flops(c, 1):.4g}; saved "
            f"{c.saved_bytes1 / 1e3:.0f} kB a sample"
        )
    for gpu in GPUS:
        for b in (20, 256):
            times = []
            for c in (fused, eager):
                fw, bw, opt = rl.pass_times(c, specs[gpu], "fp32", eff, b)
                launches = sum(
                    eff.launch_fw_s if p == 0 else eff.launch_bw_s for p in c.phase if p < 2
                )
                times.append((fw + bw + opt, launches / (fw + bw)))
            (tf, lf), (te, le) = times
            print(
                f"{gpu:22s} batch {b:3d}: step {tf * 1e3:7.2f} ms fused (launches {lf:.0%}) vs "
                f"{te * 1e3:7.2f} ms per timestep (launches {le:.0%})"
            )
    print(f"{time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
