"""Would counting attention as the fused kernel a GPU runs make the estimates better?

    .venv/bin/python benchmarks/investigations/fused_attention.py   # about 2 minutes

On a GPU, ``F.scaled_dot_product_attention`` (Hugging Face's default, ``sdpa``) runs as one
fused kernel (flash or memory-efficient attention), in fp32 too: the ``s x s`` scores and
their softmax never reach memory and are not saved for the backward pass. The census counts
on the meta device, where torch takes the math path: the scores, softmax and dropout mask
are operators of their own, each moving ``s^2`` bytes per head and sample, and are saved.

This script counts the censuses of the models whose attention is ``sdpa`` (the zoo's
``bert_base``, ``hf:gpt2``) with every such call replaced by torch's memory-efficient
attention operators (``aten._scaled_dot_product_efficient_attention`` and its backward,
which have meta kernels and FLOP counts), in a temporary data folder, and reruns
``benchmarks/spec_compute.py`` (leave-one-GPU-out on published rows) and
``benchmarks/gpu_check_estimate.py`` (the H200 profiles no fit saw) on them, beside the
same two benchmarks on the shipped censuses. The published ``bert_base_squad`` rows keep
their census: NVIDIA's BERT of 2020 computes its attention as separate kernels. Nothing
of the package changes; outputs go to a temporary folder.
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
RECOUNTED = ("bert_base",)
"""Shipped censuses counted again (``hf:gpt2`` has none shipped: it is counted anyway)."""


def fused_attention() -> Any:
    """The package's mode (``profiling.census_attention``), which ``bf16-true`` censuses
    count with: here applied to every census."""
    from srifty_core.profiling.census_attention import fused_attention as mode

    return mode()


def run(fused: bool, results: Path) -> str:
    """Both benchmarks' printed summaries, on the shipped censuses or the fused ones."""
    import gpu_check_estimate
    import spec_compute

    from srifty_core.profiling import census, census_count

    patches = contextlib.ExitStack()
    if fused:
        count = census_count.count

        def counted(*a: Any, **k: Any) -> Any:
            with fused_attention():
                return count(*a, **k)

        shipped = census.shipped_census_path

        def unshipped(model: str, size: str, settings: Any) -> Path:
            if model in RECOUNTED:
                return Path("/nonexistent") / "census.json"
            return shipped(model, size, settings)

        census.count = counted  # type: ignore[assignment]
        census.shipped_census_path = unshipped  # type: ignore[assignment]
        patches.callback(setattr, census, "count", count)
        patches.callback(setattr, census, "shipped_census_path", shipped)
    out = io.StringIO()
    with patches, tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(out):
        os.environ["SRIFTY_DATA_DIR"] = tmp
        copy = Path(tmp) / results.name
        shutil.copytree(results, copy)
        spec_compute.main(["--out", str(Path(tmp) / "spec_compute.json")])
        gpu_check_estimate.main([str(copy)])
    return out.getvalue()


def main() -> int:
    import gpu_check_estimate

    for fused in (False, True):
        text = run(fused, gpu_check_estimate.RESULTS)
        keep = [ln for ln in text.splitlines() if ln.startswith(("GPU ", "all", "V100", "A100",
                "H100", "H200", "A10 ", "overall")) or "[no_device]" in ln
                or ln.strip().startswith("memory")]  # fmt: skip
        print(f"== {'fused attention' if fused else 'shipped censuses (math path)'}")
        print("\n".join(keep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
