"""The operator's own identity in the simulated world: the shipped RBAC and a ServiceAccount token.

Why: the world runs the operator with the admin kubeconfig by default, which proves nothing about the
ClusterRoles we ship. ``operator_kubeconfig`` applies ``config/rbac/*.yaml`` exactly as written (the
ServiceAccount ``capi-gpu-controller-manager`` in ``capi-gpu-system``, its ClusterRoles and bindings),
asks the TokenRequest API (``serviceaccounts/<sa>/token``) for a token, as the kubelet does for a pod's
projected token, and writes a kubeconfig that authenticates with it. An operator started with that
kubeconfig can do exactly what the shipped role grants; anything more is a Forbidden in its log.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import httpx
import yaml

from capi_gpu.kube import NAMESPACES, Kube, Res
from capi_gpu_sim import binaries
from capi_gpu_sim.controlplane import ControlPlane

RBAC_DIR = binaries.REPO / "config" / "rbac"
SA_NAMESPACE = "capi-gpu-system"
SA_NAME = "capi-gpu-controller-manager"
TOKEN_SECONDS = 4 * 3600


def _res(doc: dict[str, Any]) -> Res:
    group, _, version = doc["apiVersion"].rpartition("/")
    kind = doc["kind"]
    plural = kind.lower() + "s"
    return Res(group, version, plural, namespaced=kind not in ("ClusterRole", "ClusterRoleBinding"))


def shipped_rbac() -> list[dict[str, Any]]:
    """Every object the rbac kustomization lists, in its order."""
    kustomization = yaml.safe_load((RBAC_DIR / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs.extend(d for d in yaml.safe_load_all((RBAC_DIR / name).read_text()) if d)
    return docs


def apply_rbac(kube: Kube) -> None:
    kube.apply(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SA_NAMESPACE}})
    for doc in shipped_rbac():
        kube.apply(_res(doc), doc, doc["metadata"].get("namespace"))


def request_token(cp: ControlPlane, namespace: str = SA_NAMESPACE, name: str = SA_NAME) -> str:
    """A bound token for the ServiceAccount from the TokenRequest API (asked with the admin token)."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS},
    }
    url = f"{cp.url}/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
    tls = ssl.create_default_context(cafile=str(cp.ca.cert_path))
    with httpx.Client(verify=tls, headers={"Authorization": f"Bearer {cp.token}"}) as http:
        answer = http.post(url, json=body, timeout=30)
    answer.raise_for_status()
    token: str = answer.json()["status"]["token"]
    return token


def service_account_kubeconfig(cp: ControlPlane, path: Path) -> Path:
    """A kubeconfig (mode 0600) that authenticates as the ServiceAccount, with a token of its own."""
    doc = cp.kubeconfig_dict(token=request_token(cp), user=f"system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}")
    path.touch(mode=0o600)
    path.chmod(0o600)  # before the token goes in
    path.write_text(yaml.safe_dump(doc))
    return path


def operator_kubeconfig(cp: ControlPlane, kube: Kube, path: Path) -> Path:
    """Apply the shipped RBAC, then ``service_account_kubeconfig``."""
    apply_rbac(kube)
    return service_account_kubeconfig(cp, path)
