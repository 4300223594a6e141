"""spec.privateNetwork's CEL rules on the real kube-apiserver: the CRD with them installs; a vSwitch needs id
or vlan (not both, name only with vlan); the VLAN range and IPv4 patterns are the schema's; the field is set
at creation only, its vswitch and subnet never change, its addresses, mtu and routes may; a cluster with a
valid private network and one without are both accepted."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.kube import Invalid, Kube, ours

pytestmark = pytest.mark.integration

SAMPLE = Path(__file__).resolve().parents[2] / "config" / "samples" / "hetznergpucluster.yaml"
CLUSTERS = ours("hetznergpuclusters")
NETWORK: dict[str, Any] = {"vswitch": {"vlan": 4000, "name": "gpu-net"}, "subnet": "10.0.1.0/24"}


def cluster(name: str, network: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = copy.deepcopy(yaml.safe_load(SAMPLE.read_text()))
    body["metadata"] = {"name": name}
    if network is not None:
        body["spec"]["privateNetwork"] = network
    return body


@pytest.mark.parametrize(
    ("vswitch", "expected"),
    [
        ({"id": 1, "vlan": 4000}, "give id (an existing vSwitch) or vlan (one we create), exactly one of them"),
        ({}, "give id (an existing vSwitch) or vlan (one we create), exactly one of them"),
        ({"id": 1, "name": "x"}, "spec.privateNetwork.vswitch.name: Forbidden: name is for a vSwitch we create"),
        ({"vlan": 4092}, "spec.privateNetwork.vswitch.vlan: Invalid value: 4092"),
    ],
)
def test_a_bad_vswitch_is_refused(kube: Kube, namespace: str, vswitch: dict[str, Any], expected: str) -> None:
    with pytest.raises(Invalid) as err:
        kube.create(CLUSTERS, cluster("bad-vswitch", {**NETWORK, "vswitch": vswitch}), namespace)
    assert expected in err.value.message, err.value.message


def test_addresses_must_look_like_ipv4(kube: Kube, namespace: str) -> None:
    bad = {**NETWORK, "addresses": {"start": "10.0.1.300", "end": "10.0.1.9"}}
    with pytest.raises(Invalid) as err:
        kube.create(CLUSTERS, cluster("bad-address", bad), namespace)
    assert "spec.privateNetwork.addresses.start: Invalid value" in err.value.message


def test_vswitch_and_subnet_are_fixed_the_rest_may_change(kube: Kube, namespace: str) -> None:
    name = kube.create(CLUSTERS, cluster("pn-fixed", NETWORK), namespace)["metadata"]["name"]
    got = kube.get(CLUSTERS, name, namespace)["spec"]["privateNetwork"]
    assert got["mtu"] == 1400
    for edit in ({"subnet": "10.0.2.0/24"}, {"vswitch": {"vlan": 4001}}):
        with pytest.raises(Invalid) as err:
            kube.patch(CLUSTERS, name, {"spec": {"privateNetwork": edit}}, namespace)
        assert "privateNetwork.vswitch and privateNetwork.subnet can't change" in err.value.message
    more = {"addresses": {"start": "10.0.1.10", "end": "10.0.1.250"}, "mtu": 1350, "routes": ["10.0.0.0/16"]}
    kube.patch(CLUSTERS, name, {"spec": {"privateNetwork": more}}, namespace)
    assert kube.get(CLUSTERS, name, namespace)["spec"]["privateNetwork"]["mtu"] == 1350
    with pytest.raises(Invalid) as err:
        kube.patch(CLUSTERS, name, {"spec": {"privateNetwork": None}}, namespace)
    assert "privateNetwork is set when the cluster is created and can't be added or removed later" in err.value.message


def test_it_cannot_be_added_later(kube: Kube, namespace: str) -> None:
    name = kube.create(CLUSTERS, cluster("pn-later", None), namespace)["metadata"]["name"]
    with pytest.raises(Invalid) as err:
        kube.patch(CLUSTERS, name, {"spec": {"privateNetwork": NETWORK}}, namespace)
    assert "can't be added or removed later" in err.value.message
    kube.patch(CLUSTERS, name, {"spec": {"failureDomains": ["fsn1-dc14", "nbg1-dc3"]}}, namespace)
