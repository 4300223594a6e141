"""The 401 circuit breaker: one 401 stops every call of the account, concurrent first calls send one
probe (never three failed logins), only changed credentials close it, stale clients stay refused."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import account, circuit, errors


class Counting:
    def __init__(self, status: int, body: Any = None) -> None:
        self.status = status
        self.body = body
        self.seen = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        await asyncio.sleep(0)  # let concurrent callers pile up behind the probe
        if self.body is None:
            return httpx.Response(self.status, text="Unauthorized")
        return httpx.Response(self.status, json=self.body)


SERVERS = [{"server": {"server_number": 1, "server_name": "a", "status": "ready"}}]


async def test_a_401_stops_every_later_call_without_sending(make_client: Any) -> None:
    handler = Counting(401)
    robot = make_client(handler)
    with pytest.raises(errors.RobotAuthError) as first:
        await robot.list_servers()
    assert not isinstance(first.value, errors.RobotCircuitOpen)
    for call in (robot.list_servers(), robot.get_reset(1), robot.ensure_key("k", "ssh-ed25519 AAAA x")):
        with pytest.raises(errors.RobotCircuitOpen):
            await call
    assert handler.seen == 1
    assert robot.account.circuit_open
    assert robot.account.circuit_reason is not None
    assert "401" in robot.account.circuit_reason


async def test_other_clients_of_the_same_account_are_stopped_too(make_client: Any) -> None:
    handler = Counting(401)
    first, second = make_client(handler), make_client(handler)
    assert first.account is second.account
    with pytest.raises(errors.RobotAuthError):
        await first.get_server(1)
    with pytest.raises(errors.RobotCircuitOpen):
        await second.get_server(1)
    assert handler.seen == 1


async def test_concurrent_first_calls_with_bad_credentials_send_one_request(make_client: Any) -> None:
    handler = Counting(401)
    robot = make_client(handler)
    results = await asyncio.gather(*(robot.get_server(n) for n in range(20)), return_exceptions=True)
    assert handler.seen == 1
    assert all(isinstance(r, errors.RobotAuthError) for r in results)
    assert sum(isinstance(r, errors.RobotCircuitOpen) for r in results) == 19


async def test_verified_credentials_run_concurrently(make_client: Any) -> None:
    in_flight = 0
    peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001)
        in_flight -= 1
        return httpx.Response(200, json={"server": {"server_number": 1, "status": "ready"}})

    robot = make_client(handler)
    await robot.get_server(1)  # the probe
    await asyncio.gather(*(robot.get_server(1) for _ in range(10)))
    assert peak > 1


async def test_only_changed_credentials_close_the_circuit(make_client: Any) -> None:
    bad = Counting(401)
    robot = make_client(bad, password="wrong")
    with pytest.raises(errors.RobotAuthError):
        await robot.list_servers()
    same = circuit.credentials_fingerprint("robot-user", "wrong")
    assert robot.account.reset_credentials(same) is False
    assert robot.account.circuit_open

    fixed = circuit.credentials_fingerprint("robot-user", "right")
    assert robot.account.reset_credentials(fixed) is True
    assert not robot.account.circuit_open
    # The old client still holds the wrong password: refused without a request.
    with pytest.raises(errors.RobotCircuitOpen, match="old ones"):
        await robot.list_servers()
    assert bad.seen == 1

    good = Counting(200, SERVERS)
    renewed = make_client(good, password="right")
    assert [s.server_number for s in await renewed.list_servers()] == [1]
    assert good.seen == 1


async def test_a_404_proves_the_credentials(make_client: Any) -> None:
    handler = Counting(404, {"error": {"status": 404, "code": "SERVER_NOT_FOUND", "message": "x"}})
    robot = make_client(handler)
    with pytest.raises(errors.RobotNotFound):
        await robot.get_server(1)
    assert not robot.account.circuit_open


async def test_circuit_state_is_exported(make_client: Any, prometheus: CollectorRegistry) -> None:
    robot = make_client(Counting(401))
    with pytest.raises(errors.RobotAuthError):
        await robot.list_servers()
    labels = {"account_hash": robot.account.account_hash}
    assert prometheus.get_sample_value("capi_gpu_robot_circuit_open", labels) == 1.0
    assert prometheus.get_sample_value("capi_gpu_robot_requests_total", {"family": "server", "outcome": "auth"}) == 1.0
    with pytest.raises(errors.RobotCircuitOpen):
        await robot.list_servers()
    circuit_open = {"family": "server", "outcome": "circuit_open"}
    assert prometheus.get_sample_value("capi_gpu_robot_requests_total", circuit_open) == 1.0


def test_accounts_are_separate_per_username() -> None:
    registry = account.AccountRegistry(prometheus=CollectorRegistry())
    alice, bob = registry.account("alice"), registry.account("bob")
    alice.circuit.trip("fp", "401")
    assert alice.circuit_open
    assert not bob.circuit_open
    assert registry.account("alice") is alice
