"""Account budget: endpoint families, tokens that come back one window after use, retry_after,
share, and the property that a simulated hour of 1,000 hosts reconciling never exceeds any
documented endpoint limit (checked against an independent table, in every sliding window)."""

from __future__ import annotations

import asyncio
import bisect
import random
import re
from collections import defaultdict
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import account, budget, errors, models, robot

Family = budget.Family


@pytest.mark.parametrize(
    ("method", "path", "family"),
    [
        ("GET", "/server", Family.SERVER),
        ("GET", "/server/321", Family.SERVER),
        ("POST", "/server/321", Family.SERVER),
        ("GET", "/server/321/cancellation", Family.CANCELLATION),
        ("POST", "/server/321/cancellation", Family.CANCELLATION),
        ("GET", "/reset", Family.RESET_READ),
        ("GET", "/reset/321", Family.RESET_READ),
        ("POST", "/reset/321", Family.RESET_WRITE),
        ("GET", "/boot/321/rescue", Family.BOOT),
        ("POST", "/boot/321/rescue", Family.BOOT),
        ("DELETE", "/boot/321/rescue", Family.BOOT),
        ("GET", "/key", Family.KEY_READ),
        ("GET", "/key/aa:bb", Family.KEY_READ),
        ("POST", "/key", Family.KEY_WRITE),
        ("DELETE", "/key/aa:bb", Family.KEY_WRITE),
        ("GET", "/order/server/product", Family.ORDER_PRODUCT),
        ("GET", "/order/server/product/GEX131", Family.ORDER_PRODUCT),
        ("GET", "/order/server/transaction", Family.ORDER_READ),
        ("POST", "/order/server/transaction", Family.ORDER_WRITE),
        ("GET", "/vswitch", Family.VSWITCH_READ),
        ("GET", "/vswitch/4", Family.VSWITCH_READ),
        ("POST", "/vswitch", Family.VSWITCH_WRITE),
        ("POST", "/vswitch/4", Family.VSWITCH_WRITE),
        ("DELETE", "/vswitch/4", Family.VSWITCH_WRITE),
        ("POST", "/vswitch/4/server", Family.VSWITCH_WRITE),
        ("DELETE", "/vswitch/4/server", Family.VSWITCH_WRITE),
        ("GET", "/failover/1.2.3.4", Family.OTHER),
    ],
)
def test_every_endpoint_has_its_family(method: str, path: str, family: Family) -> None:
    assert budget.family_for(method, path) is family


def test_tokens_come_back_one_window_after_they_were_spent() -> None:
    bucket = budget.TokenBucket(budget.Limit(3, 100))
    assert [bucket.take(t) for t in (0, 10, 20, 30)] == [True, True, True, False]
    assert bucket.retry_after(30) == 70
    assert not bucket.take(99.9)
    assert bucket.take(100)
    assert bucket.remaining(100) == 0
    assert bucket.retry_after(100) == 10


def test_reserve_raises_deferred_with_the_wait(clock: Any) -> None:
    account_budget = budget.AccountBudget(clock=clock, limits={Family.RESET_WRITE: budget.Limit(2, 3600)})
    account_budget.reserve(Family.RESET_WRITE)
    clock.advance(600)
    account_budget.reserve(Family.RESET_WRITE)
    with pytest.raises(errors.RobotBudgetDeferred) as caught:
        account_budget.reserve(Family.RESET_WRITE)
    assert caught.value.retry_after == 3000
    assert account_budget.remaining(Family.SERVER) == 200


def test_share_scales_every_limit(clock: Any) -> None:
    half = budget.AccountBudget(clock=clock, share=0.5)
    assert half.limit(Family.RESET_WRITE) == budget.Limit(25, 3600)
    assert half.limit(Family.ORDER_WRITE) == budget.Limit(10, 86400)
    assert budget.AccountBudget(clock=clock, share=0.01).limit(Family.ORDER_WRITE).max_requests == 1
    with pytest.raises(ValueError, match="share"):
        budget.AccountBudget(clock=clock, share=1.5)


