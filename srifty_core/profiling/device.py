"""The device a profile is taken on: a device spec checked against this machine
(``resolve_device``), its name as the catalog writes GPUs (``device_type_of``), and the
synchronisation that makes a host clock time its work (``sync_fn``).
"""

from __future__ import annotations

import platform
from collections.abc import Callable

import torch

from srifty_core.catalog.devices import device_type_of_name
from srifty_core.errors import ConfigError


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
    """(device type as the catalog names GPU variants, full device name): an
    ``A100-SXM4-80GB`` is ``A100-80GB`` (``catalog.devices``)."""
    if device.type == "cpu":
        return "cpu", platform.processor() or platform.machine() or "cpu"
    name = torch.cuda.get_device_name(device)
    memory_gib = torch.cuda.get_device_properties(device).total_memory / 2**30
    return device_type_of_name(name, memory_gib) or name.replace(" ", "_"), name


def sync_fn(device: torch.device) -> Callable[[], None]:
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None
