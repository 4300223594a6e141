"""The validating webhook: kopf's admission server refuses, at ``kubectl apply``, what the CRDs' CEL
rules can't see (a MIG layout the GPU can't hold, an old driver branch, a second host for one server).

The decisions live in ``provisioning.admission`` and are the controllers' own, so they keep working
when the webhook is down (failurePolicy Fail only stops our kinds from being written then; see
docs/webhook.md). Only a spec change is checked: an update of metadata alone (a finalizer, CAPI's
ownerReferences, clusterctl move's annotations) on an object created before the webhook existed must
never be blocked by what its spec already said. The handler ids are the URL paths config/webhook names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf

from capi_gpu import domain
from capi_gpu.controllers.webhook_tls import ReloadingWebhookServer
from capi_gpu.gpu import catalog
from capi_gpu.kube import ours
from capi_gpu.provisioning import admission

# handler id (the webhook's URL path) -> (plural, kind)
WEBHOOKS: dict[str, tuple[str, str]] = {
    "validate-hetznergpuhost": ("hetznergpuhosts", "HetznerGPUHost"),
    "validate-hetznergpumachine": ("hetznergpumachines", "HetznerGPUMachine"),
    "validate-hetznergpumachinetemplate": ("hetznergpumachinetemplates", "HetznerGPUMachineTemplate"),
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


def register(registry: kopf.OperatorRegistry) -> None:
    for handler_id, (plural, kind) in WEBHOOKS.items():
        kopf.on.validate(G, V, plural, id=handler_id, registry=registry, operations=["CREATE", "UPDATE"])(
            _handler(kind)
        )


def _handler(kind: str) -> Any:
    async def validate(body: kopf.Body, old: kopf.Body | None, operation: str | None, memo: Any, **_: Any) -> None:
        if operation == "UPDATE" and old is not None and old.get("spec") == body.get("spec"):
            return
        # Its own client: the shared pool can be busy with the writes this very webhook admits (run.make_deps).
        kube = memo.deps.webhook_kube or memo.deps.kube
        hosts = await kube.list(ours("hetznergpuhosts")) if kind == "HetznerGPUHost" else []
        found = admission.refusals(kind, dict(body), hosts, catalog.builtin_catalog())
        if found:
            raise kopf.AdmissionError("; ".join(str(r) for r in found), code=422)

    return validate
