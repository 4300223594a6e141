"""The private network's controller wiring against the Robot simulator over real HTTP (docs/private-network.md,
"A host's life on the vSwitch"): the cluster creates its vSwitch once, across a restart and a lost record;
a VLAN in use, a vSwitch id Robot doesn't know and a full vSwitch are conditions with nothing sent; hosts
claimed together join in one POST, get the lowest free addresses and wait for ``ready``; a failed member is
removed and added again; a released host leaves after kubeadm reset (one DELETE, even across a restart) and
its address is free again; the cluster's deletion cancels the vSwitch it created once the members left; a
cluster without ``spec.privateNetwork`` costs no vSwitch call."""

from __future__ import annotations

import base64
import copy
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import InstallImageSpec
from capi_gpu.controllers import cluster_delete, cluster_loop, host_vswitch
from capi_gpu.controllers.host_context import Consumer, HostEnv
from capi_gpu.hetzner import vswitch_plan
from capi_gpu.kube import Obj, Res
from capi_gpu.provisioning import hostkeys, move, vswitch_steps
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings
from capi_gpu_sim.robot import RobotSim

PN = {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24", "routes": ["10.0.0.0/16"]}
CLUSTERS, HOSTS = "hetznergpuclusters", "hetznergpuhosts"


class Kube(FakeKube):
    """FakeKube whose list without a namespace lists every namespace, as the API server does."""

    async def get(self, res: Res, name: str, namespace: str | None = None) -> Obj:
        found = await self.get_or_none(res, name, namespace)
        assert found is not None, f"{res.plural} {namespace}/{name}"
        return found

    async def list(self, res: Res, namespace: str | None = None, **_: Any) -> list[Obj]:
        return [
            copy.deepcopy(o)
            for (p, ns, _n), o in self.objs.items()
            if p == res.plural and (namespace is None or ns == namespace)
        ]


@pytest.fixture
def sim() -> Iterator[RobotSim]:
    user = f"u-{uuid.uuid4().hex[:10]}"  # its own Robot account: vSwitch reads are cached per account
    with RobotSim(users={user: uuid.uuid4().hex}, seed=5) as running:
        for number in (101, 102, 103):
            running.add_server(number)
        yield running


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _world(sim: RobotSim, network: dict[str, Any] | None = PN, *numbers: int) -> tuple[Kube, Deps]:
    spec: dict[str, Any] = {"robotCredentials": {"name": "robot-credentials"}, "sshKeys": {"rescue": {"name": "k"}}}
    if network is not None:
        spec["privateNetwork"] = network
    hgc = {"metadata": {"name": "dev", "ownerReferences": [{"kind": "Cluster", "name": "dev"}]}, "spec": spec}
    secret = {
        "metadata": {"name": "robot-credentials"},
        "data": {"robot-user": _b64(sim.username), "robot-password": _b64(sim.password)},
    }
    kube = Kube((CLUSTERS, hgc), ("secrets", secret))
    for n in numbers:
        kube.put(HOSTS, _host(n))
    return kube, _deps(kube, sim)


_OPENED: list[RobotClients] = []


@pytest.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while _OPENED:
        await _OPENED.pop().close()


def _deps(kube: Kube, sim: RobotSim) -> Deps:
    settings = Settings(robot_url=sim.url)
    robots = RobotClients(settings)
    _OPENED.append(robots)
    return Deps(kube, settings, None, robots)  # type: ignore[arg-type]


def _host(n: int, state: str = "Provisioning") -> Obj:
    ref = {"apiVersion": domain.API_VERSION, "kind": "HetznerGPUMachine", "name": f"m{n}"}
    spec = {"serverNumber": n, "consumerRef": ref}
    return {
        "metadata": {"name": f"h{n}", "uid": f"uid-{n}"},
        "spec": spec,
        "status": {"state": state, "step": "Install"},
    }


def _consumer(n: int) -> Consumer:
    machine = HetznerGPUMachine(
        metadata={"name": f"m{n}", "namespace": NS, "labels": {domain.CLUSTER_NAME_LABEL: "dev"}}
    )
    return Consumer(machine, f"m{n}", InstallImageSpec(), None, "v1.36.3", None, None)


async def _pass(deps: Deps, kube: Kube, n: int, claimed: bool = True) -> tuple[HostEnv, vswitch_steps.Gates]:
    obj = kube.objs[(HOSTS, NS, f"h{n}")]
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    env = HostEnv(robot, "", "", hostkeys.HostKeyPair(), _consumer(n) if claimed else None)
    host, env, gates = await host_vswitch.sync(deps, copy.deepcopy(obj), HetznerGPUHost.model_validate(obj), env)
    obj["status"]["conditions"] = [x.wire() for x in host.status.conditions]  # host_loop's write
    return env, gates


def _record(kube: Kube, n: int) -> dict[str, Any] | None:
    return kube.objs[(HOSTS, NS, f"h{n}")]["status"].get("privateNetwork")


def _cond(obj: Obj, type_: str = "PrivateNetworkReady") -> str:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    return f"{found[0]['status']}/{found[0]['reason']}" if found else ""


def _vswitch_calls(sim: RobotSim, method: str | None = None, path: str = "/vswitch") -> int:
    return sim.count(method, path)


def _settle(sim: RobotSim) -> None:
    sim.clock.advance(sim.vswitches.delay_s)
    assert sim.wait_idle()


async def _forget(deps: Deps, kube: Kube) -> None:
    """The next pass reads the vSwitch afresh (the shared read lives 5 s)."""
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    robot.account.vswitch_reads.clear()


@pytest.fixture(autouse=True)
def no_gathering(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host_vswitch, "GATHER_S", 0.0)


async def _cluster(deps: Deps) -> Obj:
    await cluster_loop.reconcile(deps, NS, "dev")
    return deps.kube.objs[(CLUSTERS, NS, "dev")]  # type: ignore[attr-defined,no-any-return]


async def test_the_cluster_creates_its_vswitch_once_across_a_restart_and_a_lost_record(sim: RobotSim) -> None:
    kube, deps = _world(sim)
    hgc = await _cluster(deps)
    record = hgc["status"]["privateNetwork"]
    assert (record["vlan"], record["created"], record["servers"]) == (4000, True, 0)
    assert _cond(hgc) == "True/Ready"
    assert _vswitch_calls(sim, "POST", "/vswitch") == 1
    await _cluster(_deps(kube, sim))  # a restarted operator reads the recorded id
    del kube.objs[(CLUSTERS, NS, "dev")]["status"]["privateNetwork"]  # the record lost after Robot answered
    hgc = await _cluster(_deps(kube, sim))
    assert hgc["status"]["privateNetwork"]["vswitchID"] == record["vswitchID"]
    assert hgc["status"]["privateNetwork"]["created"] is True
    assert _vswitch_calls(sim, "POST", "/vswitch") == 1


async def test_a_vlan_in_use_is_a_condition_and_nothing_is_created(sim: RobotSim) -> None:
    kube, deps = _world(sim)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    await robot.create_vswitch("someone-else", 4000)
    hgc = await _cluster(deps)
    assert _cond(hgc) == f"False/{vswitch_plan.Refusal.VLAN_IN_USE.value}"
    assert _cond(hgc, "Ready") == f"False/{vswitch_plan.Refusal.VLAN_IN_USE.value}"
    assert _vswitch_calls(sim, "POST", "/vswitch") == 1  # only the other one's
    assert hgc["status"].get("privateNetwork") is None


async def test_a_vswitch_named_by_an_unknown_id_is_a_condition(sim: RobotSim) -> None:
    _, deps = _world(sim, {"vswitch": {"id": 4242}, "subnet": "10.0.1.0/24"})
    hgc = await _cluster(deps)
    assert _cond(hgc) == "False/VSwitchNotFound"
    assert _vswitch_calls(sim, "POST") == 0


async def test_hosts_claimed_together_join_in_one_post_and_the_join_waits_for_ready(
    sim: RobotSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host_vswitch, "GATHER_S", 3.0)
    kube, deps = _world(sim, PN, 101, 102)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    now = [1000.0]
    robot.account.clock = lambda: now[0]
    before = _vswitch_calls(sim)
    _, gates = await _pass(deps, kube, 101)
    await _pass(deps, kube, 102)
    assert gates.before_join is not None
    assert _vswitch_calls(sim, "POST") == 1  # the create; the add gathers
    now[0] += 3.0
    await _pass(deps, kube, 101)
    adds = [e for e in sim.log if e.method == "POST" and e.path == f"/vswitch/{vid}/server"]
    assert len(adds) == 1
    assert _record(kube, 101) == {"vswitchID": vid, "address": "10.0.1.2", "membership": "Joining"}
    assert _record(kube, 102)["address"] == "10.0.1.3"  # type: ignore[index]
    _, gates = await _pass(deps, kube, 102)
    assert "waiting for Robot" in (gates.before_join or "")
    _settle(sim)
    await _forget(deps, kube)
    env, gates = await _pass(deps, kube, 101)
    _, other = await _pass(deps, kube, 102)
    assert (gates.before_join, other.before_join) == (None, None)
    assert _record(kube, 102)["membership"] == "Ready"  # type: ignore[index]
    assert _cond(kube.objs[(HOSTS, NS, "h101")]) == "True/Ready"
    assert env.private_network is not None
    assert env.private_network.playbook_vars() == {
        "private_network": {
            "vlan": 4000,
            "mtu": 1400,
            "address": "10.0.1.2/24",
            "gateway": "10.0.1.1",
            "routes": ["10.0.0.0/16"],
        },
        "kubelet_extra_args": ["--node-ip=10.0.1.2"],
    }
    # Measured for docs/private-network.md: vSwitch calls for these two joins, reads shared within a pass.
    used = _vswitch_calls(sim) - before
    # One read shared by the first passes, the account's vSwitch list (the 5-per-server count before an add;
    # plus one read per other vSwitch, none here), the add, one read after settling (shared again).
    assert used == 4


async def test_a_failed_member_is_removed_and_added_again(sim: RobotSim) -> None:
    sim.set_faults(vswitch_fail=[101])
    kube, deps = _world(sim, PN, 101)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]
    await _pass(deps, kube, 101)
    _settle(sim)
    await _forget(deps, kube)
    await _pass(deps, kube, 101)  # reads failed, sends the remove
    assert sim.count("DELETE", f"/vswitch/{vid}/server") == 1
    sim.set_faults(vswitch_fail=[])
    _settle(sim)
    await _forget(deps, kube)
    _, gates = await _pass(deps, kube, 101)  # gone: added again
    assert sim.count("POST", f"/vswitch/{vid}/server") == 2
    _settle(sim)
    await _forget(deps, kube)
    _, gates = await _pass(deps, kube, 101)
    assert gates.before_join is None
    assert _record(kube, 101)["membership"] == "Ready"  # type: ignore[index]