def test_remaining_is_exported_per_family_without_the_username(clock: Any) -> None:
    prometheus = CollectorRegistry()
    registry = account.AccountRegistry(clock=clock, prometheus=prometheus)
    acct = registry.account("secret-username")
    acct.budget.reserve(Family.RESET_WRITE)
    labels = {"account_hash": acct.account_hash, "family": "reset_write"}
    assert prometheus.get_sample_value("capi_gpu_robot_budget_remaining", labels) == 49
    clock.advance(3600)
    assert prometheus.get_sample_value("capi_gpu_robot_budget_remaining", labels) == 50
    exposition = "\n".join(str(m) for m in prometheus.collect())
    assert "secret-username" not in exposition
    assert acct.account_hash in exposition


# --- the property: 1,000 hosts for an hour --------------------------------------------------------

# Documented per-endpoint limits, written out independently of budget.DEFAULT_LIMITS.
DOCUMENTED: list[tuple[str, re.Pattern[str], int, float]] = [
    ("GET", re.compile(r"^/server$"), 200, 3600),
    ("GET", re.compile(r"^/server/\d+$"), 200, 3600),
    ("POST", re.compile(r"^/server/\d+$"), 200, 3600),
    ("GET", re.compile(r"^/server/\d+/cancellation$"), 200, 3600),
    ("GET", re.compile(r"^/reset/\d+$"), 500, 3600),
    ("POST", re.compile(r"^/reset/\d+$"), 50, 3600),
    ("GET", re.compile(r"^/boot/\d+/rescue$"), 500, 3600),
    ("POST", re.compile(r"^/boot/\d+/rescue$"), 500, 3600),
    ("DELETE", re.compile(r"^/boot/\d+/rescue$"), 500, 3600),
    ("GET", re.compile(r"^/key(/.+)?$"), 500, 3600),
    ("POST", re.compile(r"^/key$"), 200, 3600),
    ("POST", re.compile(r"^/vswitch/\d+/server$"), 100, 3600),
]

HOSTS = 1000
PUBLIC_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIH7Jb1xGz3mJQk0XcQZ2jv6r4nXvJ8g8Vt6bWm2rY5aB fleet"


