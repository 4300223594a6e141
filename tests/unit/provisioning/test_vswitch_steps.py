"""A host's life on its cluster's vSwitch, the pure half (``vswitch_steps``) from tables: when a host gets an
address, when it leaves (after kubeadm reset, never before; for good once ``Leaving`` is written), which
servers join or leave a vSwitch from every host's record, and what Bootstrap and Deprovisioning wait for;
and the state machine honouring those waits (no kubeadm join before the vSwitch says ready, no return to
Available before the server left)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from states_helpers import decide, host

from capi_gpu.api.host import HetznerGPUHostStatus, HostState, Step
from capi_gpu.api.network import HostPrivateNetwork, VSwitchMembership
from capi_gpu.provisioning import vswitch_steps
from capi_gpu.provisioning.model import ActionKind, Observations

M = VSwitchMembership
VID = 40


def _status(
    state: HostState, membership: M | None = None, vswitch: int = VID, reset: str | None = None
) -> HetznerGPUHostStatus:
    ops = [("kubeadm-reset", timedelta(seconds=5), reset)] if reset is not None else []
    status = host(state, Step.DONE if state is HostState.DEPROVISIONING else None, ops=ops).status
    if membership is not None:
        status.private_network = HostPrivateNetwork(vswitch_id=vswitch, address="10.0.1.2", membership=membership)
    return status


@pytest.mark.parametrize(
    ("status", "wanted", "leave"),
    [
        (_status(HostState.PROVISIONING), VID, False),  # no record: nothing to leave
        (_status(HostState.PROVISIONING, M.JOINING), VID, False),  # claimed here: stays
        (_status(HostState.PROVISIONED, M.READY), VID, False),
        (_status(HostState.PROVISIONED, M.READY), None, False),  # released: kubeadm reset first
        (_status(HostState.DEPROVISIONING, M.READY), None, False),  # reset not sent yet
        (_status(HostState.DEPROVISIONING, M.READY, reset=None), VID, False),
        (_status(HostState.DEPROVISIONING, M.READY, reset="Sent"), None, True),
        (_status(HostState.DEPROVISIONING, M.READY, reset="Failed: unreachable"), None, True),  # best effort
        (_status(HostState.DEPROVISIONING, M.READY, reset="Deferred"), None, False),
        (_status(HostState.AVAILABLE, M.READY), None, True),  # released before it was provisioned
        (_status(HostState.PROVISIONING, M.READY, vswitch=41), VID, True),  # claimed onto another vSwitch
        (_status(HostState.PROVISIONING, M.LEAVING), VID, True),  # Leaving is for good
    ],
)
def test_when_a_host_leaves(status: HetznerGPUHostStatus, wanted: int | None, leave: bool) -> None:
    assert vswitch_steps.should_leave(status, wanted) is leave


@pytest.mark.parametrize(
    ("status", "wanted", "allocate"),
    [
        (_status(HostState.AVAILABLE), VID, True),
        (_status(HostState.STANDBY), VID, True),
        (_status(HostState.PROVISIONING), VID, True),
        (_status(HostState.PROVISIONING), None, False),  # no private network on the claim
        (_status(HostState.PROVISIONING, M.JOINING), VID, False),  # holds one: allocate gives it back anyway
        (_status(HostState.DEPROVISIONING), VID, False),  # dropped after its leave: not again before release
        (_status(HostState.PROVISIONED), VID, False),  # provisioned without one: its IP can't change under it
    ],
)
def test_when_a_host_gets_an_address(status: HetznerGPUHostStatus, wanted: int | None, allocate: bool) -> None:
    assert vswitch_steps.should_allocate(status, wanted) is allocate


def _obj(number: Any, record: dict[str, Any] | None) -> dict[str, Any]:
    return {"spec": {"serverNumber": number}, "status": {"privateNetwork": record} if record else {}}


def test_who_joins_and_who_leaves_comes_from_every_hosts_record() -> None:
    hosts = [
        _obj(1, {"vswitchID": VID, "address": "10.0.1.2", "membership": "Absent"}),
        _obj(2, {"vswitchID": VID, "address": "10.0.1.3", "membership": "Ready"}),
        _obj(3, {"vswitchID": VID, "address": "10.0.1.4", "membership": "Leaving"}),
        _obj(4, {"vswitchID": 41, "address": "10.0.1.5", "membership": "Absent"}),  # another vSwitch
        _obj(5, None),
        _obj("x", {"vswitchID": VID, "address": "10.0.1.6"}),  # no server number: not ours to send
    ]
    assert vswitch_steps.desired(hosts, VID) == (frozenset({1, 2}), frozenset({3}))


@pytest.mark.parametrize(
    ("status", "wanted", "join_waits", "release_waits"),
    [
        (_status(HostState.PROVISIONING), None, False, False),  # a cluster without a private network
        (_status(HostState.PROVISIONING), VID, True, False),  # no address yet
        (_status(HostState.PROVISIONING, M.JOINING), VID, True, False),
        (_status(HostState.PROVISIONING, M.FAILED), VID, True, False),
        (_status(HostState.PROVISIONING, M.READY), VID, False, False),
        (_status(HostState.DEPROVISIONING, M.LEAVING), None, False, True),
        (_status(HostState.DEPROVISIONING), None, False, False),  # left: the address is free
    ],
)
def test_what_the_state_machine_waits_for(
    status: HetznerGPUHostStatus, wanted: int | None, join_waits: bool, release_waits: bool
) -> None:
    gates = vswitch_steps.gates(status, wanted)
    assert (gates.before_join is not None, gates.before_release is not None) == (join_waits, release_waits)


def test_the_kubeadm_join_waits_for_the_vswitch_and_goes_once_ready() -> None:
    h = host(HostState.PROVISIONING, Step.BOOTSTRAP)
    waiting = decide(h, Observations(claimed=True, bootstrap_ready=True, vswitch_before_join="joining"))
    assert waiting.action is None
    assert [n.reason for n in waiting.notes] == ["JoiningVSwitch"]
    going = decide(h, Observations(claimed=True, bootstrap_ready=True))
    assert going.action is not None and going.action.kind is ActionKind.BOOTSTRAP


def test_deprovisioning_resets_first_and_returns_the_host_only_after_the_leave() -> None:
    fresh = host(HostState.DEPROVISIONING, Step.DONE)
    first = decide(fresh, Observations(vswitch_before_release="leaving"))
    assert first.action is not None and first.action.kind is ActionKind.KUBEADM_RESET  # the reset goes first
    reset = host(HostState.DEPROVISIONING, Step.DONE, ops=[("kubeadm-reset", timedelta(seconds=5), "Sent")])
    waiting = decide(reset, Observations(vswitch_before_release="leaving"))
    assert (waiting.status.state, waiting.action) == (HostState.DEPROVISIONING, None)
    assert [n.reason for n in waiting.notes] == ["LeavingVSwitch"]
    assert decide(reset, Observations()).status.state is HostState.AVAILABLE


def test_a_standby_host_claimed_onto_a_private_network_runs_configure_again_for_its_vlan_interface() -> None:
    h = host(HostState.STANDBY, prepared="img/none/v1.36.3")
    claimed = Observations(claimed=True, consumer_prepared="img/none/v1.36.3")
    assert decide(h, claimed).status.step is Step.BOOTSTRAP  # no private network: straight to the join
    with_network = Observations(claimed=True, consumer_prepared="img/none/v1.36.3", private_network_configure=True)
    again = decide(h, with_network)
    assert (again.status.state, again.status.step) == (HostState.PROVISIONING, Step.CONFIGURE)


@pytest.mark.parametrize(
    ("status", "wanted", "vlan", "waits"),
    [
        (_status(HostState.PROVISIONING), None, 4000, "record its vSwitch"),  # the cluster has no vSwitch yet
        (_status(HostState.PROVISIONING), VID, 4000, "no address"),  # allocation not done (or exhausted)
        (_status(HostState.PROVISIONING, M.JOINING, vswitch=41), VID, 4000, "no address"),  # still on another
        (_status(HostState.PROVISIONING, M.LEAVING), VID, 4000, "no address"),
        (_status(HostState.PROVISIONING, M.JOINING), VID, None, "read the VLAN"),  # vswitch.id not read yet
        (_status(HostState.PROVISIONING, M.JOINING), VID, 4000, None),  # the interface can be built
        (_status(HostState.PROVISIONING, M.READY), VID, 4000, None),
    ],
)
def test_when_configure_waits_for_the_vlan_interface(
    status: HetznerGPUHostStatus, wanted: int | None, vlan: int | None, waits: str | None
) -> None:
    why = vswitch_steps.before_configure(status, wanted, vlan)
    assert (why is None) == (waits is None)
    assert waits is None or waits in (why or "")


def test_configure_waits_for_the_vlan_interface_and_runs_once_it_can_be_built() -> None:
    h = host(HostState.PROVISIONING, Step.CONFIGURE)
    pending = Observations(claimed=True, private_network_configure=True, vswitch_before_configure="no vSwitch yet")
    waiting = decide(h, pending)
    assert (waiting.action, waiting.status.step) == (None, Step.CONFIGURE)
    assert [n.reason for n in waiting.notes] == ["JoiningVSwitch"]
    going = decide(h, Observations(claimed=True, private_network_configure=True))
    assert going.action is not None and going.action.kind is ActionKind.CONFIGURE
    preparing = host(HostState.STANDBY_PREPARING, Step.CONFIGURE)  # no cluster, so no interface to wait for
    standby = decide(preparing, Observations(vswitch_before_configure="no vSwitch yet"))
    assert standby.action is not None and standby.action.kind is ActionKind.CONFIGURE


def test_a_standby_host_claimed_before_its_cluster_recorded_the_vswitch_reconfigures_after_waiting() -> None:
    """The claim's cluster has spec.privateNetwork but no vSwitch yet: never straight to the join."""
    h = host(HostState.STANDBY, prepared="img/none/v1.36.3")
    early = Observations(
        claimed=True,
        consumer_prepared="img/none/v1.36.3",
        private_network_configure=True,
        vswitch_before_configure="waiting for the cluster to record its vSwitch",
        vswitch_before_join="waiting for the cluster to record its vSwitch",
    )
    claimed = decide(h, early)
    assert (claimed.status.state, claimed.status.step) == (HostState.PROVISIONING, Step.CONFIGURE)
    configuring = host(HostState.PROVISIONING, Step.CONFIGURE)
    assert decide(configuring, early).action is None


def test_paused_hosts_are_left_out_of_who_joins_and_who_leaves() -> None:
    hosts = [
        {**_obj(1, {"vswitchID": VID, "address": "10.0.1.2", "membership": "Absent"}), "metadata": {"name": "a"}},
        {**_obj(2, {"vswitchID": VID, "address": "10.0.1.3", "membership": "Absent"}), "metadata": {"name": "b"}},
        {**_obj(3, {"vswitchID": VID, "address": "10.0.1.4", "membership": "Leaving"}), "metadata": {"name": "c"}},
    ]
    assert vswitch_steps.desired(hosts, VID, frozenset({("", "b"), ("", "c")})) == (frozenset({1}), frozenset())
    assert [h["metadata"]["name"] for h in vswitch_steps.on_vswitch([*hosts, _obj(4, None)], VID)] == ["a", "b", "c"]
