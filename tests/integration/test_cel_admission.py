"""The CEL rules the models declare, on the real kube-apiserver: each bad object (mutually exclusive
fields, a selector operator without or with values, a RAID level installimage lacks, an edited
immutable field) is refused at create or update with a message naming the field and the fix; the
mutable neighbours (a template's standby, a first providerID) still change; every sample in config/ is
accepted as it stands."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from capi_gpu.api.kinds import BY_KIND
from capi_gpu.kube import Invalid, Kube, ours

pytestmark = pytest.mark.integration

SAMPLES = Path(__file__).resolve().parents[2] / "config" / "samples"
Obj = dict[str, Any]


def samples() -> dict[str, Obj]:
    docs = (yaml.safe_load(p.read_text()) for p in sorted(SAMPLES.glob("*.yaml")) if p.name != "kustomization.yaml")
    return {d["kind"]: d for d in docs}


def with_(kind: str, change: Callable[[Obj], None]) -> Obj:
    obj = copy.deepcopy(samples()[kind])
    change(obj)
    return obj


def _machine_gpu(gpu: Obj) -> Callable[[Obj], None]:
    return lambda o: o["spec"].update(gpu=gpu)


def _selector(expr: Obj) -> Callable[[Obj], None]:
    return lambda o: o["spec"].update(hostSelector={"matchExpressions": [expr]})


# (id, kind, change, substrings the apiserver's message must hold: the field, then the fix).
BAD_CREATE = [
    (
        "preset-and-profiles",
        "HetznerGPUMachine",
        _machine_gpu({"layout": {"preset": "all-1g.24gb", "profiles": {"1g.24gb": 2}}}),
        ["spec.gpu.layout: Forbidden: preset and profiles are mutually exclusive", "not both"],
    ),
    (
        "dynamic-with-layout",
        "HetznerGPUMachine",
        _machine_gpu({"migMode": "Dynamic", "layout": {"profiles": {"1g.24gb": 2}}}),
        ["spec.gpu.layout: Forbidden: migMode Dynamic", "remove layout or use migMode Static"],
    ),
    (
        "standby-dynamic-with-layout",
        "HetznerGPUHost",
        lambda o: o["spec"].update(standby={"gpu": {"migMode": "Dynamic", "layout": {"preset": "all-1g.24gb"}}}),
        ["spec.standby.gpu.layout: Forbidden: migMode Dynamic", "remove layout"],
    ),
    (
        "swraid-level-7",
        "HetznerGPUMachine",
        lambda o: o["spec"].setdefault("installImage", {}).update(swraidLevel=7),
        ["spec.installImage.swraidLevel: Unsupported value: 7", '"0", "1", "5", "6", "10"'],
    ),
    (
        "in-without-values",
        "HetznerGPUMachine",
        _selector({"key": "gpu", "operator": "In"}),
        ["spec.hostSelector.matchExpressions[0].values: Required value: operator In and NotIn need", "use Exists"],
    ),
    (
        "notin-empty-values",
        "HetznerGPUMachineTemplate",
        lambda o: o["spec"]["template"]["spec"].update(
            hostSelector={"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": []}]}
        ),
        ["spec.template.spec.hostSelector.matchExpressions[0].values: Required value", "values: [rtx-pro-6000]"],
    ),
    (
        "exists-with-values",
        "HetznerGPUMachine",
        _selector({"key": "gpu", "operator": "Exists", "values": ["x"]}),
        ["spec.hostSelector.matchExpressions[0].values: Forbidden: operator Exists", "remove values"],
    ),
    (
        "size-all-not-last",
        "HetznerGPUMachine",
        lambda o: (
            o["spec"]
            .setdefault("installImage", {})
            .update(
                partitions=[
                    {"mount": "/", "fileSystem": "ext4", "size": "all"},
                    {"mount": "/data", "fileSystem": "xfs", "size": "100G"},
                ]
            )
        ),
        ["spec.installImage.partitions: Invalid value", "only the last partition may have size all"],
    ),
    (
        "add-on-with-endpoint",
        "HetznerGPUCluster",
        lambda o: o["spec"].update(clusterRef={"name": "caph"}, controlPlaneEndpoint={"host": "10.0.0.2"}),
        ["spec.controlPlaneEndpoint: Forbidden: controlPlaneEndpoint is the Cluster's own", "leave it unset"],
    ),
    (
        "add-on-with-load-balancer",
        "HetznerGPUCluster",
        lambda o: o["spec"].update(clusterRef={"name": "caph"}, controlPlaneLoadBalancer={"enabled": True}),
        ["spec.controlPlaneLoadBalancer: Forbidden", "leave it disabled"],
    ),
    (
        "add-on-with-failure-domains",
        "HetznerGPUCluster",
        lambda o: o["spec"].update(clusterRef={"name": "caph"}, failureDomains=["fsn1-dc14"]),
        ["spec.failureDomains: Forbidden", "set them there"],
    ),
    (
        "wwn-and-raid-wwns",
        "HetznerGPUHost",
        lambda o: o["spec"].update(rootDeviceHints={"wwn": "0x1", "raidWWNs": ["0x2", "0x3"]}),
        ["spec.rootDeviceHints: Forbidden: wwn and raidWWNs are mutually exclusive"],
    ),
]


@pytest.mark.parametrize(("kind", "change", "expected"), [r[1:] for r in BAD_CREATE], ids=[r[0] for r in BAD_CREATE])
def test_bad_object_is_refused_naming_field_and_fix(
    kube: Kube, namespace: str, kind: str, change: Callable[[Obj], None], expected: list[str]
) -> None:
    with pytest.raises(Invalid) as err:
        kube.create(ours(BY_KIND[kind].plural), with_(kind, change), namespace)
    for text in expected:
        assert text in err.value.message, err.value.message


@pytest.mark.parametrize("kind", sorted(samples()))
def test_every_sample_in_config_is_accepted(kube: Kube, namespace: str, kind: str) -> None:
    assert kube.create(ours(BY_KIND[kind].plural), samples()[kind], namespace)["metadata"]["uid"]


def test_server_number_is_immutable(kube: Kube, namespace: str) -> None:
    hosts = ours("hetznergpuhosts")
    host = kube.create(hosts, samples()["HetznerGPUHost"], namespace)
    name = host["metadata"]["name"]
    with pytest.raises(Invalid) as err:
        kube.patch(hosts, name, {"spec": {"serverNumber": 7654321}}, namespace)
    assert "spec.serverNumber: Invalid value" in err.value.message
    assert "serverNumber is immutable: create a new HetznerGPUHost for another server" in err.value.message
    # The rest of the spec stays editable.
    kube.patch(hosts, name, {"spec": {"maintenanceMode": True}}, namespace)
    assert kube.get(hosts, name, namespace)["spec"]["maintenanceMode"] is True


def test_template_spec_is_immutable_but_standby_is_not(kube: Kube, namespace: str) -> None:
    templates = ours("hetznergpumachinetemplates")
    name = kube.create(templates, samples()["HetznerGPUMachineTemplate"], namespace)["metadata"]["name"]
    edit = {"spec": {"template": {"spec": {"gpu": {"layout": {"preset": "all-2g.48gb"}}}}}}
    with pytest.raises(Invalid) as err:
        kube.patch(templates, name, edit, namespace)
    assert "spec.template: Invalid value" in err.value.message
    assert "create a new HetznerGPUMachineTemplate" in err.value.message
    kube.patch(templates, name, {"spec": {"standby": {"size": 3}}}, namespace)
    assert kube.get(templates, name, namespace)["spec"]["standby"]["size"] == 3


def test_provider_id_is_set_once(kube: Kube, namespace: str) -> None:
    machines = ours("hetznergpumachines")
    name = kube.create(machines, samples()["HetznerGPUMachine"], namespace)["metadata"]["name"]
    kube.patch(machines, name, {"spec": {"providerID": "hrobot://1234567"}}, namespace)
    with pytest.raises(Invalid) as err:
        kube.patch(machines, name, {"spec": {"providerID": "hrobot://7654321"}}, namespace)
    assert "spec.providerID: Invalid value" in err.value.message
    assert "providerID is set by the controller when it claims a host and can't change" in err.value.message


@pytest.mark.parametrize(
    ("kind", "edit", "fix"),
    [
        (
            "HetznerGPUClusterTemplate",
            {"spec": {"template": {"spec": {"failureDomains": ["fsn1-dc99"]}}}},
            "point the ClusterClass at it",
        ),
        (
            "HetznerGPURemediationTemplate",
            {"spec": {"template": {"spec": {"strategy": {"retryLimit": 5}}}}},
            "point the MachineHealthCheck's remediation templateRef at it",
        ),
    ],
)
def test_other_templates_are_immutable(kube: Kube, namespace: str, kind: str, edit: Obj, fix: str) -> None:
    res = ours(BY_KIND[kind].plural)
    name = kube.create(res, samples()[kind], namespace)["metadata"]["name"]
    with pytest.raises(Invalid) as err:
        kube.patch(res, name, edit, namespace)
    assert "spec.template: Invalid value" in err.value.message
    assert fix in err.value.message


def test_cluster_ref_is_set_at_creation_only(kube: Kube, namespace: str) -> None:
    res = ours("hetznergpuclusters")
    plain = kube.create(res, samples()["HetznerGPUCluster"], namespace)["metadata"]["name"]
    attached = with_("HetznerGPUCluster", lambda o: o["spec"].update(clusterRef={"name": "caph"}, failureDomains=[]))
    attached["metadata"]["name"] = "attached"
    kube.create(res, attached, namespace)
    for name, edit in ((plain, {"clusterRef": {"name": "caph"}}), ("attached", {"clusterRef": {"name": "other"}})):
        with pytest.raises(Invalid) as err:
            kube.patch(res, name, {"spec": edit}, namespace)
        assert "spec.clusterRef: Invalid value" in err.value.message and "create another" in err.value.message
