"""A standby host claimed by a machine of a cluster with ``spec.privateNetwork`` before the cluster loop
created the vSwitch: the host loop must not send it straight to the kubeadm join (it was prepared without a
cluster, so without the VLAN interface and --node-ip); it runs Configure again, and Configure waits, with
PrivateNetworkReady saying why, until the interface can be built (docs/private-network.md)."""

from __future__ import annotations

from fake_kube import NS, FakeKube
from test_host_move_safety import HOST, OS_SECRET, SECRETS, _deps, _host, _machine, _ready, _status, _stored

from capi_gpu.api.host import HostState
from capi_gpu.api.machine import HetznerGPUMachine
from capi_gpu.api.specs import InstallImageSpec
from capi_gpu.controllers import host_loop
from capi_gpu.controllers.host_context import Consumer
from capi_gpu.kube import Obj

PN = {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24"}


def _hgc() -> tuple[str, Obj]:
    spec = {
        "robotCredentials": {"name": "robot-credentials"},
        "sshKeys": {"rescue": {"name": "k"}},
        "privateNetwork": PN,
    }
    return (
        "hetznergpuclusters",
        {"metadata": {"name": "dev", "ownerReferences": [{"kind": "Cluster", "name": "dev"}]}, "spec": spec},
    )


async def test_a_standby_host_claimed_before_the_vswitch_exists_reconfigures_and_waits() -> None:
    prepared = Consumer(HetznerGPUMachine(), "", InstallImageSpec(), None, "v1.36.3", None, None).prepared
    status = _status(HostState.STANDBY)
    status.prepared = prepared
    host = _host(status, None)
    host["metadata"]["resourceVersion"] = "7"
    capi_cluster = ("clusters", {"metadata": {"name": "dev"}, "spec": {}})
    kube = FakeKube(
        ("hetznergpuhosts", host), *SECRETS, OS_SECRET, _machine("machine-uid-source"), _hgc(), capi_cluster
    )
    deps = _deps(kube)
    await host_loop.reconcile(deps, NS, HOST)
    stored = _stored(kube)["status"]
    assert (stored["state"], stored["step"]) == ("Provisioning", "Configure")  # not straight to Bootstrap
    await host_loop.reconcile(deps, NS, HOST)
    stored = _stored(kube)["status"]
    # Configure waits for the vSwitch (run, it would finish at once: this machine asks for no GPU stack)
    assert (stored["state"], stored["step"]) == ("Provisioning", "Configure")
    assert _ready(kube)["PrivateNetworkReady"] == "False/JoiningVSwitch"
