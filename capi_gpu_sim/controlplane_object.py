"""A stand-in ControlPlane object for the dev flavor, whose control plane is the harness apiserver.

CAPI core waits for a Cluster's control plane to be initialized before it connects to the workload
cluster (node refs, MachineHealthChecks). With no KubeadmControlPlane controller here, the dev cluster
points its ``controlPlaneRef`` at this externally managed control plane, which the dev tool marks
initialized, following the v1beta2 control-plane contract (``status.initialization``, version,
``externalManagedControlPlane``).
"""

from __future__ import annotations

from typing import Any

from capi_gpu.kube import Kube, Res

GROUP = "controlplane.sim.gpu.infrastructure.cluster.x-k8s.io"
KIND, PLURAL = "SimControlPlane", "simcontrolplanes"
RES = Res(GROUP, "v1alpha1", PLURAL)


def crd() -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}", "labels": {"cluster.x-k8s.io/v1beta2": "v1alpha1"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL, "singular": KIND.lower()},
            "versions": [
                {
                    "name": "v1alpha1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def install(kube: Kube, control_plane: Any) -> None:
    control_plane.apply_crds(kube, [crd()])


def mark_initialized(kube: Kube, name: str, namespace: str, version: str) -> None:
    kube.patch(
        RES,
        name,
        {
            "status": {
                "initialization": {"controlPlaneInitialized": True},
                "externalManagedControlPlane": True,
                "version": version,
                "ready": True,
            }
        },
        namespace,
        sub="status",
    )
