"""Would counting attention as the fused kernel in 16-bit steps only (autocast bf16/fp16,
as ``bf16-true`` censuses already are) make the estimates better?

    .venv/bin/python benchmarks/investigations/fused_attention_16bit.py   # about a minute

On a GPU, ``F.scaled_dot_product_attention`` on bf16/fp16 inputs runs FlashAttention. The
shipped autocast estimates read the fp32 census, whose attention is torch's math path
(``profiling/census_attention.py`` says why only ``bf16-true`` counts it fused). Here the
autocast estimates read a census of their own (one for bf16 and fp16, as a ``bf16-true``
census is one of its own) counted with the fused kernel, in a temporary data folder; the
fp32 evidence the roofline learns from is untouched, so the fit is the same. Printed, the
shipped way and this way, in the same run:

* ``benchmarks/gpu_check_estimate.py``: the H200 profiles no fit saw, from specs (the
  bf16 ones are autocast; ``hf:gpt2`` calls SDPA). Its figures were read before (the
  fused-attention investigation), so this is a check, not held-out evidence.
* ``benchmarks/device_variants.py``: the public entry asked for every published single-GPU
  row (NVIDIA's BERT-base among them, whose program ran attention as separate kernels).

Nothing of the package changes; the results go to a temporary folder.
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


def run(fused: bool) -> str:
    """Both benchmarks' printed summaries, shipped or with 16-bit censuses counted fused."""
    import device_variants
    import gpu_check_estimate

    from srifty_core.profiling import census, estimate
    from srifty_core.profiling.census_attention import fused_attention
    from srifty_core.training_settings import TrainingSettings

    patches = contextlib.ExitStack()
    if fused:
        count, settings_of = census.count, estimate.census_settings

        def counted(model: str, size: str, settings: Any, *a: Any, **k: Any) -> Any:
            if settings.precision in ("bf16", "fp16"):
                with fused_attention():
                    return count(model, size, settings, *a, **k)
            return count(model, size, settings, *a, **k)

        def sixteen(settings: TrainingSettings) -> TrainingSettings:
            if settings.precision in ("bf16", "fp16"):
                return TrainingSettings(optimizer=settings.optimizer, precision="bf16")
            return settings_of(settings)

        census.count = counted  # type: ignore[assignment]
        estimate.census_settings = sixteen
        # the reference networks are this package's code: counted here, where the patch is,
        # not in the child process that counts a user's factory
        in_child = census.is_user_code
        census.is_user_code = lambda model: False  # type: ignore[assignment]
        patches.callback(setattr, census, "count", count)
        patches.callback(setattr, estimate, "census_settings", settings_of)
        patches.callback(setattr, census, "is_user_code", in_child)
    out = io.StringIO()
    with patches, tempfile.TemporaryDirectory() as tmp, contextlib.redirect_stdout(out):
        os.environ["SRIFTY_DATA_DIR"] = tmp
        copy = Path(tmp) / gpu_check_estimate.RESULTS.name
        shutil.copytree(gpu_check_estimate.RESULTS, copy)
        gpu_check_estimate.main([str(copy)])
        kept = device_variants.OUT
        device_variants.OUT = Path(tmp) / "device_variants.json"
        try:
            device_variants.main()
        finally:
            device_variants.OUT = kept
    return out.getvalue()


def main() -> int:
    for fused in (False, True):
        text = run(fused)
        keep = [
            ln
            for ln in text.splitlines()
            if "bf16 [as_shipped]" in ln
            or ln.startswith(("overall", "variant:", "model_only:"))
            or ln.strip().startswith("memory")
            or (" amp " in ln and "bert_base" in ln)
        ]
        print(f"== {'16-bit censuses with fused attention' if fused else 'shipped (math path)'}")
        print("\n".join(keep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
