"""The real CAPI core controllers drive our kinds: a MachineDeployment referencing a
HetznerGPUMachineTemplate yields a Machine and a cloned HetznerGPUMachine owned by it."""

from __future__ import annotations

import time
from typing import Any

import pytest

from capi_gpu import domain
from capi_gpu.kube import CAPI_CLUSTERS, CAPI_MACHINEDEPLOYMENTS, CAPI_MACHINES, SECRETS, Kube, ours

pytestmark = pytest.mark.integration


def wait_for(what: str, fn: Any, timeout: float = 60.0, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def make_cluster(kube: Kube, ns: str, name: str = "c1") -> None:
    kube.create(
        ours("hetznergpuclusters"),
        {
            "apiVersion": domain.API_VERSION,
            "kind": "HetznerGPUCluster",
            "metadata": {"name": name},
            "spec": {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}},
        },
        ns,
    )
    kube.create(
        CAPI_CLUSTERS,
        {
            "apiVersion": domain.CAPI_API_VERSION,
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"infrastructureRef": {"apiGroup": domain.GROUP, "kind": "HetznerGPUCluster", "name": name}},
        },
        ns,
    )


def test_machinedeployment_clones_hetznergpumachine(kube: Kube, namespace: str) -> None:
    make_cluster(kube, namespace)
    kube.create(
        SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "boot"},
            "type": "cluster.x-k8s.io/secret",
            "stringData": {"value": "#cloud-config\n"},
        },
        namespace,
    )
    kube.create(
        ours("hetznergpumachinetemplates"),
        {
            "apiVersion": domain.API_VERSION,
            "kind": "HetznerGPUMachineTemplate",
            "metadata": {"name": "gpu"},
            "spec": {"template": {"spec": {"gpu": {"layout": {"preset": "all-1g.24gb"}}}}},
        },
        namespace,
    )
    kube.create(
        CAPI_MACHINEDEPLOYMENTS,
        {
            "apiVersion": domain.CAPI_API_VERSION,
            "kind": "MachineDeployment",
            "metadata": {"name": "gpu"},
            "spec": {
                "clusterName": "c1",
                "replicas": 1,
                "selector": {"matchLabels": {"pool": "gpu"}},
                "template": {
                    "metadata": {"labels": {"pool": "gpu"}},
                    "spec": {
                        "clusterName": "c1",
                        "version": "v1.36.3",
                        "bootstrap": {"dataSecretName": "boot"},
                        "infrastructureRef": {
                            "apiGroup": domain.GROUP,
                            "kind": "HetznerGPUMachineTemplate",
                            "name": "gpu",
                        },
                        "readinessGates": [{"conditionType": domain.GPU_READY_CONDITION}],
                    },
                },
            },
        },
        namespace,
    )

    machine = wait_for("a Machine", lambda: next(iter(kube.list(CAPI_MACHINES, namespace)), None))
    infra_name = machine["spec"]["infrastructureRef"]["name"]

    def owned_clone() -> dict[str, Any] | None:
        hgm = kube.get_or_none(ours("hetznergpumachines"), infra_name, namespace)
        if not hgm:
            return None
        owners = hgm["metadata"].get("ownerReferences", [])
        if any(o["kind"] == "Machine" and o["name"] == machine["metadata"]["name"] for o in owners):
            return hgm
        return None

    hgm = wait_for("the clone to be owned by its Machine", owned_clone)
    assert hgm["metadata"]["labels"][domain.CLUSTER_NAME_LABEL] == "c1"
    assert hgm["metadata"]["annotations"]["cluster.x-k8s.io/cloned-from-name"] == "gpu"
    assert hgm["spec"]["gpu"]["layout"]["preset"] == "all-1g.24gb"
    # The readiness gate travels to the Machine; CAPI counts the missing GPUReady as not ready.
    assert machine["spec"]["readinessGates"] == [{"conditionType": "GPUReady"}]
