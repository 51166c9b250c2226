from __future__ import annotations

import csv
import dataclasses
import json
from datetime import date
from pathlib import Path

import pytest

from srifty_core import paths
from srifty_core.catalog import (
    Catalog,
    Market,
    MissingPriceError,
    Price,
    PriceObservation,
    write_overlay,
)
from srifty_core.errors import UnknownNameError


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load(use_overlays=False)


def _csv(name: str) -> list[dict[str, str]]:
    with (paths.CATALOG_DIR / name).open(newline="") as fh:
        return list(csv.DictReader(fh))


def test_every_shipped_row_is_loaded(catalog: Catalog) -> None:
    rows = _csv("ec2_gpu_catalog.csv")
    assert len(catalog) == len(rows) == 72
    assert set(catalog.regions()) == {"us-east-1", "us-west-2"}
    for r in rows:
        t = catalog.get(r["instance_type"], r["region"])
        assert t.vcpus == int(r["vcpus"])
        assert t.gpus_per_vm == int(r["gpu_count"])
        assert t.ondemand is not None
        assert t.ondemand.usd_per_hour == float(r["ondemand_usd_hr"])
        assert t.gpu is not None and t.gpu.model == r["gpu_model"]


def test_g4dn_us_east_1_real_rows(catalog: Catalog) -> None:
    rows = catalog.select(family="g4dn", region="us-east-1")
    assert {t.name for t in rows} == {
        "g4dn.xlarge",
        "g4dn.2xlarge",
        "g4dn.4xlarge",
        "g4dn.8xlarge",
        "g4dn.12xlarge",
        "g4dn.16xlarge",
        "g4dn.metal",
    }
    x = catalog.get("g4dn.xlarge", "us-east-1")
    assert x.ondemand == Price(0.526, date(2025, 11, 30), "vantage")
    assert x.network_gbps == 5.0 and x.network_burst_gbps == 25.0
    assert x.gpu_model == "T4" and x.gpu_memory_gib == 16
    assert x.gpu is not None and x.gpu.fp32_tflops == 8.1 and not x.gpu.nvlink
    metal = catalog.get("g4dn.metal", "us-east-1")
    assert metal.gpus_per_vm == 8 and metal.total_gpu_memory_gib == 128


def test_zone_spot_prices_follow_the_newest_snapshot(catalog: Catalog) -> None:
    spot = _csv("ec2_spot_prices.csv")
    expected = {
        r["availability_zone_id"]: float(r["spot_usd_hr"])
        for r in spot
        if r["instance_type"] == "g4dn.xlarge"
        and r["region"] == "us-east-1"
        and r["source"].startswith("anycloud")
        and r["is_local_zone"] == "no"
        and r["spot_usd_hr"]
    }
    t = catalog.get("g4dn.xlarge", "us-east-1")
    assert {z: p.usd_per_hour for z, p in t.spot_zones} == expected
    zone, price = catalog.cheapest_spot("g4dn.xlarge", "us-east-1")
    assert price.usd_per_hour == min(expected.values())
    assert expected[zone] == price.usd_per_hour
    assert price.observed_on == date(2026, 4, 2)
    summary = t.spot_summary
    assert summary is not None and summary.n_zones == len(expected)
    assert summary.min_usd_per_hour <= summary.median_usd_per_hour <= summary.max_usd_per_hour


def test_p3_spot_comes_from_the_older_snapshot(catalog: Catalog) -> None:
    t = catalog.get("p3.2xlarge", "us-east-1")
    assert t.spot_zones, "p3 is only in the older snapshot"
    assert all(p.source == "skypilot_v7" for _, p in t.spot_zones)
    assert all(p.observed_on == date(2025, 5, 31) for _, p in t.spot_zones)


def test_local_zones_are_left_out(catalog: Catalog) -> None:
    local = {
        r["availability_zone_id"]
        for r in _csv("ec2_spot_prices.csv")
        if r["is_local_zone"] == "yes"
    }
    assert local
    for t in catalog.types:
        assert not local & set(t.spot_by_zone)


def test_price_lookup_by_market_and_zone(catalog: Catalog) -> None:
    od = catalog.price("g5.xlarge", "on-demand", "us-west-2")
    assert od.usd_per_hour == 1.006
    assert catalog.price("g5.xlarge", Market.ON_DEMAND, "us-west-2", zone="ignored") == od
    zone, cheapest = catalog.cheapest_spot("g5.xlarge", "us-west-2")
    assert catalog.price("g5.xlarge", "spot", "us-west-2", zone) == cheapest
    assert cheapest.usd_per_hour < od.usd_per_hour


