"""The account-wide GET /server cache: one list call per TTL for any number of hosts, single flight
under concurrency, write-through on rename, misses cost one GET per TTL, stale data served while the
budget defers; and ensure_key costing one lookup per process."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from capi_gpu.hetzner import budget, errors, robot

HOSTS = 1000
# An ed25519 public key and its MD5 fingerprint as printed by `ssh-keygen -l -E md5`.
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDRoHfqEF1sLOxZJdKy4WAehTmRA+5knWM8yjj7uS4x0 vector"
FINGERPRINT = "b3:0a:f7:78:1d:7d:96:70:d5:c8:0a:dd:23:72:ca:ee"


class Fleet:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.keys: set[str] = set()

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        self.calls.append(f"{request.method} {request.url.path}")
        await asyncio.sleep(0)
        path = request.url.path
        if path == "/server":
            servers = [
                {"server": {"server_number": n, "server_name": f"h{n}", "status": "ready"}} for n in range(HOSTS)
            ]
            return httpx.Response(200, json=servers)
        if path.startswith("/server/"):
            number = int(path.rsplit("/", 1)[1])
            if request.method == "POST":
                name = request.content.decode().split("=", 1)[1]
                return httpx.Response(200, json={"server": {"server_number": number, "server_name": name}})
            if number == 5000:  # delivered after the last list call
                return httpx.Response(200, json={"server": {"server_number": number, "status": "in process"}})
            return httpx.Response(404, json={"error": {"status": 404, "code": "SERVER_NOT_FOUND", "message": "x"}})
        if path.startswith("/key/"):
            if path.removeprefix("/key/") in self.keys:
                return httpx.Response(200, json={"key": {"name": "k", "fingerprint": path.removeprefix("/key/")}})
            return httpx.Response(404, json={"error": {"status": 404, "code": "NOT_FOUND", "message": "x"}})
        if path == "/key":
            self.keys.add(FINGERPRINT)
            return httpx.Response(201, json={"key": {"name": "k", "fingerprint": FINGERPRINT}})
        raise AssertionError(path)


async def test_a_thousand_hosts_cost_one_list_call_per_ttl(make_client: Any, clock: Any) -> None:
    fleet = Fleet()
    client = make_client(fleet, server_ttl_s=60)
    found = await asyncio.gather(*(client.cached_server(n) for n in range(HOSTS)))
    assert [s.server_number for s in found] == list(range(HOSTS))
    assert fleet.calls == ["GET /server"]
    clock.advance(59)
    await client.cached_server(7)
    assert fleet.calls == ["GET /server"]
    clock.advance(1)
    await asyncio.gather(*(client.cached_server(n) for n in range(HOSTS)))
    assert fleet.calls == ["GET /server", "GET /server"]


async def test_clients_of_one_account_share_the_cache(make_client: Any) -> None:
    fleet = Fleet()
    first, second = make_client(fleet), make_client(fleet)
    await first.cached_server(1)
    await second.cached_server(2)
    assert fleet.calls == ["GET /server"]


async def test_rename_writes_through(make_client: Any) -> None:
    fleet = Fleet()
    client = make_client(fleet)
    await client.cached_server(3)
    await client.rename_server(3, "gpu-3")
    assert (await client.cached_server(3)).server_name == "gpu-3"
    assert fleet.calls == ["GET /server", "POST /server/3"]


async def test_a_miss_costs_one_get_per_ttl(make_client: Any, clock: Any) -> None:
    fleet = Fleet()
    client = make_client(fleet)
    assert (await client.cached_server(5000)).server_number == 5000  # newly delivered
    await client.cached_server(5000)
    for _ in range(3):
        with pytest.raises(errors.RobotNotFound):
            await client.cached_server(4242)
    assert fleet.calls == ["GET /server", "GET /server/5000", "GET /server/4242"]
    clock.advance(60)
    with pytest.raises(errors.RobotNotFound):
        await client.cached_server(4242)
    assert fleet.calls[-2:] == ["GET /server", "GET /server/4242"]


async def test_stale_list_is_served_while_the_budget_defers(make_client: Any, clock: Any) -> None:
    fleet = Fleet()
    client = make_client(fleet, limits={budget.Family.SERVER: budget.Limit(1, 3600)})
    await client.cached_server(1)
    clock.advance(120)
    assert (await client.cached_server(2)).server_number == 2
    assert fleet.calls == ["GET /server"]
    clock.advance(client.account.servers.max_stale_s)
    with pytest.raises(errors.RobotBudgetDeferred):
        await client.cached_server(2)


async def test_ensure_key_uploads_once_and_then_costs_nothing(make_client: Any) -> None:
    fleet = Fleet()
    client = make_client(fleet)
    assert robot.md5_fingerprint(PUBLIC_KEY) == FINGERPRINT
    assert await client.ensure_key("fleet", PUBLIC_KEY) == FINGERPRINT
    assert await client.ensure_key("fleet", PUBLIC_KEY) == FINGERPRINT
    assert fleet.calls == [f"GET /key/{FINGERPRINT}", "POST /key"]


async def test_concurrent_ensure_key_is_single_flight(make_client: Any) -> None:
    fleet = Fleet()
    client = make_client(fleet)
    results = await asyncio.gather(*(client.ensure_key("fleet", PUBLIC_KEY) for _ in range(100)))
    assert set(results) == {FINGERPRINT}
    assert fleet.calls == [f"GET /key/{FINGERPRINT}", "POST /key"]


def test_fingerprint_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="OpenSSH"):
        robot.md5_fingerprint("not a key")