async def test_a_released_host_leaves_after_kubeadm_reset_once_and_frees_its_address(sim: RobotSim) -> None:
    kube, deps = _world(sim, PN, 101)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]
    await _pass(deps, kube, 101)
    _settle(sim)
    await _forget(deps, kube)
    await _pass(deps, kube, 101)
    assert _record(kube, 101)["membership"] == "Ready"  # type: ignore[index]
    obj = kube.objs[(HOSTS, NS, "h101")]
    obj["spec"].pop("consumerRef")
    obj["status"].update(state="Deprovisioning", step="Done", stepStartedAt="2026-01-01T00:00:00Z")
    _, gates = await _pass(deps, kube, 101, claimed=False)  # kubeadm reset not done yet: stays
    assert sim.count("DELETE", f"/vswitch/{vid}/server") == 0
    assert gates.before_release is not None
    reset = {"name": "kubeadm-reset", "requestedAt": "2026-01-01T00:00:01Z", "outcome": "Sent"}
    obj["status"]["operations"] = [reset]
    await _pass(deps, kube, 101, claimed=False)
    assert sim.count("DELETE", f"/vswitch/{vid}/server") == 1
    assert _record(kube, 101)["membership"] == "Leaving"  # type: ignore[index]
    await _forget(deps, kube)  # as after a restart: Robot's processing says the remove went
    _, gates = await _pass(deps, kube, 101, claimed=False)
    assert sim.count("DELETE", f"/vswitch/{vid}/server") == 1
    assert gates.before_release is not None
    _settle(sim)
    await _forget(deps, kube)
    _, gates = await _pass(deps, kube, 101, claimed=False)
    assert _record(kube, 101) is None
    assert gates.before_release is None
    kube.put(HOSTS, _host(102))
    await _pass(deps, kube, 102)
    assert _record(kube, 102)["address"] == "10.0.1.2"  # type: ignore[index]