def test_missing_price_is_reported_never_zero(catalog: Catalog) -> None:
    with pytest.raises(MissingPriceError, match=r"no spot price for g3\.4xlarge"):
        catalog.price("g3.4xlarge", "spot", "us-east-1", "use1-az1")
    with pytest.raises(MissingPriceError):
        catalog.cheapest_spot("g3.4xlarge", "us-east-1")
    with pytest.raises(MissingPriceError, match="pass a zone"):
        catalog.price("g4dn.xlarge", "spot", "us-east-1")
    assert catalog.get("g3.4xlarge", "us-east-1").spot_summary is None


def test_unknown_names_suggest_the_closest(catalog: Catalog) -> None:
    with pytest.raises(UnknownNameError) as err:
        catalog.get("g4dn.xlarg", "us-east-1")
    assert "g4dn.xlarge" in err.value.suggestions
    assert "unknown instance type 'g4dn.xlarg'" in str(err.value)
    with pytest.raises(UnknownNameError, match=r"unknown region 'us-east-2'.*us-east-1"):
        catalog.get("g4dn.xlarge", "us-east-2")
    with pytest.raises(UnknownNameError, match="unknown instance family 'g4'"):
        catalog.select(family="g4")
    with pytest.raises(UnknownNameError, match="unknown market 'reserved'"):
        catalog.price("g4dn.xlarge", "reserved", "us-east-1")
    with pytest.raises(UnknownNameError, match="unknown zone 'use1-az9'"):
        catalog.price("g4dn.xlarge", "spot", "us-east-1", "use1-az9")


def test_p5en_is_in_the_catalog_with_its_sources(catalog: Catalog) -> None:
    for region in ("us-east-1", "us-west-2"):
        t = catalog.get("p5en.48xlarge", region)
        assert (t.family, t.vcpus, t.gpus_per_vm, t.gpu_memory_gib) == ("p5en", 192, 8, 141.0)
        assert t.network_gbps == 3200.0 and t.efa_supported
        assert t.ondemand is not None and t.ondemand.usd_per_hour == 63.296
        assert t.gpu is not None and t.gpu.model == "H200" and t.gpu.memory_bw_gbs == 4800.0
    # zone spot prices from snapshot A; its Local Zone row is left out
    zones = catalog.get("p5en.48xlarge", "us-east-1").spot_by_zone
    assert sorted(zones) == ["use1-az2", "use1-az6"]
    assert zones["use1-az6"].usd_per_hour == 26.8943
    sources = (paths.SHIPPED_DATA_DIR / "SOURCES.md").read_text()
    assert "p5en.48xlarge" in sources and "ITKB_H200" in sources


def test_a_typo_of_a_type_is_one_line_naming_the_closest(catalog: Catalog) -> None:
    with pytest.raises(UnknownNameError) as err:
        catalog.get("p5en.48xlarg", "us-west-2")
    assert err.value.suggestions[0] == "p5en.48xlarge"
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("unknown instance type 'p5en.48xlarg'; did you mean")


def test_market_aliases() -> None:
    for text in ("on-demand", "ondemand", "ON_DEMAND", "od"):
        assert Market.parse(text) is Market.ON_DEMAND
    assert Market.parse("Spot") is Market.SPOT


