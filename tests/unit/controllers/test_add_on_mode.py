"""Add-on mode: a HetznerGPUCluster that names a Cluster whose infrastructureRef is another provider's (CAPH's
HetznerCluster) makes that Cluster its owner, as CAPI does for an infrastructureRef, so the gate, the add-ons,
the claim scaler and clusterctl move find it alike; it never sets an endpoint, a Load Balancer or
initialization.provisioned. A Cluster that doesn't exist yet is a False condition with an Event, and a wait."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.controllers import cluster_loop
from capi_gpu.kube import Obj
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

CAPH_CLUSTER: Obj = {
    "metadata": {"name": "caph", "uid": "uid-caph"},
    "spec": {
        "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "HetznerCluster", "name": "caph"},
        "controlPlaneEndpoint": {"host": "10.0.0.2", "port": 443},
    },
}


def _gpu_cluster(**spec: Any) -> Obj:
    body = {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}, **spec}
    return {"metadata": {"name": "caph-gpu", "generation": 1}, "spec": body}


def _deps(kube: FakeKube) -> Deps:
    settings = Settings(robot_url="http://127.0.0.1:9")
    return Deps(kube, settings, None, RobotClients(settings))  # type: ignore[arg-type]


def _conds(obj: Obj) -> dict[str, str]:
    return {c["type"]: f"{c['status']}/{c['reason']}" for c in (obj.get("status") or {}).get("conditions") or []}


async def test_attaches_to_the_named_cluster_as_its_owner_and_provisions_nothing_of_its_own() -> None:
    kube = FakeKube(("hetznergpuclusters", _gpu_cluster(clusterRef={"name": "caph"})), ("clusters", CAPH_CLUSTER))
    deps = _deps(kube)
    assert await cluster_loop.reconcile(deps, NS, "caph-gpu") == 0.2
    obj = kube.objs[("hetznergpuclusters", NS, "caph-gpu")]
    (owner,) = obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Cluster", "caph", "uid-caph")
    assert "controller" not in owner  # the Cluster's controller is CAPH's, not ours
    assert obj["metadata"]["labels"][domain.CLUSTER_NAME_LABEL] == "caph"
    await cluster_loop.reconcile(deps, NS, "caph-gpu")
    obj = kube.objs[("hetznergpuclusters", NS, "caph-gpu")]
    assert _conds(obj)["LoadBalancerReady"] == "True/AddOn"
    assert "controlPlaneEndpoint" not in obj["spec"]
    assert not (obj["status"].get("initialization") or {}).get("provisioned")
    assert len([w for w in kube.writes if w[1] == "hetznergpuclusters" and w[3] is None]) == 1  # the attach only


async def test_a_cluster_that_does_not_exist_yet_is_said_once_and_waited_for() -> None:
    kube = FakeKube(("hetznergpuclusters", _gpu_cluster(clusterRef={"name": "caph"})))
    deps = _deps(kube)
    assert await cluster_loop.reconcile(deps, NS, "caph-gpu") == 30.0
    obj = kube.objs[("hetznergpuclusters", NS, "caph-gpu")]
    assert _conds(obj)["Ready"] == "False/ClusterNotFound"
    assert "ownerReferences" not in obj["metadata"]
    writes = len(kube.writes)
    await cluster_loop.reconcile(deps, NS, "caph-gpu")
    assert len(kube.writes) == writes  # the same condition is not written again
    kube.put("clusters", CAPH_CLUSTER)
    await cluster_loop.reconcile(deps, NS, "caph-gpu")
    assert kube.objs[("hetznergpuclusters", NS, "caph-gpu")]["metadata"]["ownerReferences"][0]["uid"] == "uid-caph"


async def test_without_cluster_ref_it_waits_for_capi_to_adopt_it_as_before() -> None:
    kube = FakeKube(("hetznergpuclusters", _gpu_cluster()), ("clusters", CAPH_CLUSTER))
    await cluster_loop.reconcile(_deps(kube), NS, "caph-gpu")
    assert "ownerReferences" not in kube.objs[("hetznergpuclusters", NS, "caph-gpu")]["metadata"]


@pytest.mark.parametrize("how", ["spec.paused", "the Cluster's annotation", "its own annotation"])
async def test_nothing_is_attached_or_written_while_paused(how: str) -> None:
    cluster = copy.deepcopy(CAPH_CLUSTER)
    gpu = _gpu_cluster(clusterRef={"name": "caph"})
    if how == "spec.paused":
        cluster["spec"]["paused"] = True
    elif how == "the Cluster's annotation":
        cluster["metadata"]["annotations"] = {domain.PAUSED_ANNOTATION: ""}
    else:
        gpu["metadata"]["annotations"] = {domain.PAUSED_ANNOTATION: ""}
    kube = FakeKube(("hetznergpuclusters", gpu), ("clusters", cluster))
    assert await cluster_loop.reconcile(_deps(kube), NS, "caph-gpu") == 60.0
    assert kube.writes == []
