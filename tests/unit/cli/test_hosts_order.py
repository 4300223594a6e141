"""`capi-gpu hosts order` against the Robot simulator: price first, dry run with test=true, refusal
without --yes-i-want-to-pay (exit 2, nothing sent to the order endpoint), a confirmed order, JSON
output, missing credentials or keys, an unknown location."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from capi_gpu.cli import hosts_order
from capi_gpu_sim.robot import RobotSim


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> Iterator[RobotSim]:
    with RobotSim(seed=17) as running:
        monkeypatch.setenv(hosts_order.USER_ENV, running.username)
        monkeypatch.setenv(hosts_order.PASSWORD_ENV, running.password)
        yield running


@pytest.fixture
def fingerprint(sim: RobotSim) -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    data = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    answer = httpx.post(f"{sim.url}/key", data={"name": "ops", "data": data}, auth=(sim.username, sim.password))
    return str(answer.json()["key"]["fingerprint"])


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="capi-gpu hosts")
    hosts_order.register_order(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["order", *argv])
    rc: int = args.func(args)
    return rc


def test_dry_run_prints_the_price_and_orders_nothing(
    sim: RobotSim, fingerprint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run("--product", "GEX131", "--location", "fsn1", "--authorized-key", fingerprint, "--dry-run",
             "--robot-url", sim.url)  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0
    assert "€1497.30" in out
    assert "€2.3995" in out
    assert "€1499.00" in out
    assert "dry run" in out
    (order,) = [e for e in sim.log if e.path == "/order/server/transaction"]
    assert order.status == 201
    with sim.locked():
        assert sim.commerce.transactions == {}
    paths = [e.path for e in sim.log]
    assert paths == ["/key", "/order/server/product/GEX131", "/order/server/transaction"]  # the price first


def test_a_real_order_without_confirmation_is_refused(
    sim: RobotSim, fingerprint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run("--product", "GEX131", "--location", "NBG1", "--authorized-key", fingerprint, "--robot-url", sim.url)
    captured = capsys.readouterr()
    assert rc == 2
    assert "€1497.30" in captured.out
    assert "--yes-i-want-to-pay" in captured.err
    assert sim.count("POST", "/order/") == 0


def test_a_confirmed_order_is_placed_and_reported_as_json(
    sim: RobotSim, fingerprint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = run("--product", "GEX131", "--location", "NBG1", "--authorized-key", fingerprint, "--yes-i-want-to-pay",
             "--robot-url", sim.url, "-o", "json")  # fmt: skip
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["price"] == {
        "currency": "EUR",
        "monthly_net": "1497.30",
        "monthly_gross": "1781.79",
        "hourly_net": "2.3995",
        "setup_net": "1499.00",
        "setup_gross": "1783.81",
    }
    assert doc["dry_run"] is False
    assert doc["transaction"]["status"] == "in process"
    with sim.locked():
        assert list(sim.commerce.transactions) == [doc["transaction"]["id"]]


def test_usage_errors(
    sim: RobotSim, fingerprint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert run("--product", "GEX131", "--location", "FSN1", "--dry-run", "--robot-url", sim.url) == 2
    assert "--authorized-key" in capsys.readouterr().err
    assert run("--product", "GEX131", "--location", "HEL1", "--authorized-key", fingerprint, "--dry-run",
               "--robot-url", sim.url) == 2  # fmt: skip
    assert "offered: FSN1, NBG1" in capsys.readouterr().err
    assert run("--product", "GEX999", "--location", "FSN1", "--authorized-key", fingerprint, "--dry-run",
               "--robot-url", sim.url) == 3  # fmt: skip
    assert "NOT_FOUND" in capsys.readouterr().err
    monkeypatch.delenv(hosts_order.PASSWORD_ENV)
    assert run("--product", "GEX131", "--location", "FSN1", "--authorized-key", fingerprint, "--dry-run") == 2
    assert hosts_order.PASSWORD_ENV in capsys.readouterr().err
