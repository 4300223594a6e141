"""Leader election by a ``coordination.k8s.io`` Lease, as controller-runtime's ``--leader-elect`` does it.

Why a Lease and not kopf peering: kopf's peering needs the cluster-scoped ``kopf.dev`` CRDs, which every
kopf operator in the cluster shares. Shipped inside our provider components, ``clusterctl delete
--include-crd`` would delete them, and every other kopf operator's peering objects with them. A Lease is
a built-in kind, lives in our own namespace, and is what every other CAPI provider uses.

The rules are client-go's (tools/leaderelection): a record is expired when it has not *changed* for its
``leaseDurationSeconds`` as timed by our own monotonic clock (never by comparing the holder's
``renewTime`` with our wall clock, which would trust two clocks to agree); a write carries the
``resourceVersion`` read, so two candidates can never both win; a leader that cannot renew within the
renew deadline stops acting (the caller ends the process, and the pod restarts as a candidate).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import urllib3

from capi_gpu.kube import Conflict, Kube, KubeError, Res

LEASES = Res("coordination.k8s.io", "v1", "leases")
LOG = logging.getLogger(__name__)


class Action(Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # ours
    TAKE = "take"  # someone else's, expired or released
    WAIT = "wait"  # someone else's and alive


def decide(lease: dict[str, Any] | None, me: str, unchanged_for_s: float) -> Action:
    """What a candidate does with the Lease as read. ``unchanged_for_s``: how long (our clock) the
    holder's record has looked the same to us."""
    if lease is None:
        return Action.CREATE
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    if holder == me:
        return Action.RENEW
    if not holder:  # released by a leader that stopped cleanly
        return Action.TAKE
    duration = spec.get("leaseDurationSeconds") or 0
    return Action.TAKE if unchanged_for_s > duration else Action.WAIT


def timing_problem(lease_s: float, renew_deadline_s: float, retry_s: float) -> str | None:
    """client-go's rule: the Lease outlives the renew deadline, which outlives a retry (with its 1.2 jitter),
    so a leader gives up acting before anyone else may take over. None when the three agree."""
    if round(lease_s) < 1:
        return f"--leader-elect-lease-duration {lease_s}s: the Lease counts whole seconds, at least 1"
    if not renew_deadline_s < round(lease_s):
        return f"--leader-elect-renew-deadline {renew_deadline_s}s must be shorter than the lease duration {lease_s}s"
    if not retry_s * 1.2 < renew_deadline_s:
        return f"--leader-elect-retry-period {retry_s}s (x1.2 jitter) must be shorter than the renew deadline"
    return None


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Elector:
    """One candidate. ``acquire`` returns once we lead; ``keep`` renews until stopped or lost."""

    kube: Kube
    namespace: str
    name: str
    identity: str
    duration_s: int = 15  # controller-runtime's defaults: 15 s lease, 10 s renew deadline, 2 s retry
    renew_deadline_s: float = 10.0
    retry_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    lost: bool = False
    _seen: tuple[Any, ...] = ()
    _seen_at: float = field(default=0.0)
    _next_try_s: float = field(default=2.0)

    def try_once(self) -> bool:
        """One read and at most one write; True when we hold the Lease afterwards."""
        try:
            lease = self.kube.get_or_none(LEASES, self.name, self.namespace)
            record = () if lease is None else (lease["spec"].get("holderIdentity"), lease["spec"].get("renewTime"))
            if record != self._seen:
                self._seen, self._seen_at = record, self.clock()
            action = decide(lease, self.identity, self.clock() - self._seen_at)
            if action is Action.WAIT:
                assert lease is not None
                left = float(lease["spec"].get("leaseDurationSeconds") or 0) - (self.clock() - self._seen_at)
                self._next_try_s = min(self.retry_s, max(left, 0.0) + 0.05)
                return False
            now = _micro_now()
            spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_s, "renewTime": now}
            if action is Action.CREATE:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": now, "leaseTransitions": 0},
                }
                self.kube.create(LEASES, body, self.namespace)
                return True
            assert lease is not None
            if action is Action.TAKE:
                spec |= {"acquireTime": now, "leaseTransitions": (lease["spec"].get("leaseTransitions") or 0) + 1}
            # replace carries the resourceVersion read: a competing write in between is a Conflict.
            self.kube.replace(LEASES, {**lease, "spec": {**lease["spec"], **spec}}, self.namespace)
            return True
        except Conflict:
            return False
        except (KubeError, OSError, urllib3.exceptions.HTTPError) as exc:
            # An apiserver out of reach is a failed try, not the end of the process (urllib3's MaxRetryError
            # used to escape here and take the standby, probes and all, down with it).
            LOG.warning("leader election: lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    async def acquire(self) -> None:
        LOG.info("leader election: waiting for lease %s/%s as %s", self.namespace, self.name, self.identity)
        while True:
            self._next_try_s = self.retry_s
            if await asyncio.to_thread(self.try_once):
                break
            # At the moment the holder's record expires rather than up to a retry later: a failover takes
            # the Lease's duration plus at most one retry (the lag in seeing the holder's last renewal).
            await asyncio.sleep(self._next_try_s)
        LOG.info("leader election: acquired lease %s/%s", self.namespace, self.name)

    async def keep(self, stop_flag: asyncio.Event) -> None:
        """Renew every ``retry_s``; when no renewal succeeded for ``renew_deadline_s``, mark the lease
        lost and set ``stop_flag`` (the operator stops; another candidate takes over after expiry)."""
        last_ok = time.monotonic()
        while not stop_flag.is_set():
            await asyncio.sleep(self.retry_s)
            if stop_flag.is_set():
                break
            if await asyncio.to_thread(self.try_once):
                last_ok = time.monotonic()
            elif time.monotonic() - last_ok > self.renew_deadline_s:
                LOG.error("leader election: lost lease %s/%s; stopping", self.namespace, self.name)
                self.lost = True
                stop_flag.set()

    def release(self) -> None:
        """On a clean stop: blank the holder so a successor need not wait out the lease."""
        try:
            lease = self.kube.get_or_none(LEASES, self.name, self.namespace)
            if lease is not None and lease["spec"].get("holderIdentity") == self.identity:
                lease["spec"] |= {"holderIdentity": None, "renewTime": None}
                self.kube.replace(LEASES, lease, self.namespace)
        except KubeError as exc:
            LOG.warning("leader election: release of %s/%s: %s", self.namespace, self.name, exc)
