"""The operator's ServiceAccount as a test uses it: a token from the TokenRequest API and a kubeconfig.

The release installs the ServiceAccount ``capi-gpu-controller-manager`` in ``capi-gpu-system`` with its
ClusterRoles and bindings (config/rbac, through `clusterctl init`); the pod runner mounts the manager's
own token. A test that wants to act as that identity (to see what the shipped role refuses) asks for a
token of its own here, as the kubelet asks for a pod's projected token.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import yaml

from capi_gpu_sim.controlplane import ControlPlane

SA_NAMESPACE = "capi-gpu-system"
SA_NAME = "capi-gpu-controller-manager"
TOKEN_SECONDS = 4 * 3600


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