class FakeRobot:
    """Answers every endpoint the fleet uses with a minimal valid body; records when each was hit."""

    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.hits: dict[tuple[str, str], list[float]] = defaultdict(list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        method, path = request.method, request.url.path
        for doc_method, pattern, _, _ in DOCUMENTED:
            if doc_method == method and pattern.match(path):
                self.hits[(method, pattern.pattern)].append(self.clock())
                break
        else:
            raise AssertionError(f"unexpected endpoint {method} {path}")
        number = int(path.split("/")[2]) if path.count("/") >= 2 and path.split("/")[2].isdigit() else 0
        server = {"server_number": number, "server_name": f"h{number}", "status": "ready"}
        bodies: dict[str, Any] = {
            "server": [{"server": {**server, "server_number": n}} for n in range(1, HOSTS + 1)]
            if path == "/server"
            else {"server": server},
            "reset": {"reset": {"server_number": number, "type": ["sw", "hw", "man"] if method == "GET" else "hw"}},
            "boot": {"rescue": {"server_number": number, "os": "linux", "active": method == "POST", "password": "x"}},
            "key": {"key": {"name": "fleet", "fingerprint": robot.md5_fingerprint(PUBLIC_KEY)}},
            "vswitch": None,
        }
        section = path.split("/")[1]
        if section == "server" and path.endswith("/cancellation"):
            cancellation = {"server_number": number, "cancelled": False}
            return httpx.Response(200, json={"cancellation": cancellation})
        if section == "key" and method == "GET":
            return httpx.Response(404, json={"error": {"status": 404, "code": "NOT_FOUND", "message": "x"}})
        body = bodies[section]
        return httpx.Response(201, json=body) if body is not None else httpx.Response(201)


async def reconcile(client: robot.RobotClient, host: int, phase: str) -> str:
    """One pass of a plausible host controller; returns the next phase."""
    await client.cached_server(host)
    if phase == "key":
        await client.ensure_key("fleet", PUBLIC_KEY)
        return "rescue"
    if phase == "rescue":
        await client.enable_rescue(host, [robot.md5_fingerprint(PUBLIC_KEY)])
        return "reset"
    if phase == "reset":
        if (await client.get_reset(host)).supports(models.ResetType.HARDWARE):
            await client.reset(host, models.ResetType.HARDWARE)
        return "verify"
    if phase == "verify":
        await client.get_rescue(host)
        return "rename"
    if phase == "rename":
        await client.rename_server(host, f"gpu-{host}")
        return "steady"
    if host % 97 == 0:
        await client.get_cancellation(host)
    if host % 89 == 0:
        await client.add_vswitch_servers(4000, [host])
    return "steady"


async def fleet_hour(rng: random.Random, tick_s: float, provisioning: float, share: float) -> FakeRobot:
    clock_now = [0.0]
    fake = FakeRobot(lambda: clock_now[0])
    registry = account.AccountRegistry(clock=lambda: clock_now[0], prometheus=CollectorRegistry())
    client = robot.RobotClient("fleet", "pw", registry=registry, share=share, http_transport=httpx.MockTransport(fake))
    phases = {h: ("key" if rng.random() < provisioning else "steady") for h in range(1, HOSTS + 1)}
    due = {h: rng.uniform(0, 60) for h in phases}
    deferred = 0
    try:
        while clock_now[0] < 3600:
            for host in [h for h, t in due.items() if t <= clock_now[0]]:
                try:
                    phases[host] = await reconcile(client, host, phases[host])
                    due[host] = clock_now[0] + 60 + rng.uniform(0, 5)
                except errors.RobotRequeue as exc:  # what the controller maps to TemporaryError(delay=...)
                    deferred += 1
                    due[host] = clock_now[0] + exc.retry_after
            clock_now[0] += tick_s
    finally:
        await client.aclose()
    assert deferred > 0, "the scenario never pressed against the budget"
    return fake


def peak_in_window(times: list[float], window: float) -> int:
    return max((bisect.bisect_left(times, t + window) - i for i, t in enumerate(times)), default=0)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    tick_s=st.floats(1.0, 20.0),
    provisioning=st.floats(0.2, 1.0),
    share=st.sampled_from([1.0, 0.5]),
)
def test_an_hour_of_a_thousand_hosts_stays_inside_every_limit(
    seed: int, tick_s: float, provisioning: float, share: float
) -> None:
    fake = asyncio.run(fleet_hour(random.Random(seed), tick_s, provisioning, share))
    pressed = False
    for method, pattern, limit, window in DOCUMENTED:
        times = sorted(fake.hits.get((method, pattern.pattern), []))
        peak = peak_in_window(times, window)
        assert peak <= limit * share, f"{method} {pattern.pattern}: {peak} in {window}s > {limit * share}"
        pressed = pressed or peak >= 0.9 * limit * share
    assert pressed, "no endpoint came near its limit; the property was not exercised"
    assert fake.hits[("POST", r"^/reset/\d+$")], "no reset was ever sent"


def test_a_token_counts_from_when_its_answer_arrived(clock: Any) -> None:
    account_budget = budget.AccountBudget(clock=clock, limits={Family.RESET_WRITE: budget.Limit(1, 3600)})
    taken_at = account_budget.reserve(Family.RESET_WRITE)
    clock.advance(30)  # the request sat in a queue: Robot may have counted it only now
    account_budget.settle(Family.RESET_WRITE, taken_at)
    clock.advance(3600 - 30)
    with pytest.raises(errors.RobotBudgetDeferred) as caught:
        account_budget.reserve(Family.RESET_WRITE)
    assert caught.value.retry_after == pytest.approx(30)
    clock.advance(30)
    account_budget.reserve(Family.RESET_WRITE)