async def test_a_full_vswitch_is_a_condition_and_nothing_is_sent_for_the_host_that_does_not_fit(
    sim: RobotSim, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vswitch_plan, "SERVERS_PER_VSWITCH", 1)
    kube, deps = _world(sim, PN, 101, 102)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]
    await _pass(deps, kube, 101)
    await _pass(deps, kube, 102)
    adds = [e for e in sim.log if e.method == "POST" and e.path == f"/vswitch/{vid}/server"]
    assert len(adds) == 1
    _settle(sim)
    await _forget(deps, kube)
    _, gates = await _pass(deps, kube, 102)
    assert _cond(kube.objs[(HOSTS, NS, "h102")]) == f"False/{vswitch_plan.Refusal.VSWITCH_FULL.value}"
    assert gates.before_join is not None  # never joins the cluster off the private network
    assert len([e for e in sim.log if e.method == "POST" and e.path == f"/vswitch/{vid}/server"]) == 1


async def test_a_cluster_without_a_private_network_costs_no_vswitch_call(sim: RobotSim) -> None:
    kube, deps = _world(sim, None, 101)
    hgc = await _cluster(deps)
    env, gates = await _pass(deps, kube, 101)
    assert (gates, env.private_network, _record(kube, 101)) == (vswitch_steps.Gates(), None, None)
    assert hgc["status"].get("privateNetwork") is None
    assert _cond(hgc) == ""
    assert _vswitch_calls(sim) == 0


