#!/usr/bin/env bash
# GPU check (issue 19, item 6): profile the zoo's full ResNet-50, BERT-base and VGG-16 on
# CUDA with 4 probes and a dense sweep; see benchmarks/gpu_check.py. Run from the repo root
# with OUT set to the folder for the results (about 4 minutes on one H200: the profiles, then a
# 1-GPU NCCL training run of a plan through the runtime worker); PYTHON picks the
# interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the results}"
PYTHONPATH=. PYTHONUNBUFFERED=1 "${PYTHON:-python3}" benchmarks/gpu_check.py --out "$OUT" "$@"
