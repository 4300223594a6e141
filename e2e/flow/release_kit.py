"""What the release-install worlds check beyond the flow: the webhook's certificate renewed under load, the
leader killed mid-provisioning, and the apiserver's audit of the operator's ServiceAccount.

Renewals use cert-manager's own trigger (what `cmctl renew` does: the Certificate's ``Issuing`` condition
set True), so cert-manager issues, the kubelet stand-in refreshes the mounted Secret, and the operator must
serve the new certificate without a restart. The served certificate is read the way the apiserver reaches
it: through the webhook Service's ClusterIP, with the Service's DNS name as TLS server name.
"""

from __future__ import annotations

import base64
import datetime as dt
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from capi_gpu.kube import SECRETS, Res
from capi_gpu_sim import audit, release
from capi_gpu_sim.world import World

CERTIFICATES = Res("cert-manager.io", "v1", "certificates")
SERVICES = Res("", "v1", "services")
LEASES = Res("coordination.k8s.io", "v1", "leases")
SERVING_CERT = "capi-gpu-serving-cert"
SERVING_SECRET = "capi-gpu-webhook-service-cert"
WEBHOOK_SERVICE = "capi-gpu-webhook-service"
LEASE = "capi-gpu-leader"
NS = release.SYSTEM_NAMESPACE


def revision(world: World) -> int:
    cert = world.k.get(CERTIFICATES, SERVING_CERT, NS)
    return int((cert.get("status") or {}).get("revision") or 0)


def trigger_renewal(world: World) -> None:
    """cert-manager's manual renewal: the Issuing condition, as `cmctl renew` writes it."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cert = world.k.get(CERTIFICATES, SERVING_CERT, NS)
    conds = [c for c in (cert.get("status") or {}).get("conditions") or [] if c.get("type") != "Issuing"]
    conds.append(
        {
            "type": "Issuing",
            "status": "True",
            "reason": "ManuallyTriggered",
            "message": "Certificate re-issuance manually triggered",
            "lastTransitionTime": now,
        }
    )
    world.k.patch(CERTIFICATES, SERVING_CERT, {"status": {"conditions": conds}}, NS, sub="status")


def secret_cert(world: World) -> bytes:
    data = world.k.get(SECRETS, SERVING_SECRET, NS).get("data") or {}
    pem = base64.b64decode(data.get("tls.crt", "")).decode()
    return ssl.PEM_cert_to_DER_cert(pem.split("-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n")


def served_cert(world: World) -> bytes:
    """The leaf a TLS handshake with the webhook Service gets (verified against the CA cainjector injected)."""
    svc = world.k.get(SERVICES, WEBHOOK_SERVICE, NS)
    ip, port = svc["spec"]["clusterIP"], int(svc["spec"]["ports"][0]["port"])
    ca = base64.b64decode(world.k.get(SECRETS, SERVING_SECRET, NS)["data"]["ca.crt"]).decode()
    ctx = ssl.create_default_context(cadata=ca)
    with (
        socket.create_connection((ip, port), timeout=5) as raw,
        ctx.wrap_socket(raw, server_hostname=f"{WEBHOOK_SERVICE}.{NS}.svc") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


@dataclass
class Renewer:
    """Renews the serving certificate every ``every_s`` until ``count`` renewals are done or it is stopped;
    records how long each took until every operator replica served it."""

    world: World
    every_s: float = 60.0
    count: int = 2
    done: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Renewer:
        threading.Thread(target=self._run, name="renewer", daemon=True).start()
        return self

    def _run(self) -> None:
        while len(self.done) < self.count and not self._stop.wait(self.every_s):
            try:
                before, t0 = revision(self.world), time.monotonic()
                trigger_renewal(self.world)
                while revision(self.world) <= before and time.monotonic() - t0 < 60:
                    time.sleep(0.5)
                want = secret_cert(self.world)
                while time.monotonic() - t0 < 120:
                    if all(served_cert(self.world) == want for _ in range(4)):  # both replicas, round-robin
                        self.done.append(time.monotonic() - t0)
                        break
                    time.sleep(1.0)
                else:
                    self.errors.append(f"renewal {len(self.done) + 1}: not served 120 s after it was triggered")
            except Exception as exc:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stop.set()


def holder(world: World) -> str:
    lease = world.k.get_or_none(LEASES, LEASE, NS) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def crash_leader(world: World) -> str:
    """SIGKILL the leading replica's container (its whole cgroup); returns the pod's name."""
    assert world.released is not None
    pod_name = holder(world).split("_", 1)[0]
    world.released.crash_pod(pod_name)
    return pod_name


def handover(world: World, old_holder: str, timeout: float = 120.0) -> tuple[str, float]:
    """Seconds until another candidate holds the Lease."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        now = holder(world)
        if now and now != old_holder:
            return now, time.monotonic() - t0
        time.sleep(0.2)
    raise AssertionError(f"the Lease stayed with {old_holder!r} for {timeout:.0f}s")


def lease_timing(world: World) -> tuple[float, float]:
    """(leaseDurationSeconds, the renew period the operator uses: capi_gpu.leader's retry)."""
    from capi_gpu.leader import Elector

    spec = world.k.get(LEASES, LEASE, NS)["spec"]
    return float(spec["leaseDurationSeconds"]), float(Elector.retry_s)


def operator_audit(world: World, killed_at: dt.datetime | None = None) -> dict[str, Any]:
    """Counts from the apiserver's audit log: requests by the operator's ServiceAccount, its Forbidden ones,
    its refused writes (403, 422 or 5xx), and writes of our kinds (anyone's) failed by a webhook call.
    ``killed_at``: when the test SIGKILLed the leader; requests it had in flight then are counted apart."""
    every = audit.responses(audit.log_path(world.cp.workdir))
    ours = [r for r in every if r.user == audit.OPERATOR_USER]
    cut = [r for r in ours if killed_at is not None and audit.cut_by_client(r, killed_at)]
    ours = [r for r in ours if r not in cut]
    writes = {"create", "update", "patch", "delete"}
    return {
        "requests": len(ours) + len(cut),
        "cut_by_kill": cut,
        "forbidden": [r for r in ours if r.code == 403],
        # Refused: Forbidden, a webhook's denial, or a server error. A 422 without a webhook is kopf's first
        # metadata patch racing CAPI's own on a new HetznerGPUMachine; it retries, and it is counted apart.
        "refused_writes": [
            r
            for r in ours
            if r.verb in writes and (r.code == 403 or r.code >= 500 or "denied the request" in r.message)
        ],
        "invalid_writes": [r for r in ours if r.verb in writes and r.code == 422 and "denied" not in r.message],
        "webhook_failures": [r for r in every if r.code >= 500 and "webhook" in r.message],
    }