async def test_deleting_the_cluster_cancels_its_vswitch_after_the_members_left(sim: RobotSim) -> None:
    kube, deps = _world(sim, PN, 101)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]
    await _pass(deps, kube, 101)
    hgc = kube.objs[(CLUSTERS, NS, "dev")]
    assert await cluster_delete.delete(deps, copy.deepcopy(hgc)) is False
    assert sim.count("DELETE", f"/vswitch/{vid}") == 0
    _settle(sim)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    await robot.remove_vswitch_servers(vid, [101])
    _settle(sim)
    assert await cluster_delete.delete(deps, copy.deepcopy(hgc)) is True
    assert (await robot.get_vswitch(vid)).cancelled
    moved = copy.deepcopy(hgc)
    moved["metadata"]["annotations"] = {domain.DELETE_FOR_MOVE_ANNOTATION: ""}
    calls = _vswitch_calls(sim)
    assert await cluster_delete.delete(deps, moved) is True
    assert _vswitch_calls(sim) == calls


async def test_a_vswitch_named_by_id_is_never_cancelled(sim: RobotSim) -> None:
    kube, deps = _world(sim, None)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    theirs = await robot.create_vswitch("shared", 4001)
    kube.objs[(CLUSTERS, NS, "dev")]["spec"]["privateNetwork"] = {"vswitch": {"id": theirs.id}, "subnet": "10.0.1.0/24"}
    hgc = await _cluster(deps)
    assert hgc["status"]["privateNetwork"]["created"] is False
    assert await cluster_delete.delete(deps, copy.deepcopy(hgc)) is True
    assert not (await robot.get_vswitch(theirs.id)).cancelled


async def test_the_record_survives_a_move_in_the_status_snapshot(sim: RobotSim) -> None:
    kube, deps = _world(sim, PN, 101)
    await _cluster(deps)
    await _pass(deps, kube, 101)
    host = HetznerGPUHost.model_validate(kube.objs[(HOSTS, NS, "h101")])
    restored = move.restore(move.snapshot(host.status))
    assert restored.private_network == host.status.private_network
    assert restored.private_network is not None and restored.private_network.address == "10.0.1.2"


async def test_a_change_robot_refuses_for_good_is_a_condition_and_is_not_sent_again_every_pass(sim: RobotSim) -> None:
    sim.add_server(104, vswitch_capable=False)
    kube, deps = _world(sim, PN, 104)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]
    _, gates = await _pass(deps, kube, 104)
    assert sim.count("POST", f"/vswitch/{vid}/server") == 1
    assert _cond(kube.objs[(HOSTS, NS, "h104")]) == "False/VSwitchRefused"
    assert gates.before_join is not None
    await _forget(deps, kube)
    await _pass(deps, kube, 104)
    assert sim.count("POST", f"/vswitch/{vid}/server") == 1  # resting: no write token spent on a known refusal
    assert _cond(kube.objs[(HOSTS, NS, "h104")]) == "False/VSwitchRefused"  # and still says why


