"""A Cluster owned by CAPH (syself/cluster-api-provider-hetzner v1.1.8), as far as a test world can have one.

CAPH's controller can't run here (it needs the hcloud API), so its objects are what CAPH leaves behind once
a cluster is provisioned: its real CRDs from ``../shared/upstream`` (with the contract label its release's
kustomization adds, ``cluster.x-k8s.io/v1beta1: v1beta1``, so CAPI core reads them by the v1beta1
contract), a ``HetznerCluster`` with the control-plane endpoint and ``status.ready: true``, and the
Cluster's ``infrastructureRef`` pointing at it. The GPU workers attach through our HetznerGPUCluster in
add-on mode (``spec.clusterRef``), exactly as the ``gpu-workers`` flavor writes it.
"""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

import yaml

from capi_gpu import domain
from capi_gpu.kube import Kube, Res
from capi_gpu_sim import binaries

ARCHIVE = (
    binaries.REPO.parent / "shared" / "upstream" / "cluster-api-provider-hetzner-v1.1.8-crds-templates-docs.tar.gz"
)
PREFIX = "cluster-api-provider-hetzner-v1.1.8/config/crd/bases/"
CONTRACT_LABEL = {"cluster.x-k8s.io/v1beta1": "v1beta1"}
HETZNER_CLUSTERS = Res("infrastructure.cluster.x-k8s.io", "v1beta1", "hetznerclusters")
KIND = "HetznerCluster"


def crds() -> list[dict[str, Any]]:
    """CAPH's CRDs as its release installs them."""
    out = []
    with tarfile.open(ARCHIVE) as tar:
        for member in tar.getmembers():
            if member.name.startswith(PREFIX) and member.name.endswith(".yaml"):
                fh = tar.extractfile(member)
                assert fh is not None
                for doc in yaml.safe_load_all(fh.read()):
                    if doc:
                        doc["metadata"].setdefault("labels", {}).update(CONTRACT_LABEL)
                        out.append(doc)
    return out


def install(kube: Kube, control_plane: Any) -> None:
    """CAPH's CRDs on the world's apiserver, each Established before anything uses it."""
    archive_present()
    control_plane.apply_crds(kube, crds())


def attach(docs: list[dict[str, Any]], cluster: str) -> list[dict[str, Any]]:
    """The dev flavor's objects with the Cluster's infrastructureRef on CAPH's HetznerCluster and our
    HetznerGPUCluster attached in add-on mode (``clusterRef``; no endpoint of its own)."""
    out = []
    for doc in docs:
        if doc["kind"] == "Cluster":
            doc["spec"]["infrastructureRef"] = {"apiGroup": domain.GROUP, "kind": KIND, "name": cluster}
        if doc["kind"] == "HetznerGPUCluster":
            doc["spec"]["clusterRef"] = {"name": cluster}
            for key in ("controlPlaneEndpoint", "controlPlaneLoadBalancer", "failureDomains"):
                doc["spec"].pop(key, None)
        out.append(doc)
    return out


def hetzner_cluster(name: str, namespace: str, host: str, port: int) -> dict[str, Any]:
    """The HetznerCluster of CAPH's hetzner-hcloud-control-planes flavor (its bases/hetzner-hetznerCluster.yaml,
    with the Secret names CAPH's templates use), its endpoint where the world's apiserver listens."""
    return {
        "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "hcloudNetwork": {"enabled": False},
            "controlPlaneRegions": ["fsn1"],
            "controlPlaneEndpoint": {"host": host, "port": port},
            "controlPlaneLoadBalancer": {"region": "fsn1"},
            "sshKeys": {
                "hcloud": [{"name": "cluster"}],
                "robotRescueSecretRef": {
                    "name": "robot-ssh",
                    "key": {"name": "sshkey-name", "publicKey": "ssh-publickey", "privateKey": "ssh-privatekey"},
                },
            },
            "hetznerSecretRef": {
                "name": "hcloud",
                "key": {
                    "hcloudToken": "hcloud",
                    "hetznerRobotUser": "robot-user",
                    "hetznerRobotPassword": "robot-password",
                },
            },
        },
    }


def mark_provisioned(kube: Kube, name: str, namespace: str) -> None:
    """What CAPH's controller writes once the Load Balancer and network exist (v1beta1 contract)."""
    kube.patch(HETZNER_CLUSTERS, name, {"status": {"ready": True}}, namespace, sub="status")


def archive_present() -> Path:
    assert ARCHIVE.is_file(), f"{ARCHIVE} missing: shared/upstream holds CAPH's CRDs (README there)"
    return ARCHIVE
