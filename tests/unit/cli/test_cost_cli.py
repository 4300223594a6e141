"""`capi-gpu cost` with given utilization: the seed's command prints €7.41 and €1.22, the default table
(16/50/100 %, Oct 2026 prices with their date, the caveat, break-evens, the seed check), JSON shape,
price and cloud overrides, and usage errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import cli


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli.main(["cost", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def doc(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    rc, out, err = run(capsys, *argv, "-o", "json")
    assert rc == 0, err
    return json.loads(out)


def row(out: str, label: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(label))
    return line[len(label) :].split()


def test_the_seeds_command_prints_7_41_and_1_22(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "--monthly", "889", "--setup", "0", "--used-hours", "120", "--used-hours", "730")
    assert rc == 0
    assert row(out, "leased: per used GPU-hour") == ["€7.41", "€1.22"]
    assert row(out, "used GPU-hours a month") == ["120", "730"]
    assert "€1.4247/h" in out  # 889 / 624
    assert "given on the command line" in out
    one = doc(capsys, "--monthly", "889", "--setup", "0", "--used-hours", "120")
    assert round(one["scenarios"][0]["leased"]["per_used_gpu_hour"], 2) == 7.41
    assert round(one["per_hour_held"], 2) == 1.22


def test_default_table_is_the_october_2026_price_at_16_50_100_percent(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys)
    assert rc == 0
    assert "€1,497.30/month, €2.3995/h, €1,499.00 setup" in out
    assert "2026-10-08" in out
    assert row(out, "utilization") == ["16%", "50%", "100%"]
    assert row(out, "leased: per used GPU-hour") == ["€13.89", "€4.44", "€2.22"]
    assert row(out, "leased: per used slice-hour") == ["€3.47", "€1.11", "€0.56"]
    assert row(out, "hourly billing: per used GPU-hour") == ["€15.24", "€6.51", "€4.10"]
    assert "seed check: €889/month = €1.22/h at 730 h, €7.41/h at 120 h used" in out
    assert "new order, a new setup fee, a 10-12 workday delivery" in out
    assert "Scaleway H100-1-80G: EUR 2.87/h billed per minute" in out and "above 77.4% utilization" in out
    assert "Cloud Run L4 (4 vCPU, 16 GiB): USD 1.05/h" in out and "above 61.7% utilization" in out
    assert "1.1669 USD per EUR (2026-06-15" in out


def test_json_carries_prices_dates_terms_and_every_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    d = doc(capsys, "--utilization", "0.25", "--term-months", "24")
    assert d["price"] == {"product": "GEX131", "monthly": 1497.3, "hourly": 2.3995, "setup": 1499.0,
                          "as_of": "2026-10-08", "source": d["price"]["source"]}  # fmt: skip
    assert d["terms"]["term_months"] == 24 and d["utilization_source"] == "given" and d["measured"] is None
    (s,) = d["scenarios"]
    assert s["used_gpu_hours"] == 182.5
    assert s["leased"]["month"] == round(1497.30 + 1499 / 24, 2)
    assert s["leased"]["per_used_gpu_hour"] == pytest.approx((1497.30 + 1499 / 24) / 182.5, abs=1e-4)
    assert [c["name"] for c in s["cloud"]] == [c["name"] for c in d["cloud"]]
    assert [c["currency"] for c in d["cloud"]] == ["EUR", "USD"]
    assert d["seed_check"] == {"monthly": 889.0, "per_hour_730": 1.22, "per_used_hour_120": 7.41}
    assert "cancelled" in d["caveat"]


def test_overrides_for_hourly_fx_and_cloud(capsys: pytest.CaptureFixture[str]) -> None:
    d = doc(capsys, "--monthly", "1000", "--utilization", "1", "--usd-per-eur", "1.25", "--fx-date", "2026-10-01",
            "--cloud", "Test L4,1.25,usd,1/4", "--cloud", "Test H100,3,EUR,1")  # fmt: skip
    assert d["price"]["hourly"] == round(1000 / 624, 4)  # --monthly without --hourly: Hetzner's rule
    assert d["price"]["setup"] == 1499.0  # not given: the default
    assert d["fx"] == {"usd_per_eur": 1.25, "as_of": "2026-10-01", "source": "command line"}
    l4, h100 = d["cloud"]
    assert (l4["hourly_eur"], l4["gpu_fraction"]) == (1.0, 0.25)
    assert d["scenarios"][0]["cloud"][0]["per_used_gpu_hour"] == 4.0
    assert h100["break_even_utilization"] == pytest.approx((1000 + 1499 / 12) / (730 * 3), abs=1e-4)
    assert doc(capsys, "--hourly", "3")["price"]["hourly"] == 3.0


@pytest.mark.parametrize(
    "argv",
    [
        ["--utilization", "1.5"],
        ["--used-hours", "800"],
        ["--term-months", "0"],
        ["--monthly", "-5"],
        ["--cloud", "only,two"],
        ["--cloud", "x,1,GBP,1"],
        ["--cloud", "x,1,EUR,1/0"],
        ["--usd-per-eur", "0"],
        ["--gpu", "no-such-gpu"],
        ["--measured", "--utilization", "0.5"],
        ["--measured", "--window", "soon"],
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], tmp_path: Path) -> None:
    rc, out, err = run(capsys, *argv, "--kubeconfig", str(tmp_path / "none"))
    assert rc == 2, (out, err)
    assert err.startswith("error: ")


def test_measured_without_a_kubeconfig_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, _, err = run(capsys, "--measured", "--kubeconfig", str(tmp_path / "none"))
    assert rc == 2 and "kubeconfig" in err


def test_standby_hosts_show_what_they_cost_while_idle(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 9: the report shows what the standby pool costs while idle (leased month, setup amortised)."""
    from capi_gpu.cli import main

    assert main(["cost", "--standby-hosts", "2", "--utilization", "0.5", "-o", "json"]) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert doc["standby"]["hosts"] == 2
    assert doc["standby"]["idle_per_month"] == pytest.approx(2 * 1622.22, abs=0.02)
