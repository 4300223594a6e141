"""``nodes relayout`` runs site.yml again, and the kubelet role rewrites /etc/default/kubelet from its
variables: on a cluster with a private network the run must carry the node's VLAN interface and
``--node-ip`` (rebuilt from the host's record and the cluster, as Configure passed them), or the node's
InternalIP turns public at the next kubelet restart; a host whose record can't give them is refused before
anything is touched (docs/private-network.md)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from capi_gpu import domain, relayout
from capi_gpu.api.host import HetznerGPUHost
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.network import HostPrivateNetwork, PrivateNetworkSpec, PrivateNetworkStatus, VSwitchMembership
from capi_gpu.api.specs import GPUSpec
from capi_gpu.kube import Res
from capi_gpu.provisioning import ansible, ansible_events, playbook_vars, private_network

NS = "default"
PN = {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24", "routes": ["10.0.0.0/16"]}
RECORD = {"vswitchID": 7, "address": "10.0.1.9", "membership": "Ready"}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class Mgmt:
    """The management cluster as relayout reads it (synchronous ``Kube``), writes recorded."""

    def __init__(self, network: dict[str, Any] | None, record: dict[str, Any] | None) -> None:
        spec: dict[str, Any] = {"robotCredentials": {"name": "robot-credentials"}, "sshKeys": {"rescue": {"name": "k"}}}
        if network is not None:
            spec["privateNetwork"] = network
        status = {"privateNetwork": {"vswitchID": 7, "vlan": 4000, "created": True}} if network else {}
        host_status: dict[str, Any] = {"state": "Provisioned", "ipv4": "192.0.2.10"}
        if record is not None:
            host_status["privateNetwork"] = record
        self.objs: dict[tuple[str, str], dict[str, Any]] = {
            ("hetznergpuclusters", "dev"): {
                "metadata": {"name": "dev", "namespace": NS, "ownerReferences": [{"kind": "Cluster", "name": "dev"}]},
                "spec": spec,
                "status": status,
            },
            ("hetznergpumachines", "m1"): {
                "metadata": {"name": "m1", "namespace": NS, "labels": {domain.CLUSTER_NAME_LABEL: "dev"}},
                "spec": {
                    "providerID": "hrobot://101",
                    "gpu": {"model": "rtx-pro-6000", "layout": {"preset": "all-1g.24gb"}},
                },
                "status": {"host": "h1"},
            },
            ("hetznergpuhosts", "h1"): {
                "metadata": {"name": "h1", "namespace": NS},
                "spec": {"serverNumber": 101, "robot": {"sshKeySecret": "ssh"}},
                "status": host_status,
            },
            ("secrets", "ssh"): {"metadata": {"name": "ssh"}, "data": {"ssh-privatekey": _b64("key")}},
            ("secrets", f"h1{domain.OS_HOSTKEY_SECRET_SUFFIX}"): {
                "metadata": {"name": "hk"},
                "data": {
                    "ssh-host-publickey": _b64(
                        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDRoHfqEF1sLOxZJdKy4WAehTmRA+5knWM8yjj7uS4x0"
                    )
                },
            },
        }
        self.writes: list[str] = []

    def list(self, res: Res, namespace: str | None = None, **_: Any) -> list[dict[str, Any]]:
        return [o for (plural, _n), o in self.objs.items() if plural == res.plural]

    def get(self, res: Res, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.objs[(res.plural, name)]

    def get_or_none(self, res: Res, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        return self.objs.get((res.plural, name))

    def patch(self, res: Res, name: str, *_: Any, **__: Any) -> dict[str, Any]:
        self.writes.append(f"patch {res.plural}/{name}")
        return self.objs.get((res.plural, name), {})

    def apply(self, res: Res, body: dict[str, Any], *_: Any) -> dict[str, Any]:
        self.writes.append(f"apply {res.plural}")
        return body

    def delete(self, res: Res, name: str, *_: Any) -> None:
        self.writes.append(f"delete {res.plural}/{name}")

    def create(self, res: Res, body: dict[str, Any], *_: Any) -> dict[str, Any]:
        self.writes.append(f"create {res.plural}")
        return body


class Workload(Mgmt):
    def __init__(self) -> None:
        super().__init__(None, None)
        self.objs = {("nodes", "gpu-1"): {"metadata": {"name": "gpu-1"}, "spec": {"providerID": "hrobot://101"}}}


class Runner:
    """The playbook run: what it was given, and a failure so relayout stops right after it."""

    seen: list[playbook_vars.PlaybookVars] = []

    def __init__(self, **_: Any) -> None:
        pass

    async def prepare_node(self, target: Any, variables: playbook_vars.PlaybookVars) -> Any:
        Runner.seen.append(variables)
        return ansible_events.PlaybookResult(ansible_events.RunStatus.FAILED, ansible_events.HostStats(), Path(), 0.0)


def _job(mgmt: Mgmt, tmp_path: Path) -> relayout.Relayout:
    return relayout.Relayout(mgmt, Workload(), NS, "gpu-1", "all-1g.24gb", tmp_path, {}, say=lambda _: None)  # type: ignore[arg-type]


def test_the_relayout_run_carries_the_vlan_interface_and_the_node_ip(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    Runner.seen = []
    monkeypatch.setattr(ansible, "AnsibleRunner", Runner)
    mgmt = Mgmt(PN, RECORD)
    job = _job(mgmt, tmp_path)
    machine = HetznerGPUMachine.model_validate(mgmt.objs[("hetznergpumachines", "m1")])
    host = HetznerGPUHost.model_validate(mgmt.objs[("hetznergpuhosts", "h1")])
    network = job._private_network(machine, host)
    with pytest.raises(relayout.RelayoutError, match="apply"):
        job._apply_layout(
            machine,
            host,
            GPUSpec.model_validate({"model": "rtx-pro-6000", "layout": {"preset": "all-1g.24gb"}}),
            network,
        )
    extra = Runner.seen[0].extra_vars()
    assert extra["private_network"] == {
        "vlan": 4000,
        "mtu": 1400,
        "address": "10.0.1.9/24",
        "gateway": "10.0.1.1",
        "routes": ["10.0.0.0/16"],
    }
    assert "--node-ip=10.0.1.9" in extra["kubelet_extra_args"]


def test_a_cluster_without_a_private_network_relayouts_as_before(tmp_path: Path) -> None:
    mgmt = Mgmt(None, None)
    machine = HetznerGPUMachine.model_validate(mgmt.objs[("hetznergpumachines", "m1")])
    host = HetznerGPUHost.model_validate(mgmt.objs[("hetznergpuhosts", "h1")])
    assert _job(mgmt, tmp_path)._private_network(machine, host) is None


def test_a_host_without_its_record_on_a_private_network_cluster_is_refused_before_anything_is_touched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ansible, "AnsibleRunner", Runner)
    mgmt = Mgmt(PN, None)
    job = _job(mgmt, tmp_path)
    with pytest.raises(relayout.RelayoutError, match="no private network record") as raised:
        job.run()
    assert raised.value.usage and raised.value.step == "private network"
    assert "--node-ip" in str(raised.value) and "nothing was changed" in str(raised.value)
    assert mgmt.writes == [] and job.workload.writes == []  # type: ignore[attr-defined]


SPEC = PrivateNetworkSpec.model_validate(PN)
BY_ID = PrivateNetworkSpec.model_validate({"vswitch": {"id": 7}, "subnet": "10.0.1.0/24"})


def _rec(vswitch: int = 7, membership: VSwitchMembership = VSwitchMembership.READY) -> HostPrivateNetwork:
    return HostPrivateNetwork(vswitch_id=vswitch, address="10.0.1.9", membership=membership)


@pytest.mark.parametrize(
    ("spec", "cluster", "record", "expect"),
    [
        (SPEC, PrivateNetworkStatus(vswitch_id=7, vlan=4000), _rec(), 4000),
        (SPEC, None, _rec(), 4000),  # the cluster's status lost in a move: the spec's VLAN, the host's record
        (BY_ID, PrivateNetworkStatus(vswitch_id=7, vlan=4001), _rec(), 4001),
        (BY_ID, None, _rec(), "VLAN"),  # named by id and not read yet
        (SPEC, PrivateNetworkStatus(vswitch_id=7, vlan=4000), None, "no private network record"),
        (SPEC, None, _rec(membership=VSwitchMembership.LEAVING), "leaving"),
        (BY_ID, PrivateNetworkStatus(vswitch_id=7, vlan=4001), _rec(vswitch=8), "its cluster on vSwitch 7"),
    ],
)
def test_the_recorded_interface_from_a_table(
    spec: PrivateNetworkSpec, cluster: PrivateNetworkStatus | None, record: HostPrivateNetwork | None, expect: Any
) -> None:
    got = private_network.recorded_interface(spec, cluster, record, "h1")
    if isinstance(expect, int):
        assert isinstance(got, private_network.VLANInterface)
        assert (got.vlan, got.address) == (expect, "10.0.1.9/24")
    else:
        assert isinstance(got, str) and expect in got