async def test_a_create_robot_refuses_is_a_condition_and_is_not_sent_again_every_pass(sim: RobotSim) -> None:
    kube, deps = _world(sim)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    for vlan in range(4010, 4020):  # the simulator's account limit: Robot's own figure is not documented
        await robot.create_vswitch(f"other-{vlan}", vlan)
    hgc = await _cluster(deps)
    assert _cond(hgc) == "False/VSwitchRefused"
    assert "VSWITCH_LIMIT_REACHED" in next(
        c["message"] for c in hgc["status"]["conditions"] if c["type"] == "PrivateNetworkReady"
    )
    await _cluster(deps)
    assert sim.count("POST", "/vswitch") == 11  # ten others and ours once


async def test_a_read_that_began_before_a_change_is_not_shared_after_it(sim: RobotSim) -> None:
    """A pass must never decide from a read older than our own change (it would add a server again)."""
    kube, deps = _world(sim)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    vswitch = await robot.create_vswitch("dev", 4000)
    real_get = robot.get_vswitch

    async def get_then_change(vswitch_id: int) -> Any:
        read = await real_get(vswitch_id)
        await robot.add_vswitch_servers(vswitch_id, [101])  # lands while the read is on its way back
        return read

    robot.get_vswitch = get_then_change  # type: ignore[method-assign]
    assert (await robot.cached_vswitch(vswitch.id)).server == []
    robot.get_vswitch = real_get  # type: ignore[method-assign]
    assert [s.server_number for s in (await robot.cached_vswitch(vswitch.id)).server] == [101]


async def test_a_server_on_five_other_vswitches_is_a_condition_before_anything_is_sent(sim: RobotSim) -> None:
    kube, deps = _world(sim, PN, 101, 102)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    for vlan in range(4001, 4006):  # another tool's five vSwitches, each with server 101 on it
        other = await robot.create_vswitch(f"other-{vlan}", vlan)
        await robot.add_vswitch_servers(other.id, [101])
        _settle(sim)
    vid = (await _cluster(deps))["status"]["privateNetwork"]["vswitchID"]

    def lists() -> int:
        return sum(1 for e in sim.log if e.method == "GET" and e.path == "/vswitch")

    before = lists()
    await _pass(deps, kube, 101)
    await _pass(deps, kube, 102)
    assert sim.count("POST", f"/vswitch/{vid}/server") == 1
    _settle(sim)
    assert [m.server_number for m in (await robot.get_vswitch(vid)).server] == [102]
    assert _cond(kube.objs[(HOSTS, NS, "h101")]) == f"False/{vswitch_plan.Refusal.SERVER_VSWITCH_LIMIT.value}"
    # The count costs one list and one read per other vSwitch, shared by both hosts' passes (5 s cache).
    assert lists() - before == 1


async def test_a_users_vswitch_with_our_vlan_and_name_is_used_but_never_cancelled(sim: RobotSim) -> None:
    kube, deps = _world(sim)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    theirs = await robot.create_vswitch("dev", 4000)  # the cluster's own name: nothing tells it apart but intent
    hgc = await _cluster(deps)
    record = hgc["status"]["privateNetwork"]
    assert (record["vswitchID"], record["created"]) == (theirs.id, False)
    assert domain.ANNOTATION_VSWITCH_CREATE not in (hgc["metadata"].get("annotations") or {})
    assert _vswitch_calls(sim, "POST", "/vswitch") == 1  # only theirs
    assert await cluster_delete.delete(deps, copy.deepcopy(hgc)) is True
    assert not (await robot.get_vswitch(theirs.id)).cancelled


async def test_our_intent_is_recorded_before_the_create_and_survives_a_lost_status(sim: RobotSim) -> None:
    kube, deps = _world(sim)
    hgc = await _cluster(deps)
    assert hgc["metadata"]["annotations"][domain.ANNOTATION_VSWITCH_CREATE] == "4000"
    vid = hgc["status"]["privateNetwork"]["vswitchID"]
    del kube.objs[(CLUSTERS, NS, "dev")]["status"]  # a move's target: metadata carried, status not
    hgc = await _cluster(_deps(kube, sim))
    assert (hgc["status"]["privateNetwork"]["vswitchID"], hgc["status"]["privateNetwork"]["created"]) == (vid, True)
    assert await cluster_delete.delete(deps, copy.deepcopy(hgc)) is True
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    assert (await robot.get_vswitch(vid)).cancelled


