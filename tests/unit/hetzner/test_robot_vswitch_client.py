"""Robot client, vSwitch endpoints against the simulator over real HTTP: create/list/get/update/cancel and
add/remove members (``server[]`` arrays, DELETE with a form body), the asynchronous processing status, each
documented error in its retry class (VSWITCH_IN_PROCESS requeues, limits and VLAN clashes are terminal
conflicts, VSWITCH_NOT_AVAILABLE and NOT_FOUND terminal not-founds), and the account budget's vswitch
families (500/h reads, 100/h writes shared by every write endpoint) deferring before Robot says 403."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import account, budget, errors, models, robot
from capi_gpu_sim.robot import RobotSim

Status = models.VSwitchServerStatus


async def no_sleep(_: float) -> None:
    return None


@pytest.fixture
def sim() -> Iterator[RobotSim]:
    with RobotSim(seed=17) as running:
        running.add_server(321)
        running.add_server(322, vswitch_capable=False)
        running.add_server(323)
        yield running


def client_for(sim: RobotSim, limits: dict[budget.Family, budget.Limit] | None = None) -> robot.RobotClient:
    return robot.RobotClient(
        sim.username,
        sim.password,
        base_url=sim.url,
        registry=account.AccountRegistry(prometheus=CollectorRegistry()),
        limits=limits,
        sleep=no_sleep,
    )


@pytest.fixture
async def client(sim: RobotSim) -> AsyncIterator[robot.RobotClient]:
    async with client_for(sim) as opened:
        yield opened


def settle(sim: RobotSim) -> None:
    sim.clock.advance(sim.vswitches.delay_s)
    assert sim.wait_idle()


def members(vswitch: models.VSwitch) -> dict[int | None, Status]:
    return {s.server_number: s.status for s in vswitch.server}


@pytest.mark.parametrize("protocol", [robot.RobotAPI, robot.RobotVSwitchAPI])
def test_the_client_has_every_operation_of_the_protocols(protocol: type) -> None:
    operations = [name for name in vars(protocol) if not name.startswith("_")]
    assert {"get_vswitch", "add_vswitch_servers", "remove_vswitch_servers"} <= set(operations)
    assert [name for name in operations if not callable(getattr(robot.RobotClient, name, None))] == (
        ["account"] if protocol is robot.RobotAPI else []  # a property, not a method
    )


async def test_a_vswitch_lives_through_create_join_leave_and_cancel(sim: RobotSim, client: robot.RobotClient) -> None:
    created = await client.create_vswitch("gpu-net", 4000)
    assert (created.name, created.vlan, created.cancelled, created.server) == ("gpu-net", 4000, False, [])
    assert [v.id for v in await client.list_vswitches()] == [created.id]

    await client.add_vswitch_servers(created.id, [321, 323])
    joining = await client.get_vswitch(created.id)
    assert members(joining) == {321: Status.PROCESSING, 323: Status.PROCESSING}
    assert joining.busy
    assert joining.member(321) is not None
    assert joining.member(999) is None
    settle(sim)
    joined = await client.get_vswitch(created.id)
    assert members(joined) == {321: Status.READY, 323: Status.READY}
    assert not joined.busy

    await client.update_vswitch(created.id, name="renamed", vlan=4001)
    await client.remove_vswitch_servers(created.id, [321])
    assert members(await client.get_vswitch(created.id)) == {321: Status.PROCESSING, 323: Status.READY}
    settle(sim)
    left = await client.get_vswitch(created.id)
    assert (left.name, left.vlan, members(left)) == ("renamed", 4001, {323: Status.READY})

    await client.cancel_vswitch(created.id)
    assert (await client.get_vswitch(created.id)).cancelled
    writes = [e for e in sim.log if e.endpoint and e.endpoint.startswith(("POST /vswitch", "DELETE /vswitch"))]
    assert [e.status for e in writes] == [201, 201, 200, 200, 200]


async def test_a_change_while_a_member_is_processing_is_a_requeue(sim: RobotSim, client: robot.RobotClient) -> None:
    vswitch = await client.create_vswitch("gpu-net", 4000)
    await client.add_vswitch_servers(vswitch.id, [321])
    with pytest.raises(errors.RobotRequeue) as caught:
        await client.add_vswitch_servers(vswitch.id, [323])
    assert caught.value.code == "VSWITCH_IN_PROCESS"
    assert errors.requeue_delay(caught.value) == errors.DEFAULT_REQUEUE_S
    assert sim.count("POST", f"/vswitch/{vswitch.id}/server") == 2  # a requeue is not retried in place


async def test_a_failed_join_parses_as_failed(sim: RobotSim, client: robot.RobotClient) -> None:
    sim.set_faults(vswitch_fail=[323])
    vswitch = await client.create_vswitch("gpu-net", 4000)
    await client.add_vswitch_servers(vswitch.id, [323])
    settle(sim)
    assert members(await client.get_vswitch(vswitch.id)) == {323: Status.FAILED}


@pytest.mark.parametrize(
    ("setup", "action", "error", "code"),
    [
        ("one", "create_4000", errors.RobotConflict, "VSWITCH_VLAN_NOT_UNIQUE"),
        ("full_account", "create_4001", errors.RobotConflict, "VSWITCH_LIMIT_REACHED"),
        ("one", "add_322", errors.RobotNotFound, "VSWITCH_NOT_AVAILABLE"),
        ("one", "get_missing", errors.RobotNotFound, "NOT_FOUND"),
        ("five_for_321", "add_321_to_sixth", errors.RobotConflict, "VSWITCH_PER_SERVER_LIMIT_REACHED"),
        ("hundred", "add_one_more", errors.RobotConflict, "VSWITCH_SERVER_LIMIT_REACHED"),
        ("one", "create_vlan_4092", errors.RobotTerminalError, "INVALID_INPUT"),
    ],
)
async def test_each_documented_refusal_lands_in_its_class(
    sim: RobotSim, client: robot.RobotClient, setup: str, action: str, error: type[errors.RobotError], code: str
) -> None:
    first = await client.create_vswitch("first", 4000)
    if setup == "full_account":
        sim.vswitches.account_limit = 1
    others: list[int] = []
    if setup == "five_for_321":
        others = [(await client.create_vswitch(f"n{i}", 4001 + i)).id for i in range(5)]
        for vid in [first.id, *others[:4]]:
            await client.add_vswitch_servers(vid, [321])
    extra = 0
    if setup == "hundred":
        numbers = [sim.add_server() for _ in range(101)]
        await client.add_vswitch_servers(first.id, numbers[:100])
        settle(sim)
        extra = numbers[100]
    calls = {
        "create_4000": lambda: client.create_vswitch("dup", 4000),
        "create_4001": lambda: client.create_vswitch("two", 4001),
        "create_vlan_4092": lambda: client.create_vswitch("bad", 4092),
        "add_322": lambda: client.add_vswitch_servers(first.id, [322]),
        "get_missing": lambda: client.get_vswitch(1),
        "add_321_to_sixth": lambda: client.add_vswitch_servers(others[-1], [321]),
        "add_one_more": lambda: client.add_vswitch_servers(first.id, [extra]),
    }
    with pytest.raises(error) as caught:
        await calls[action]()
    assert caught.value.code == code
    assert errors.requeue_delay(caught.value) is None  # terminal: only a human or a new spec helps


async def test_vswitch_writes_defer_in_our_budget_before_robot_refuses(sim: RobotSim) -> None:
    tight = {budget.Family.VSWITCH_WRITE: budget.Limit(3, 3600)}
    async with client_for(sim, limits=tight) as client:
        vswitch = await client.create_vswitch("gpu-net", 4000)
        await client.add_vswitch_servers(vswitch.id, [321])
        settle(sim)
        await client.remove_vswitch_servers(vswitch.id, [321])  # add, remove and create share one bucket
        with pytest.raises(errors.RobotBudgetDeferred) as deferred:
            await client.update_vswitch(vswitch.id, name="x", vlan=4000)
        assert deferred.value.family == "vswitch_write"
        assert deferred.value.retry_after > 0
        await client.get_vswitch(vswitch.id)  # reads are their own family
        assert client.account.budget.remaining(budget.Family.VSWITCH_READ) == 499
    assert [e.path for e in sim.log if e.method == "POST"] == ["/vswitch", f"/vswitch/{vswitch.id}/server"]


async def test_the_documented_limits_are_the_vswitch_families() -> None:
    assert budget.DEFAULT_LIMITS[budget.Family.VSWITCH_READ] == budget.Limit(500, budget.HOUR)
    assert budget.DEFAULT_LIMITS[budget.Family.VSWITCH_WRITE] == budget.Limit(100, budget.HOUR)
