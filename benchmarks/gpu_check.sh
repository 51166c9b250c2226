#!/usr/bin/env bash
# GPU check (issues 19 and 53): profile ResNet-50 and hf:gpt2 on CUDA in fp32 and bf16 with 4
# probes and a dense sweep, then 1-GPU NCCL training runs of plans (the worker and the digits
# script, fp32 and bf16, each preempted and resumed) beside an FSDP2 check; see
# benchmarks/gpu_check.py. Run from the repo root with OUT set to the folder for the results
# (about 5 minutes on one H200 with --max-batch 512); PYTHON picks the interpreter (default
# python3).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${OUT:?set OUT to the folder for the results}"
PYTHONPATH=. PYTHONUNBUFFERED=1 "${PYTHON:-python3}" benchmarks/gpu_check.py --out "$OUT" "$@"
# where a step's kernel time goes by operator class, beside the roofline's split (issue 51;
# about a minute): benchmarks/gpu_op_split.py
PYTHONPATH=. PYTHONUNBUFFERED=1 "${PYTHON:-python3}" benchmarks/gpu_op_split.py --out "$OUT"
