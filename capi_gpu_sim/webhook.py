"""Our validating webhook in the simulated world: the operator process serves it on loopback with a
certificate from the control plane's CA, and the real apiserver calls it.

The configuration is the shipped one (``config/webhook/manifests.yaml``), with what cert-manager and a
Service would supply in a cluster replaced: a loopback URL for the Service and the CA's PEM for the
injected caBundle. A namespace label can scope it, so tests sharing one apiserver only send their
own namespaces to it (it fails closed).
"""

from __future__ import annotations

import base64
import contextlib
import socket
from pathlib import Path
from typing import Any

import yaml

from capi_gpu.kube import Kube, NotFound, Res
from capi_gpu_sim import binaries, pki

MANIFEST = binaries.REPO / "config" / "webhook" / "manifests.yaml"
CONFIGS = Res("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations", namespaced=False)
INJECT_CA = "cert-manager.io/inject-ca-from"


def serving_cert(ca: pki.CA, directory: Path) -> Path:
    """tls.crt and tls.key for 127.0.0.1 in ``directory``: what ``capi-gpu run --webhook-cert-dir`` reads."""
    ca.serving("capi-gpu-webhook", ["localhost"], ["127.0.0.1"], out=directory)
    return directory


def configuration(ca: pki.CA, port: int, name: str, namespace_labels: dict[str, str] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(MANIFEST.read_text())
    doc["metadata"]["name"] = name
    doc["metadata"].get("annotations", {}).pop(INJECT_CA, None)
    for hook in doc["webhooks"]:
        path = hook["clientConfig"]["service"]["path"]
        hook["clientConfig"] = {
            "url": f"https://127.0.0.1:{port}{path}",
            "caBundle": base64.b64encode(ca.pem).decode(),
        }
        if namespace_labels:
            hook["namespaceSelector"] = {"matchLabels": dict(namespace_labels)}
    return doc


def install(
    kube: Kube, ca: pki.CA, port: int, name: str = "capi-gpu-sim", namespace_labels: dict[str, str] | None = None
) -> str:
    doc = configuration(ca, port, name, namespace_labels)
    with contextlib.suppress(NotFound):
        kube.delete(CONFIGS, name)
    kube.create(CONFIGS, doc)
    return name


def uninstall(kube: Kube, name: str) -> None:
    with contextlib.suppress(NotFound):
        kube.delete(CONFIGS, name)


def operator_args(port: int, cert_dir: Path) -> list[str]:
    return ["--webhook-port", str(port), "--webhook-address", "127.0.0.1", "--webhook-cert-dir", str(cert_dir)]


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0
