"""The device a profile is taken on: a device spec checked against this machine
(``resolve_device``), its name as the catalog writes GPUs (``device_type_of``), and the
synchronisation that makes a host clock time its work (``sync_fn``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable

import torch

from srifty_core.errors import ConfigError

GPU_MODELS = ("H100", "H200", "A100", "A10G", "L4", "T4", "V100", "M60", "K80")
"""GPU names as the catalog writes them; a CUDA device name is matched against these."""


def resolve_device(spec: str) -> torch.device:
    """``cpu``, ``cuda`` or ``cuda:N``; a device that is not there is an error."""
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {spec!r}: use cpu, cuda or cuda:N") from exc
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"device {spec!r} is not there: this machine has no CUDA device")
        index = device.index or 0
        if index >= torch.cuda.device_count():
            raise ConfigError(
                f"device {spec!r} is not there: {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", index)
    if device.type != "cpu":
        raise ConfigError(f"device type {device.type!r} is not supported: use cpu or cuda")
    return device


def device_type_of(device: torch.device) -> tuple[str, str]:
    """(device type as the catalog names GPUs, full device name)."""
    if device.type == "cpu":
        return "cpu", platform.processor() or platform.machine() or "cpu"
    name = torch.cuda.get_device_name(device)
    for model in GPU_MODELS:
        if model in name.upper().replace("TESLA ", ""):
            return model, name
    return name.replace(" ", "_"), name


def sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
