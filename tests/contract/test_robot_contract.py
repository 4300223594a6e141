"""Robot client contract over real HTTP: the same tests run against the simulator (always) and against
real Robot when ROBOT_USER/ROBOT_PASSWORD are set. Writes on a real account need ROBOT_TEST_SERVER
(a server you may rescue and rename) and a reset also ROBOT_ALLOW_RESET=1. Then the client's handling
of the sim's documented refusals: 403 with interval, 401 circuit, 503, 5xx, and orders delivered."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import account, budget, circuit, errors, models, robot
from capi_gpu_sim.robot import RobotSim

REAL = bool(os.environ.get("ROBOT_USER") and os.environ.get("ROBOT_PASSWORD"))
REAL_WRITES = REAL and bool(os.environ.get("ROBOT_TEST_SERVER"))
REAL_RESET = REAL_WRITES and os.environ.get("ROBOT_ALLOW_RESET") == "1"


@dataclass
class Backend:
    name: str
    client: robot.RobotClient
    server_number: int
    sim: RobotSim | None


async def no_sleep(_: float) -> None:
    return None


@pytest.fixture
def sim() -> Iterator[RobotSim]:
    with RobotSim(seed=13) as running:
        running.add_server(321)
        running.add_server(322, reset_types=["sw", "hw", "man", "power", "power_long"])
        yield running


def sim_client(
    sim: RobotSim, *, password: str | None = None, limits: dict[budget.Family, budget.Limit] | None = None
) -> robot.RobotClient:
    return robot.RobotClient(
        sim.username,
        sim.password if password is None else password,
        base_url=sim.url,
        registry=account.AccountRegistry(prometheus=CollectorRegistry()),
        limits=limits,
        sleep=no_sleep,
    )


async def open_backend(name: str, sim: RobotSim) -> Backend:
    if name == "sim":
        return Backend(name, sim_client(sim), 321, sim)
    client = robot.RobotClient(
        os.environ["ROBOT_USER"],
        os.environ["ROBOT_PASSWORD"],
        base_url=os.environ.get("ROBOT_URL", "https://robot-ws.your-server.de"),
        registry=account.AccountRegistry(prometheus=CollectorRegistry()),
    )
    chosen = os.environ.get("ROBOT_TEST_SERVER")
    number = int(chosen) if chosen else (await client.list_servers())[0].server_number
    return Backend(name, client, number, None)


@pytest.fixture(params=["sim", "real"] if REAL else ["sim"])
async def backend(request: pytest.FixtureRequest, sim: RobotSim) -> AsyncIterator[Backend]:
    opened = await open_backend(request.param, sim)
    yield opened
    await opened.client.aclose()


@pytest.fixture(params=["sim", "real"] if REAL_WRITES else ["sim"])
async def writable(request: pytest.FixtureRequest, sim: RobotSim) -> AsyncIterator[Backend]:
    opened = await open_backend(request.param, sim)
    yield opened
    await opened.client.aclose()


@pytest.fixture(params=["sim", "real"] if REAL_RESET else ["sim"])
async def resettable(request: pytest.FixtureRequest, sim: RobotSim) -> AsyncIterator[Backend]:
    opened = await open_backend(request.param, sim)
    yield opened
    await opened.client.aclose()


def new_public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    openssh = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return openssh + " capi-gpu-contract"


# --- read-only: sim and real -------------------------------------------------------------------


async def test_servers_list_get_and_cache_agree(backend: Backend) -> None:
    servers = await backend.client.list_servers()
    assert backend.server_number in {s.server_number for s in servers}
    listed = next(s for s in servers if s.server_number == backend.server_number)
    single = await backend.client.get_server(backend.server_number)
    cached = await backend.client.cached_server(backend.server_number)
    assert single.server_name == listed.server_name == cached.server_name
    assert single.reset is not None  # capability flags only come with the single get
    assert listed.reset is None
    assert single.status in {models.ServerStatus.READY, models.ServerStatus.IN_PROCESS}


async def test_unknown_server_is_not_found(backend: Backend) -> None:
    with pytest.raises(errors.RobotNotFound) as caught:
        await backend.client.get_server(1)
    assert caught.value.code == "SERVER_NOT_FOUND"


async def test_reset_options_and_rescue_state(backend: Backend) -> None:
    options = await backend.client.get_reset(backend.server_number)
    assert options.supports(models.ResetType.HARDWARE)
    rescue = await backend.client.get_rescue(backend.server_number)
    assert rescue.server_number == backend.server_number
    assert isinstance(rescue.active, bool)


async def test_catalogue_and_account_lists_parse(backend: Backend) -> None:
    products = await backend.client.list_products()
    assert products
    assert all(p.prices for p in products)
    assert isinstance(await backend.client.list_keys(), list)
    assert isinstance(await backend.client.list_transactions(), list)
    assert isinstance(await backend.client.list_vswitches(), list)
    cancellation = await backend.client.get_cancellation(backend.server_number)
    assert cancellation.server_number == backend.server_number


# --- writes: sim, and real with ROBOT_TEST_SERVER ---------------------------------------------


async def test_key_ensure_and_rescue_round_trip(writable: Backend) -> None:
    client, number = writable.client, writable.server_number
    fingerprint = await client.ensure_key("capi-gpu-contract", new_public_key())
    assert (await client.get_key(fingerprint)).fingerprint == fingerprint
    rescue = await client.enable_rescue(number, [fingerprint])
    assert rescue.active
    assert rescue.password is not None
    assert fingerprint in rescue.authorized_fingerprints
    again = await client.enable_rescue(number, [fingerprint])  # an old activation is replaced
    assert again.active
    assert again.password is not None
    assert not (await client.disable_rescue(number)).active
    assert not (await client.get_rescue(number)).active
    if writable.sim is not None:
        assert again.host_key_fingerprints == [k.fingerprint for k in writable.sim.rescue_host_keys(number)]


async def test_rename_is_visible_through_the_cache(writable: Backend) -> None:
    client, number = writable.client, writable.server_number
    name = (await client.get_server(number)).server_name or "capi-gpu-contract"
    renamed = await client.rename_server(number, name)
    assert renamed.server_name == name
    assert (await client.cached_server(number)).server_name == name


async def test_a_reset_consumes_the_rescue_activation(resettable: Backend) -> None:
    client, number = resettable.client, resettable.server_number
    fingerprint = await client.ensure_key("capi-gpu-contract", new_public_key())
    await client.enable_rescue(number, [fingerprint])
    assert (await client.reset(number, models.ResetType.HARDWARE)).type == "hw"
    if resettable.sim is not None:
        assert resettable.sim.wait_idle()
    assert not (await client.get_rescue(number)).active


# --- the client against the sim's documented refusals ------------------------------------------


async def test_a_403_from_robot_freezes_the_family(sim: RobotSim) -> None:
    # Pretend our configured limit were wrong (60/h): the sim enforces the documented 50/h.
    async with sim_client(sim, limits={budget.Family.RESET_WRITE: budget.Limit(60, 3600)}) as client:
        for _ in range(50):
            await client.reset(322, models.ResetType.SOFTWARE)
        with pytest.raises(errors.RobotRateLimited) as limited:
            await client.reset(322, models.ResetType.SOFTWARE)
        assert (limited.value.max_requests, limited.value.interval) == (50, 3600)
        with pytest.raises(errors.RobotBudgetDeferred):
            await client.reset(322, models.ResetType.SOFTWARE)
        assert client.account.budget.limit(budget.Family.RESET_WRITE) == budget.Limit(50, 3600)
    assert sim.count("POST", "/reset/") == 51


async def test_wrong_credentials_cost_one_failed_login(sim: RobotSim) -> None:
    async with sim_client(sim, password="wrong") as client:
        with pytest.raises(errors.RobotAuthError):
            await client.list_servers()
        for _ in range(5):
            with pytest.raises(errors.RobotCircuitOpen):
                await client.get_server(321)
        assert client.account.reset_credentials(circuit.credentials_fingerprint(sim.username, sim.password))
    assert [e.code for e in sim.log] == ["UNAUTHORIZED"]
    async with sim_client(sim) as good:  # the IP is not blocked
        assert await good.list_servers()


async def test_maintenance_and_server_errors_are_retried_then_raised(sim: RobotSim) -> None:
    sim.set_faults(maintenance=True)
    async with sim_client(sim) as client:
        with pytest.raises(errors.RobotMaintenance):
            await client.list_servers()
        assert sim.count("GET", "/server") == 3
        sim.set_faults(maintenance=False, error_rate=1.0)
        with pytest.raises(errors.RobotTransientError) as failed:
            await client.get_server(321)
        assert failed.value.code == "INTERNAL_ERROR"
        sim.set_faults(error_rate=0.0)
        assert (await client.get_server(321)).server_number == 321


async def test_an_order_is_delivered_as_a_server(sim: RobotSim) -> None:
    async with sim_client(sim) as client:
        fingerprint = await client.ensure_key("ops", new_public_key())
        order = models.OrderRequest(product_id="GEX131", location="NBG1", authorized_keys=[fingerprint])
        dry = await client.order_server(order, test=True)
        assert dry.status is models.TransactionStatus.IN_PROCESS
        assert await client.list_transactions() == []
        placed = await client.order_server(order, test=False)
        assert placed.server_number is None
        sim.clock.advance(sim.commerce.delivery_delay_s + sim.commerce.handover_s)
        assert sim.wait_idle()
        ready = await client.get_transaction(placed.id)
        assert ready.status is models.TransactionStatus.READY
        assert ready.server_number is not None
        server = await client.cached_server(ready.server_number)
        assert server.dc.startswith("NBG1")
