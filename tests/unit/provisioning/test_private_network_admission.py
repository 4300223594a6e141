"""Admission of spec.privateNetwork: a bad range is refused at the webhook with the field and the fix (the
model's own rule, as a controller parsing the object would find it), a second cluster creating the same VLAN
or overlapping addresses on one vSwitch is refused as PrivateNetworkConflict (the webhook lists clusters for
it), a cluster template is checked under its path, and clusters without a private network pass as before."""

from __future__ import annotations

from typing import Any

from capi_gpu.api.conditions import Reason
from capi_gpu.controllers import webhook
from capi_gpu.gpu import catalog
from capi_gpu.provisioning import admission

CAT = catalog.builtin_catalog()
API = "infrastructure.cluster.x-k8s.io/v1alpha1"
BASE_SPEC: dict[str, Any] = {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}}
NETWORK: dict[str, Any] = {"vswitch": {"vlan": 4000}, "subnet": "10.0.1.0/24"}


def cluster(name: str, network: dict[str, Any] | None = None) -> dict[str, Any]:
    spec = {**BASE_SPEC, **({"privateNetwork": network} if network is not None else {})}
    return {"apiVersion": API, "kind": "HetznerGPUCluster", "metadata": {"name": name, "namespace": "ns"}, "spec": spec}


def test_a_cluster_without_a_private_network_passes() -> None:
    assert admission.refusals("HetznerGPUCluster", cluster("a"), [cluster("b", NETWORK)], CAT) == []


def test_a_valid_private_network_passes() -> None:
    assert admission.refusals("HetznerGPUCluster", cluster("a", NETWORK), [cluster("b")], CAT) == []


def test_a_range_over_the_gateway_is_refused_with_the_fix() -> None:
    bad = {**NETWORK, "addresses": {"start": "10.0.1.1", "end": "10.0.1.50"}}
    [found] = admission.refusals("HetznerGPUCluster", cluster("a", bad), [], CAT)
    assert found.field == "spec.privateNetwork"
    assert "addresses.start 10.0.1.1 is the subnet's gateway (Hetzner's convention): start at 10.0.1.2" in found.message


def test_a_second_cluster_creating_the_same_vlan_is_a_conflict() -> None:
    [found] = admission.refusals("HetznerGPUCluster", cluster("a", NETWORK), [cluster("b", NETWORK)], CAT)
    assert (found.field, found.reason) == ("spec.privateNetwork", Reason.PRIVATE_NETWORK_CONFLICT)
    assert "name it by id here" in found.message


def test_a_template_is_checked_under_its_path() -> None:
    bad = {**NETWORK, "subnet": "10.0.1.7/24"}
    body = {
        "apiVersion": API,
        "kind": "HetznerGPUClusterTemplate",
        "metadata": {"name": "t"},
        "spec": {"template": {"spec": {**BASE_SPEC, "privateNetwork": bad}}},
    }
    [found] = admission.refusals("HetznerGPUClusterTemplate", body, [], CAT)
    assert found.field == "spec.template.spec.privateNetwork"
    assert "write it as 10.0.1.0/24" in found.message


async def test_the_webhook_compares_with_the_clusters_it_lists() -> None:
    listed: list[Any] = []

    class Clusters:
        async def list(self, resource: Any, *_: Any) -> list[dict[str, Any]]:
            listed.append(resource)
            return [cluster("b", NETWORK)]

    review = {
        "apiVersion": "admission.k8s.io/v1",
        "request": {"uid": "1", "operation": "CREATE", "object": cluster("a", NETWORK)},
    }
    out = await webhook.answer(review, "validate-hetznergpucluster", Clusters())  # type: ignore[arg-type]
    assert out["response"]["allowed"] is False
    assert "PrivateNetworkConflict" in out["response"]["status"]["message"]
    assert "hetznergpuclusters" in str(listed)
