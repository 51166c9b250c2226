"""GPU variants are device types of their own (issue 51, item 3): an instance type maps to
its exact variant, a CUDA device to the variant its memory says, an estimate reads that
variant's sheet, and a profile stored before variants were told apart still serves the
one it measured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from srifty_core.catalog import Catalog
from srifty_core.catalog.devices import device_type_of_name, gpu_device_type, model_of
from srifty_core.errors import ConfigError
from srifty_core.profiling.estimate import device_spec
from srifty_core.profiling.store import ProfileNotFoundError, ProfileStore
from srifty_core.simulator.types import SimInstance
from tests.profiling.test_profile_contract import make_profile


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def test_each_family_maps_to_its_exact_variant(catalog: Catalog) -> None:
    got = {t.family: t.device_type for t in catalog.types}
    assert got["p3"] == "V100-16GB" and got["p3dn"] == "V100-32GB"
    assert got["p4d"] == "A100-40GB" and got["p4de"] == "A100-80GB"
    # a model EC2 sells in one variant keeps its name (profiles keyed so stay valid)
    assert (got["p5"], got["p5en"], got["g4dn"], got["g5"], got["g6"]) == (
        "H100", "H200", "T4", "A10G", "L4",
    )  # fmt: skip
    p4de = SimInstance.from_catalog(catalog.get("p4de.24xlarge", "us-east-1"))
    assert p4de.device_type == "A100-80GB"
    assert p4de.features["gpu_model"] == "A100"  # the bandwidth model's feature is the model


def test_a_cuda_device_is_the_variant_its_memory_says() -> None:
    assert gpu_device_type("A100", 39.4) == "A100-40GB"  # what CUDA reports of 40 GB
    assert gpu_device_type("A100", 79.2) == "A100-80GB"
    assert device_type_of_name("NVIDIA A100-SXM4-80GB", 79.2) == "A100-80GB"
    assert device_type_of_name("Tesla V100-SXM2-32GB") == "V100-32GB"  # the name says
    assert device_type_of_name("Tesla V100-SXM2") is None  # a V100, but which?
    assert device_type_of_name("NVIDIA H100 80GB HBM3", 79.1) == "H100"
    assert device_type_of_name("NVIDIA GeForce RTX 4090", 23.6) is None
    assert device_type_of_name("NVIDIA H100 PCIe", 79.1) is None  # not p5's SXM module
    assert device_type_of_name("NVIDIA A100 80GB PCIe", 79.2) is None
    assert device_type_of_name("Tesla T4", 14.6) == "T4"  # a PCIe card EC2 sells
    assert model_of("A100-80GB") == "A100" and model_of("H100") is None


def test_an_estimate_reads_its_variants_sheet(catalog: Catalog, data_dir: Path) -> None:
    s40, s80 = device_spec(catalog, "A100-40GB"), device_spec(catalog, "A100-80GB")
    assert s40 is not None and s80 is not None
    assert (s40.memory_gib, s80.memory_gib) == (40, 80)
    assert s80.memory_bytes_per_s > s40.memory_bytes_per_s  # HBM2e, 2,039 GB/s
    assert s80.fp32_flops == s40.fp32_flops and s80.chip == s40.chip == "A100"
    assert device_spec(catalog, "A100") == s40  # a bare model: its smallest variant
    store = ProfileStore()
    p40 = store.load_or_estimate("resnet50", "full", "A100-40GB", catalog=catalog)
    p80 = store.load_or_estimate("resnet50", "full", "A100-80GB", catalog=catalog)
    assert (p40.device_type, p80.device_type) == ("A100-40GB", "A100-80GB")
    assert p80.b_max > p40.b_max  # twice the memory: a larger local batch fits
    b = min(p40.b_max, 64)
    assert float(p80.fw_fit.at(b)) <= float(p40.fw_fit.at(b))  # never slower


def test_a_profile_from_before_variants_serves_the_variant_it_measured(data_dir: Path) -> None:
    store = ProfileStore()
    old = make_profile(device_type="V100", device_name="Tesla V100-SXM2-16GB")
    store.save(old)
    got = store.load("resnet18", "small", "V100-16GB")
    assert got == dataclasses.replace(old, device_type="V100-16GB")
    with pytest.raises(ProfileNotFoundError):  # a 16 GB measurement is no 32 GB profile
        store.load("resnet18", "small", "V100-32GB")
    store.save(dataclasses.replace(old, device_name="V100 (p3.8xlarge, emulated)"))
    with pytest.raises(ConfigError, match=r"rename it to V100-16GB\.json") as err:
        store.load("resnet18", "small", "V100-16GB")
    assert "\n" not in str(err.value)
