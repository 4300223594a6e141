"""Fixtures for the Robot client tests: published samples, a driven clock, clients on MockTransport."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import account, robot

SAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "hrobot"

Handler = Callable[[httpx.Request], httpx.Response]


def _load_sample(name: str) -> Any:
    return json.loads((SAMPLES / f"hrobot-{name}.json").read_text())


@pytest.fixture
def sample() -> Callable[[str], Any]:
    """Load a published Robot body from tests/fixtures/hrobot by its short name."""
    return _load_sample


class FakeClock:
    """Monotonic seconds that only move when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingSleep:
    """Stands in for asyncio.sleep: records the delays, advances the fake clock, returns at once."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        self.clock.advance(seconds)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def prometheus() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def registry(clock: FakeClock, prometheus: CollectorRegistry) -> account.AccountRegistry:
    return account.AccountRegistry(clock=clock, prometheus=prometheus)


@pytest.fixture
def sleep(clock: FakeClock) -> RecordingSleep:
    return RecordingSleep(clock)


ClientFactory = Callable[..., robot.RobotClient]


@pytest.fixture
async def make_client(registry: account.AccountRegistry, sleep: RecordingSleep) -> AsyncIterator[ClientFactory]:
    made: list[robot.RobotClient] = []

    def factory(handler: Handler, **kwargs: Any) -> robot.RobotClient:
        kwargs.setdefault("registry", registry)
        kwargs.setdefault("sleep", sleep)
        kwargs.setdefault("backoff", lambda attempt: 0.5 * 2 ** (attempt - 1))
        client = robot.RobotClient(
            kwargs.pop("username", "robot-user"),
            kwargs.pop("password", "s3cret-Passw0rd"),
            base_url="https://robot-ws.your-server.de",
            http_transport=httpx.MockTransport(handler),
            **kwargs,
        )
        made.append(client)
        return client

    yield factory
    for client in made:
        await client.aclose()