def test_values_are_immutable(catalog: Catalog) -> None:
    t = catalog.get("g4dn.xlarge", "us-east-1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.vcpus = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="positive"):
        Price(0.0, date(2026, 1, 1), "test")


def test_price_age(catalog: Catalog) -> None:
    oldest, newest = catalog.price_dates()
    assert oldest == date(2025, 5, 31) and newest == date(2026, 4, 2)
    assert catalog.price_age_days(date(2026, 4, 12)) == (10, 316)


def test_overlay_merges_newer_prices_without_touching_shipped_files(
    catalog: Catalog, tmp_path: Path
) -> None:
    shipped_bytes = (paths.CATALOG_DIR / "ec2_spot_prices.csv").read_bytes()
    newer = date(2026, 11, 1)
    obs = [
        PriceObservation(
            "g4dn.xlarge", "us-east-1", Market.SPOT, "use1-az2", Price(0.11, newer, "ec2")
        ),
        PriceObservation(
            "g4dn.xlarge", "us-east-1", Market.ON_DEMAND, None, Price(0.5, newer, "ec2")
        ),
        # older than the shipped price: ignored
        PriceObservation(
            "g4dn.xlarge", "us-east-1", Market.SPOT, "use1-az1", Price(9.0, date(2020, 1, 1), "old")
        ),
        # a zone the shipped data lacks: added
        PriceObservation(
            "g3.4xlarge", "us-east-1", Market.SPOT, "use1-az3", Price(0.4, newer, "ec2")
        ),
    ]
    write_overlay(tmp_path / "prices" / "ec2.csv", obs)
    merged = Catalog.load(overlay_dir=tmp_path / "prices")
    assert merged.cheapest_spot("g4dn.xlarge", "us-east-1") == (
        "use1-az2",
        Price(0.11, newer, "ec2"),
    )
    assert merged.price("g4dn.xlarge", "on-demand", "us-east-1").usd_per_hour == 0.5
    assert merged.price("g4dn.xlarge", "spot", "us-east-1", "use1-az1") == catalog.price(
        "g4dn.xlarge", "spot", "us-east-1", "use1-az1"
    )
    assert merged.price("g3.4xlarge", "spot", "us-east-1", "use1-az3").usd_per_hour == 0.4
    assert merged.price_dates()[1] == newer
    # the original catalog and the shipped file are unchanged
    assert catalog.price("g4dn.xlarge", "on-demand", "us-east-1").usd_per_hour == 0.526
    assert (paths.CATALOG_DIR / "ec2_spot_prices.csv").read_bytes() == shipped_bytes


def test_overlay_dir_defaults_to_the_data_dir(data_dir: Path) -> None:
    obs = [
        PriceObservation(
            "p5.4xlarge", "us-west-2", Market.ON_DEMAND, None, Price(5.0, date(2026, 11, 2), "t")
        )
    ]
    write_overlay(paths.price_overlay_dir() / "x.csv", obs)
    assert Catalog.load().price("p5.4xlarge", "on-demand", "us-west-2").usd_per_hour == 5.0
    assert (
        Catalog.load(use_overlays=False).price("p5.4xlarge", "on-demand", "us-west-2").usd_per_hour
        == 6.88
    )


def test_bad_overlay_rows_name_the_column(tmp_path: Path) -> None:
    from srifty_core.catalog import read_overlay
    from srifty_core.errors import ConfigError

    bad = tmp_path / "bad.csv"
    bad.write_text(
        "instance_type,region,market,zone,usd_per_hour,observed_on,source\n"
        "g4dn.xlarge,us-east-1,spot,use1-az1,-1,2026-11-01,x\n"
    )
    with pytest.raises(ConfigError, match=r"bad.csv:2: bad usd_per_hour"):
        read_overlay(bad)
    bad.write_text("instance_type,region\n")
    with pytest.raises(ConfigError, match="missing column"):
        read_overlay(bad)
    unknown = tmp_path / "other" / "unknown.csv"
    write_overlay(
        unknown,
        [
            PriceObservation(
                "g9.huge", "us-east-1", Market.ON_DEMAND, None, Price(1.0, date(2026, 1, 1), "x")
            )
        ],
    )
    with pytest.raises(UnknownNameError, match=r"g9\.huge"):
        Catalog.load(overlay_dir=unknown.parent)


def test_to_dict_is_json(catalog: Catalog) -> None:
    d = json.loads(json.dumps(catalog.get("p4d.24xlarge", "us-east-1").to_dict()))
    assert d["gpus_per_vm"] == 8 and d["network_gbps"] == 400.0
    assert d["gpu"]["nvlink"] is True


HEAD = "instance_type,region,market,zone,usd_per_hour,observed_on,source\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # dated 2099, it won over every real price (issue 20)
        (HEAD + "g4dn.xlarge,us-east-1,on-demand,,0.01,2099-01-01,x\n",
         r"bad.csv:2: bad observed_on: 2099-01-01 is in the future \(today is 2026-06-01\)"),
        (HEAD + "g4dn.xlarge,us-east-1,on-demand,,inf,2026-01-01,x\n",
         r"bad.csv:2: bad usd_per_hour: price must be positive"),
        (HEAD + "g4dn.xlarge,us-east-1,on-demand,,nan,2026-01-01,x\n",
         r"bad.csv:2: bad usd_per_hour"),
        (HEAD + "g4dn.xlarge,us-east-1,on-demand\n", r"bad.csv:2: bad columns: 3 fields"),
        (HEAD + "g4dn.xlarge,us-east-1,on-demand,,1,2026-01-01,x,extra\n",
         r"bad.csv:2: bad columns"),
        (b"\xff\xfe\x00garbage\x00" * 10, r"bad.csv: not UTF-8 text"),
    ],
)  # fmt: skip
def test_a_bad_overlay_is_a_config_error_naming_file_and_line(
    tmp_path: Path, content: str | bytes, message: str
) -> None:
    from srifty_core.catalog import read_overlay
    from srifty_core.errors import ConfigError

    bad = tmp_path / "bad.csv"
    if isinstance(content, bytes):
        bad.write_bytes(content)
    else:
        bad.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_overlay(bad, today=date(2026, 6, 1))


def test_an_overlay_dated_today_or_tomorrow_is_read(tmp_path: Path) -> None:
    """Observations are dated in UTC; a clock a day ahead is still no error."""
    from srifty_core.catalog import read_overlay

    ok = tmp_path / "ok.csv"
    ok.write_text(HEAD + "g4dn.xlarge,us-east-1,on-demand,,0.5,2026-06-02,x\n")
    [obs] = read_overlay(ok, today=date(2026, 6, 1))
    assert obs.price.usd_per_hour == 0.5
