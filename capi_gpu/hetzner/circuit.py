"""The 401 circuit breaker: one failed login stops every Robot call for the account.

Robot blocks the caller's IP for ten minutes after three failed logins, and that block would take
down every controller (and every other tool on that egress IP). So:

- A 401 opens the circuit. While open, every call raises ``RobotCircuitOpen`` and sends nothing.
- Only ``reset_credentials(new_fingerprint)`` closes it, and only with a fingerprint that differs from
  the one that failed; the cluster controller calls it when the credentials Secret changes. Clients
  still holding other credentials stay refused, so a stale client cannot burn a login either.
- Credentials that have not yet had a successful answer are *probed*: one request at a time, so that
  a burst of concurrent calls with a wrong password produces one 401, not twenty.

Each credential therefore gets at most one failed login before a human (or a Secret change) acts.

Fingerprints are keyed HMACs with a per-process random key: comparable in memory, useless if they
leak, and never derived into anything that is logged or exported.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from capi_gpu.hetzner import errors

_PROCESS_KEY = secrets.token_bytes(32)


def credentials_fingerprint(username: str, password: str) -> str:
    """Compare credentials without keeping or exposing them (HMAC-SHA256 with a per-process key)."""
    material = username.encode() + b"\0" + password.encode()
    return hmac.new(_PROCESS_KEY, material, hashlib.sha256).hexdigest()


class CircuitBreaker:
    """Per-account state: open or closed, why, and which credentials are known to work."""

    def __init__(self) -> None:
        self._open_reason: str | None = None
        self._failed_fingerprint: str | None = None
        self._allowed_fingerprint: str | None = None
        self._verified_fingerprint: str | None = None
        self._probe_locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    @property
    def circuit_open(self) -> bool:
        return self._open_reason is not None

    @property
    def reason(self) -> str | None:
        """Why the circuit is open, for the HetznerGPUCluster condition message (no secrets in it)."""
        return self._open_reason

    def check(self, fingerprint: str) -> None:
        """Raise ``RobotCircuitOpen`` if a request with these credentials must not be sent."""
        if self._open_reason is not None:
            raise errors.RobotCircuitOpen(self._open_reason)
        if self._allowed_fingerprint is not None and fingerprint != self._allowed_fingerprint:
            raise errors.RobotCircuitOpen("credentials changed; this client holds the old ones")

    def trip(self, fingerprint: str, reason: str) -> None:
        if self._open_reason is None:
            self._open_reason = reason
            self._failed_fingerprint = fingerprint
        if self._verified_fingerprint == fingerprint:
            self._verified_fingerprint = None

    def record_success(self, fingerprint: str) -> None:
        if self._open_reason is None:
            self._verified_fingerprint = fingerprint

    def reset_credentials(self, new_fingerprint: str) -> bool:
        """Close the circuit for changed credentials. Returns False (stays open) if they did not change."""
        if self._open_reason is not None and new_fingerprint == self._failed_fingerprint:
            return False
        self._open_reason = None
        self._failed_fingerprint = None
        self._allowed_fingerprint = new_fingerprint
        if self._verified_fingerprint != new_fingerprint:
            self._verified_fingerprint = None
        return True

    def _probe_lock(self) -> asyncio.Lock:
        # asyncio.Lock binds to one loop; tests (and a restarted operator) may bring another.
        loop = asyncio.get_running_loop()
        for known in [known for known in self._probe_locks if known.is_closed()]:
            del self._probe_locks[known]
        return self._probe_locks.setdefault(loop, asyncio.Lock())

    @asynccontextmanager
    async def admit(self, fingerprint: str) -> AsyncIterator[None]:
        """Let one request through. Unverified credentials go one at a time, re-checked after the wait."""
        self.check(fingerprint)
        if self._verified_fingerprint == fingerprint:
            yield
            return
        lock = self._probe_lock()
        await lock.acquire()
        held = True
        try:
            self.check(fingerprint)
            if self._verified_fingerprint == fingerprint:
                # The probe ahead of us succeeded: no need to keep the others queued behind us.
                lock.release()
                held = False
            yield
        finally:
            if held:
                lock.release()
