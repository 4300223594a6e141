"""NVIDIA's DRA driver chart (dra-driver-nvidia-gpu 0.4.1) as the test worlds see it: rendered with the pinned
helm from the unmodified chart archive in ``../shared/upstream`` with capi-gpu's values.

Why render instead of writing the objects by hand: the worlds that bind pods to the shipped claim templates
must meet the chart's own DeviceClasses (their CEL, ``extendedResourceName``), or a template naming a class
the chart does not create, or selecting what its class excludes, would pass here and fail in a cluster.
A world whose operator installs the add-ons gets the chart through playbooks/addons.yml (helm install);
one that runs without them gets ``install``: every object of the same render applied as helm would create it,
so the kubelet-plugin DaemonSet that ``node_pods`` keys the NVIDIA plugin off is the chart's own.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from capi_gpu.kube import NAMESPACES, Kube, Res
from capi_gpu_sim import binaries

CHART = binaries.REPO.parent / "shared" / "upstream" / "dra-driver-nvidia-gpu-0.4.1.tgz"
VALUES = binaries.REPO / "config" / "dra-driver" / "values.yaml"
NAMESPACE = "nvidia-dra-driver-gpu"
RELEASE = "nvidia-dra-driver-gpu"  # playbooks/addons.yml dra_driver_release
# Kinds the chart renders that live outside a namespace (the rest go into the release namespace).
_CLUSTER_SCOPED = frozenset(
    {
        "ClusterRole",
        "ClusterRoleBinding",
        "DeviceClass",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
)


@functools.cache
def rendered(chart: Path = CHART) -> tuple[dict[str, Any], ...]:
    """``helm template`` of the chart, as the playbook installs it (release name, namespace, values)."""
    if not chart.exists():
        raise binaries.BinariesMissing(f"the chart archive is missing: {chart} (it comes with ../shared/upstream)")
    version = binaries.versions()["KUBERNETES_VERSION"]
    argv = [str(binaries.ensure_helm()), "template", RELEASE, str(chart), "-n", NAMESPACE]
    argv += ["-f", str(VALUES), "--kube-version", version]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return tuple(d for d in yaml.safe_load_all(out) if d)


def device_classes() -> list[dict[str, Any]]:
    """The chart's DeviceClasses (gpu.nvidia.com, mig.nvidia.com, vfio.gpu.nvidia.com)."""
    return [d for d in rendered() if d.get("kind") == "DeviceClass"]


def kubelet_plugin_daemonset() -> dict[str, Any]:
    """The chart's kubelet-plugin DaemonSet (``dra-driver-nvidia-gpu-kubelet-plugin``) with our values."""
    return next(
        d for d in rendered() if d.get("kind") == "DaemonSet" and d["metadata"]["name"].endswith("-kubelet-plugin")
    )


def resource(doc: dict[str, Any]) -> Res:
    group, _, version = str(doc["apiVersion"]).rpartition("/")
    kind = str(doc["kind"])
    lower = kind.lower()
    plural = lower[:-1] + "ies" if lower.endswith("y") else lower + ("es" if lower.endswith("s") else "s")
    return Res(group, version, plural, namespaced=kind not in _CLUSTER_SCOPED)


def install(kube: Kube) -> None:
    """``helm install`` of the render without helm's release record: the namespace, then every object."""
    kube.apply(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    for doc in rendered():
        res = resource(doc)
        kube.apply(res, doc, NAMESPACE if res.namespaced else None)
