"""Robot simulator, vSwitches: unwrapped bodies, VLAN range and uniqueness, the account limit, asynchronous
membership (processing, then ready or failed; leaving, then gone) scaled by the clock, 409 VSWITCH_IN_PROCESS
for any change meanwhile, the 100-per-vSwitch and 5-per-server limits, VSWITCH_NOT_AVAILABLE, rename,
cancellation, the private link's members, and the documented hourly limits per endpoint."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from capi_gpu_sim.robot import RobotSim


@pytest.fixture
def sim() -> Iterator[RobotSim]:
    with RobotSim(seed=11) as running:
        running.add_server(321)
        running.add_server(322, vswitch_capable=False)
        running.add_server(323)
        yield running


@pytest.fixture
def http(sim: RobotSim) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, auth=(sim.username, sim.password)) as client:
        yield client


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def settle(sim: RobotSim) -> None:
    sim.clock.advance(sim.vswitches.delay_s)
    assert sim.wait_idle()


def create(http: httpx.Client, vlan: int = 4000, name: str = "gpu") -> int:
    created = http.post("/vswitch", data={"name": name, "vlan": str(vlan)})
    assert created.status_code == 201
    return int(created.json()["id"])


def statuses(http: httpx.Client, vid: int) -> dict[int, str]:
    return {s["server_number"]: s["status"] for s in http.get(f"/vswitch/{vid}").json()["server"]}


def test_create_is_unwrapped_and_vlans_are_checked(sim: RobotSim, http: httpx.Client) -> None:
    created = http.post("/vswitch", data={"name": "gpu", "vlan": "4000"})
    assert created.status_code == 201
    body = created.json()
    assert set(body) == {"id", "name", "vlan", "cancelled", "server", "subnet", "cloud_network"}
    assert code(http.post("/vswitch", data={"name": "dup", "vlan": "4000"})) == (409, "VSWITCH_VLAN_NOT_UNIQUE")
    for bad in ("3999", "4092", "12", "x"):
        refused = http.post("/vswitch", data={"name": "bad", "vlan": bad})
        assert refused.json()["error"]["invalid"] == ["vlan"], bad
    assert http.post("/vswitch", data={"vlan": "4001"}).json()["error"]["missing"] == ["name"]
    assert http.get("/vswitch").json() == [{"id": body["id"], "name": "gpu", "vlan": 4000, "cancelled": False}]
    assert code(http.get("/vswitch/1")) == (404, "NOT_FOUND")


def test_the_account_limit_is_vswitch_limit_reached(sim: RobotSim, http: httpx.Client) -> None:
    sim.vswitches.account_limit = 2
    create(http, 4000)
    create(http, 4001)
    assert code(http.post("/vswitch", data={"name": "third", "vlan": "4002"})) == (409, "VSWITCH_LIMIT_REACHED")


def test_a_join_is_processing_then_ready_and_the_vswitch_is_busy_meanwhile(sim: RobotSim, http: httpx.Client) -> None:
    vid = create(http)
    assert http.post(f"/vswitch/{vid}/server", data={"server[]": ["321"]}).status_code == 201
    assert statuses(http, vid) == {321: "processing"}
    assert sim.vswitches.ready_members(vid) == set()
    busy = {
        "add": http.post(f"/vswitch/{vid}/server", data={"server[]": ["323"]}),
        "remove": http.request("DELETE", f"/vswitch/{vid}/server", data={"server[]": ["321"]}),
        "rename": http.post(f"/vswitch/{vid}", data={"name": "x", "vlan": "4000"}),
        "cancel": http.request("DELETE", f"/vswitch/{vid}", data={"cancellation_date": "now"}),
    }
    assert {what: code(r) for what, r in busy.items()} == dict.fromkeys(busy, (409, "VSWITCH_IN_PROCESS"))
    sim.clock.advance(sim.vswitches.delay_s / 2)
    assert statuses(http, vid) == {321: "processing"}
    sim.clock.advance(sim.vswitches.delay_s / 2)
    assert sim.wait_idle()
    assert statuses(http, vid) == {321: "ready"}
    assert sim.vswitches.ready_members(vid) == {321}


def test_a_leave_is_processing_then_gone(sim: RobotSim, http: httpx.Client) -> None:
    vid = create(http)
    http.post(f"/vswitch/{vid}/server", data={"server[]": ["321", "323"]})
    settle(sim)
    assert http.request("DELETE", f"/vswitch/{vid}/server", data={"server[]": ["321"]}).status_code == 200
    assert statuses(http, vid) == {321: "processing", 323: "ready"}
    assert sim.vswitches.ready_members(vid) == {323}  # the port is being taken off the link
    settle(sim)
    assert statuses(http, vid) == {323: "ready"}


def test_membership_changes_that_contradict_the_state_are_conflicts(sim: RobotSim, http: httpx.Client) -> None:
    vid = create(http)
    http.post(f"/vswitch/{vid}/server", data={"server[]": ["321"]})
    settle(sim)
    assert code(http.post(f"/vswitch/{vid}/server", data={"server[]": ["321"]})) == (409, "CONFLICT")
    assert code(http.request("DELETE", f"/vswitch/{vid}/server", data={"server[]": ["323"]})) == (409, "CONFLICT")
    assert code(http.post(f"/vswitch/{vid}/server", data={"server[]": ["322"]})) == (404, "VSWITCH_NOT_AVAILABLE")
    assert code(http.post(f"/vswitch/{vid}/server", data={"server[]": ["999"]})) == (404, "SERVER_NOT_FOUND")
    assert http.post(f"/vswitch/{vid}/server", data={}).json()["error"]["missing"] == ["server"]


def test_a_failed_join_is_reported_and_can_be_removed(sim: RobotSim, http: httpx.Client) -> None:
    sim.set_faults(vswitch_fail=[323])
    vid = create(http)
    http.post(f"/vswitch/{vid}/server", data={"server[]": ["321", "323"]})
    settle(sim)
    assert statuses(http, vid) == {321: "ready", 323: "failed"}
    assert sim.vswitches.ready_members(vid) == {321}
    assert http.request("DELETE", f"/vswitch/{vid}/server", data={"server[]": ["323"]}).status_code == 200


def test_a_hundred_servers_per_vswitch(sim: RobotSim, http: httpx.Client) -> None:
    numbers = [sim.add_server() for _ in range(101)]
    vid = create(http)
    assert http.post(f"/vswitch/{vid}/server", data={"server[]": [str(n) for n in numbers[:100]]}).status_code == 201
    settle(sim)
    refused = http.post(f"/vswitch/{vid}/server", data={"server[]": [str(numbers[100])]})
    assert code(refused) == (409, "VSWITCH_SERVER_LIMIT_REACHED")


def test_five_vswitches_per_server(sim: RobotSim, http: httpx.Client) -> None:
    vids = [create(http, 4000 + i, f"net{i}") for i in range(6)]
    for vid in vids[:5]:
        assert http.post(f"/vswitch/{vid}/server", data={"server[]": ["321"]}).status_code == 201
    refused = http.post(f"/vswitch/{vids[5]}/server", data={"server[]": ["321"]})
    assert code(refused) == (409, "VSWITCH_PER_SERVER_LIMIT_REACHED")


def test_rename_and_cancel(sim: RobotSim, http: httpx.Client) -> None:
    vid, other = create(http, 4000), create(http, 4001, "other")
    assert code(http.post(f"/vswitch/{vid}", data={"name": "x", "vlan": "4001"})) == (409, "VSWITCH_VLAN_NOT_UNIQUE")
    assert http.post(f"/vswitch/{vid}", data={"name": "renamed", "vlan": "4010"}).status_code == 200
    assert http.get(f"/vswitch/{vid}").json()["vlan"] == 4010
    past = http.request("DELETE", f"/vswitch/{other}", data={"cancellation_date": "2001-01-01"})
    assert past.json()["error"]["invalid"] == ["cancellation_date"]
    assert http.request("DELETE", f"/vswitch/{vid}", data={"cancellation_date": "now"}).status_code == 200
    assert http.get(f"/vswitch/{vid}").json()["cancelled"] is True
    assert code(http.post(f"/vswitch/{vid}/server", data={"server[]": ["321"]})) == (409, "CONFLICT")


def test_vswitch_writes_are_limited_per_endpoint_at_100_an_hour(sim: RobotSim, http: httpx.Client) -> None:
    vid = create(http)  # POST /vswitch: one of its 100
    for _ in range(100):
        assert http.post(f"/vswitch/{vid}", data={"name": "gpu", "vlan": "4000"}).status_code == 200
    limited = http.post(f"/vswitch/{vid}", data={"name": "gpu", "vlan": "4000"})
    assert code(limited) == (403, "RATE_LIMIT_EXCEEDED")
    assert limited.json()["error"]["max_requests"] == 100
    assert http.get(f"/vswitch/{vid}").status_code == 200  # reads have their own 500/h
    assert http.post(f"/vswitch/{vid}/server", data={"server[]": ["321"]}).status_code == 201
