"""What the controllers share in one operator process: clients, the Robot budget, wake-ups, the clock.

One ``Deps`` per process, created at startup and handed to every handler through kopf's memo, so there
is one account-wide Robot budget and one Kubernetes connection pool, never one per object.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from capi_gpu.api import conditions
from capi_gpu.hetzner.robot import RobotClient
from capi_gpu.kube import SECRETS, AsyncKube, Obj, ours
from capi_gpu.provisioning import addons, ansible, hostkeys, ssh
from capi_gpu.runtime.settings import Settings

CLUSTERS = ours("hetznergpuclusters")


class AccessError(Exception):
    """A Secret the controller needs is missing or unusable; ``reason`` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def secret_value(secret: Obj, key: str, what: str) -> str:
    raw = (secret.get("data") or {}).get(key)
    if raw is None:
        name = secret["metadata"]["name"]
        raise AccessError("SecretInvalid", f"Secret {name} has no key {key!r} ({what})")
    try:
        text = base64.b64decode(raw).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise AccessError("SecretInvalid", f"Secret {secret['metadata']['name']} key {key!r} is not text") from exc
    # A PEM/OpenSSH key needs its final newline (sshd refuses a host key without it); other values are trimmed.
    return text.strip() + "\n" if "PRIVATE KEY-----" in text else text.strip()


@dataclass
class SecretCache:
    """The Secrets a whole fleet shares (Robot credentials, the SSH key), read at most once per ``ttl``.

    Every host pass needs both, and hosts name the same two: without this, 1,000 idle hosts read them
    2,000 times per resync (bench/scale.py). A rotated Secret is seen within ``ttl``, a deleted or
    created one too (absence is remembered like content). Concurrent misses share one read.
    """

    ttl: float
    now: Callable[[], float] = time.monotonic
    _entries: dict[tuple[str, str], tuple[float, Obj | None]] = field(default_factory=dict)
    _locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)

    async def get(self, kube: AsyncKube, namespace: str, name: str) -> Obj | None:
        key = (namespace, name)
        async with self._locks.setdefault(key, asyncio.Lock()):
            hit = self._entries.get(key)
            if hit is not None and self.now() - hit[0] < self.ttl:
                return hit[1]
            secret = await kube.get_or_none(SECRETS, name, namespace)
            self._entries[key] = (self.now(), secret)
            return secret


async def _rejected_before(kube: AsyncKube, namespace: str, secret_name: str, version: str) -> str | None:
    """The HetznerGPUCluster whose status says Robot rejected exactly this version of the Secret, if any."""
    for hgc in await kube.list(CLUSTERS, namespace):
        status = hgc.get("status") or {}
        uses = ((hgc.get("spec") or {}).get("robotCredentials") or {}).get("name") == secret_name
        reasons = {c.get("type"): c.get("reason") for c in status.get("conditions") or []}
        rejected = reasons.get(conditions.Type.ROBOT_CREDENTIALS_VALID) == conditions.Reason.CREDENTIALS_REJECTED
        if uses and rejected and status.get("credentialsHash") == version:
            return str(hgc["metadata"]["name"])
    return None


def secret_version(secret: Obj) -> str:
    """Which version of a Secret this is, without a thing derived from its content."""
    meta = secret.get("metadata") or {}
    return f"{meta.get('uid', '')}/{meta.get('resourceVersion', '')}"


@dataclass
class RobotClients:
    """One RobotClient per credentials Secret version; a changed Secret closes an open circuit.

    ``secrets`` caches what ``spec.robot`` names (the credentials and the SSH key Secret) for
    ``Timing.poll`` (10 s): a rotation takes effect within that.
    """

    settings: Settings
    _clients: dict[tuple[str, str, str], tuple[str, RobotClient]] = field(default_factory=dict)
    secrets: SecretCache = field(init=False)

    def __post_init__(self) -> None:
        self.secrets = SecretCache(ttl=self.settings.timing.poll)

    async def get(self, kube: AsyncKube, namespace: str, secret_name: str) -> RobotClient:
        secret = await self.secrets.get(kube, namespace, secret_name)
        if secret is None:
            raise AccessError("SecretMissing", f"Robot credentials Secret {namespace}/{secret_name} not found")
        user = secret_value(secret, "robot-user", "Robot webservice user")
        password = secret_value(secret, "robot-password", "Robot webservice password")
        fingerprint = hashlib.sha256(f"{user}\0{password}".encode()).hexdigest()
        base = self.settings.robot_url or "https://robot-ws.your-server.de"  # the operator's flag, never an object's
        key = (namespace, secret_name, base)
        cached = self._clients.get(key)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        if cached is not None:
            await cached[1].aclose()
        client = RobotClient(user, password, base_url=base, share=self.settings.robot_share)
        if cached is not None or client.account.circuit_open:
            # The Secret changed: close a circuit a 401 opened (it stays open for the same credentials).
            client.account.reset_credentials(client.credentials_fingerprint)
        elif (rejected := await _rejected_before(kube, namespace, secret_name, secret_version(secret))) is not None:
            # A 401 this process never saw: an earlier operator process had this very Secret version rejected
            # (the circuit lives in memory). Trying again would spend one of the three logins that block the IP.
            client.account.circuit.trip(
                client.credentials_fingerprint,
                f"Robot rejected this version of Secret {secret_name} before the operator restarted "
                f"(HetznerGPUCluster {rejected}); no Robot call until the Secret changes",
            )
        self._clients[key] = (fingerprint, client)
        return client

    async def close(self) -> None:
        for _, client in self._clients.values():
            await client.aclose()
        self._clients.clear()


@dataclass
class Wakeups:
    """Lets one controller nudge another object's loop instead of waiting for its next poll."""

    _events: dict[tuple[str, str, str], asyncio.Event] = field(default_factory=dict)

    def event(self, kind: str, namespace: str, name: str) -> asyncio.Event:
        return self._events.setdefault((kind, namespace, name), asyncio.Event())

    def wake(self, kind: str, namespace: str, name: str) -> None:
        self.event(kind, namespace, name).set()

    def wake_all(self, kind: str, namespace: str) -> None:
        """Every running loop of ``kind`` in ``namespace`` (e.g. all hosts once Robot credentials work again)."""
        for (k, ns, _), event in list(self._events.items()):
            if k == kind and ns == namespace:
                event.set()

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self._events.pop((kind, namespace, name), None)


def utcnow() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


@dataclass
class Deps:
    kube: AsyncKube
    settings: Settings
    runner: ansible.PlaybookRunner
    robots: RobotClients
    wakeups: Wakeups = field(default_factory=Wakeups)
    clock: Callable[[], datetime] = utcnow
    shell_factory: Callable[[ssh.Endpoint, ssh.Credentials], ssh.HostShell] = ssh.ParamikoShell
    addons: addons.AddonsInstaller | None = None
    """Installs each workload cluster's DRA add-ons (playbooks/addons.yml); None: the operator leaves them alone."""
    features_probed: dict[tuple[str, str], datetime] = field(default_factory=dict)
    """When this process last probed each cluster's (namespace, name) apiserver for the gate's fields."""
    provisioning: set[tuple[str, str]] = field(default_factory=set)
    """Hosts currently inspecting/provisioning (for the global limit)."""
    os_keys: dict[tuple[str, str], tuple[str, hostkeys.HostKeyPair]] = field(default_factory=dict)
    """Each host's OS host key pair by (namespace, name), with the host's uid: written once and never
    changed, so a pass reads its Secret only the first time (bench/scale.py: one GET per host per resync)."""
