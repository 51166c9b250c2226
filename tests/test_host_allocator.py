"""host_allocator.steady: a training-like step stops zero-faulting its large blocks."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the thresholds are glibc's",
)

# DLRM-like: 26 dense embedding gradients of 1.25 MiB allocated and freed every step, with a
# larger block freed before them (what moves glibc's dynamic threshold around)
STEP = """
import resource, torch
from srifty_core import host_allocator
applied = host_allocator.steady()
torch.set_num_threads(1)  # as each CPU rank runs
def step():
    grads = [torch.zeros(10000, 32) for _ in range(26)]
    big = torch.zeros(4_000_000)
    del big
    return grads
for _ in range(5):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _run(code: str, env_value: str | None) -> tuple[bool, float]:
    env = dict(os.environ)
    env.pop("SRIFTY_STEADY_MALLOC", None)
    if env_value is not None:
        env["SRIFTY_STEADY_MALLOC"] = env_value
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    return out[0] == "True", float(out[1])


@glibc
def test_steady_heap_reuses_large_blocks_without_page_faults() -> None:
    applied, faults = _run(STEP, None)
    assert applied
    # 26 x 1.25 MiB zero-faulted would be about 8,000 faults per step (what the default
    # allocator paid in some processes and not others: the reason for host_allocator)
    assert faults < 100


# where a 30 MiB block comes from: glibc's default serves it with its own mmap (munmapped
# when freed, zero-faulted again next time); steady() keeps it on the reusable heap
BLOCK = """
import ctypes
from srifty_core import host_allocator
applied = host_allocator.steady()
libc = ctypes.CDLL("libc.so.6")
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
before = libc.mallinfo2().hblks
block = libc.malloc(30 * 2**20)
print(applied, libc.mallinfo2().hblks - before)
libc.free(block)
"""


@glibc
@pytest.mark.parametrize(("setting", "mmapped"), [(None, 0), ("0", 1)])
def test_a_large_block_comes_from_the_heap_only_when_steady(
    setting: str | None, mmapped: int
) -> None:
    applied, blocks = _run(BLOCK, setting)
    assert applied is (setting is None)
    assert blocks == mmapped


def test_steady_is_idempotent_and_reports_the_same() -> None:
    from srifty_core import host_allocator

    assert host_allocator.steady() == host_allocator.steady()


def test_a_setting_that_is_neither_on_nor_off_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from srifty_core import host_allocator
    from srifty_core.errors import ConfigError

    monkeypatch.setattr(host_allocator, "_applied", None)
    monkeypatch.setenv("SRIFTY_STEADY_MALLOC", "maybe")
    with pytest.raises(ConfigError, match="SRIFTY_STEADY_MALLOC='maybe'"):
        host_allocator.steady()