async def test_a_host_claimed_before_the_cluster_recorded_its_vswitch_waits_for_its_vlan_interface(
    sim: RobotSim,
) -> None:
    """The machine loop may claim (a standby host, or a cold one) before the cluster loop created the vSwitch:
    Configure and the join must wait, with a condition, rather than build the node without its VLAN."""
    kube, deps = _world(sim, PN, 101)
    env, gates = await _pass(deps, kube, 101)  # no cluster pass yet: no vSwitch recorded
    assert env.private_network is None
    assert gates.configure and gates.before_configure is not None and gates.before_join is not None
    assert _cond(kube.objs[(HOSTS, NS, "h101")]) == "False/JoiningVSwitch"
    await _cluster(deps)
    env, gates = await _pass(deps, kube, 101)
    assert (gates.configure, gates.before_configure) == (True, None)
    assert env.private_network is not None and env.private_network.vlan == 4000


async def test_a_lost_cluster_record_after_a_move_makes_configure_wait_again(sim: RobotSim) -> None:
    kube, deps = _world(sim, PN, 101)
    await _cluster(deps)
    await _pass(deps, kube, 101)
    del kube.objs[(CLUSTERS, NS, "dev")]["status"]["privateNetwork"]  # the cluster's status lost in a move
    env, gates = await _pass(deps, kube, 101)
    assert env.private_network is None and gates.configure and gates.before_configure is not None


async def test_a_vswitch_named_by_id_waits_for_its_vlan_before_configure(sim: RobotSim) -> None:
    kube, deps = _world(sim, None, 101)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    theirs = await robot.create_vswitch("shared", 4001)
    kube.objs[(CLUSTERS, NS, "dev")]["spec"]["privateNetwork"] = {"vswitch": {"id": theirs.id}, "subnet": "10.0.1.0/24"}
    env, gates = await _pass(deps, kube, 101)  # the address is allocated, but the VLAN is not read yet
    assert _record(kube, 101) is not None
    assert env.private_network is None and "VLAN" in (gates.before_configure or "")
    await _cluster(deps)
    env, gates = await _pass(deps, kube, 101)
    assert gates.before_configure is None
    assert env.private_network is not None and env.private_network.vlan == 4001


async def test_a_paused_clusters_hosts_on_a_shared_vswitch_are_left_out_of_the_change(sim: RobotSim) -> None:
    """Clusters share a vSwitch by id; one is being moved (paused): another's host pass adds and removes
    only its own servers, never the paused cluster's (joining 102, leaving 103)."""
    kube, deps = _world(sim, None, 101)
    robot = await deps.robots.get(kube, NS, "robot-credentials")
    vid = (await robot.create_vswitch("shared", 4001)).id
    await robot.add_vswitch_servers(vid, [103])
    _settle(sim)
    kube.objs[(CLUSTERS, NS, "dev")]["spec"]["privateNetwork"] = {"vswitch": {"id": vid}, "subnet": "10.0.1.0/24"}
    kube.put("clusters", {"metadata": {"name": "moving"}, "spec": {"paused": True}})
    for n, membership in ((102, "Absent"), (103, "Leaving")):
        moved = _host(n, "Provisioned")
        moved["metadata"]["labels"] = {domain.CONSUMER_CLUSTER_LABEL: "moving"}
        moved["status"]["privateNetwork"] = {"vswitchID": vid, "address": f"10.0.1.{n}", "membership": membership}
        kube.put(HOSTS, moved)
    await _cluster(deps)
    await _pass(deps, kube, 101)
    adds = [e for e in sim.log if e.method == "POST" and e.path == f"/vswitch/{vid}/server"]
    assert len(adds) == 2  # 103 by hand above, then ours
    _settle(sim)
    assert sorted(m.server_number for m in (await robot.get_vswitch(vid)).server) == [101, 103]
    assert sim.count("DELETE", f"/vswitch/{vid}/server") == 0
