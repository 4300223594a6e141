"""The validating webhook: kopf's admission server refuses, at ``kubectl apply``, what the CRDs' CEL
rules can't see (a MIG layout the GPU can't hold, an old driver branch, a second host for one server, a
chartRef the operator's flags don't allow).

The decisions live in ``provisioning.admission`` and are the controllers' own, so they keep working
when the webhook is down (failurePolicy Fail only stops our kinds from being written then; see
docs/webhook.md). Only a spec change is checked: an update of metadata alone (a finalizer, CAPI's
ownerReferences, clusterctl move's annotations) on an object created before the webhook existed must
never be blocked by what its spec already said. The handler ids are the URL paths config/webhook names.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import kopf

from capi_gpu import domain
from capi_gpu.controllers.webhook_tls import ReloadingWebhookServer
from capi_gpu.gpu import catalog
from capi_gpu.kube import AsyncKube, ours
from capi_gpu.provisioning import admission, chartref

# handler id (the webhook's URL path) -> (plural, kind)
WEBHOOKS: dict[str, tuple[str, str]] = {
    "validate-hetznergpuhost": ("hetznergpuhosts", "HetznerGPUHost"),
    "validate-hetznergpumachine": ("hetznergpumachines", "HetznerGPUMachine"),
    "validate-hetznergpumachinetemplate": ("hetznergpumachinetemplates", "HetznerGPUMachineTemplate"),
    "validate-hetznergpucluster": ("hetznergpuclusters", "HetznerGPUCluster"),
    "validate-hetznergpuclustertemplate": ("hetznergpuclustertemplates", "HetznerGPUClusterTemplate"),
}
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"  # as cert-manager writes them into the Secret
CERT_CHECK_S = 2.0  # two stat calls; the kubelet's own Secret sync takes up to a minute or so
G, V = domain.GROUP, domain.VERSION


def server(address: str, port: int, cert_dir: Path) -> kopf.WebhookServer:
    """Serves the certificate cert-manager (or the simulator's CA) issued, and a renewed one from the first
    handshake after the kubelet updates the mounted Secret (checked every ``CERT_CHECK_S``), without a
    restart; a renewal that doesn't load is logged and the previous certificate keeps serving."""
    return ReloadingWebhookServer(
        addr=address,
        port=port,
        certfile=cert_dir / CERT_FILE,
        pkeyfile=cert_dir / KEY_FILE,
        check_interval_s=CERT_CHECK_S,
    )


async def answer(
    review: dict[str, Any], handler_id: str, kube: AsyncKube, charts: chartref.Policy = chartref.DEFAULT_POLICY
) -> dict[str, Any]:
    """The AdmissionReview response for one request to ``/<handler_id>``: allowed, or refused with every
    reason at once (422). Only a spec change is checked (the module docstring says why)."""
    request = review.get("request") or {}
    out: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    reply = {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"), "kind": "AdmissionReview", "response": out}
    if handler_id not in WEBHOOKS:
        out.update(allowed=False, status={"code": 404, "message": f"no webhook at /{handler_id}"})
        return reply
    _plural, kind = WEBHOOKS[handler_id]
    body, old = request.get("object") or {}, request.get("oldObject")
    if request.get("operation") not in ("CREATE", "UPDATE"):
        return reply
    if request.get("operation") == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
        return reply
    # The objects a check compares against: every host (one per Robot server), every cluster (private networks).
    others = {"HetznerGPUHost": "hetznergpuhosts", "HetznerGPUCluster": "hetznergpuclusters"}
    hosts = await kube.list(ours(others[kind])) if kind in others else []
    if request.get("operation") == "CREATE":
        # The apiserver has stamped it already, perhaps in the same second as an older duplicate: a new
        # object is the younger of any two, whatever the tie-break would say.
        body = {**body, "metadata": {k: v for k, v in (body.get("metadata") or {}).items() if k != "creationTimestamp"}}
    found = admission.refusals(kind, dict(body), hosts, catalog.builtin_catalog(), charts)
    if found:
        out.update(allowed=False, status={"code": 422, "message": "; ".join(str(r) for r in found)})
    return reply


async def serve(
    server: kopf.WebhookServer,
    kube: AsyncKube,
    serving: asyncio.Event,
    charts: chartref.Policy = chartref.DEFAULT_POLICY,
) -> None:
    """Serve every webhook until cancelled, on every replica, leader or not: outside kopf, which runs only
    on the leader, so a failover never leaves our kinds without their webhook (failurePolicy Fail). Its own
    client (``kube``): on the operator's shared pool, a burst of the very writes it admits held every
    thread past the apiserver's 10 s timeout."""

    async def fn(request: Any, *, webhook: str | None = None, **_: Any) -> Any:
        return await answer(request, webhook or "", kube, charts)

    async for _config in server(fn):  # yields once it listens, then serves until cancelled
        serving.set()
