"""A TTL cache of ``GET /server`` for the whole account, refreshed by one call at a time.

``GET /server`` and ``GET /server/{n}`` share 200 requests per hour. A fleet-wide status refresh of
1,000 hosts must therefore cost one list call, not 1,000 gets. Concurrent readers of a stale cache
share one refresh (single flight); a refresh that the budget defers, or that fails transiently,
serves the previous list for up to ``max_stale_s`` rather than failing every reconcile at once.

Servers the list did not contain are remembered as missing until the next refresh, so a host whose
server was cancelled costs one ``GET /server/{n}`` per TTL, not one per reconcile.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from types import MappingProxyType

from capi_gpu.hetzner import errors, models

Clock = Callable[[], float]
Fetch = Callable[[], Awaitable[list[models.Server]]]


class ServerCache:
    def __init__(self, *, clock: Clock, ttl_s: float = 60.0, max_stale_s: float = 900.0) -> None:
        self.clock = clock
        self.ttl_s = ttl_s
        self.max_stale_s = max_stale_s
        self._servers: dict[int, models.Server] = {}
        self._missing: set[int] = set()
        self._fetched_at: float | None = None
        self._locks: dict[asyncio.AbstractEventLoop, asyncio.Lock] = {}

    @property
    def fetched_at(self) -> float | None:
        return self._fetched_at

    def _age(self) -> float | None:
        return None if self._fetched_at is None else self.clock() - self._fetched_at

    def fresh(self) -> bool:
        age = self._age()
        return age is not None and age < self.ttl_s

    def _lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        for known in [known for known in self._locks if known.is_closed()]:
            del self._locks[known]
        return self._locks.setdefault(loop, asyncio.Lock())

    def store(self, servers: Iterable[models.Server]) -> None:
        self._servers = {server.server_number: server for server in servers}
        self._missing.clear()
        self._fetched_at = self.clock()

    def update(self, server: models.Server) -> None:
        """Write through a change we made (a rename) without another list call."""
        if self._fetched_at is not None:
            # Copy on write: views handed out earlier stay consistent snapshots.
            self._servers = {**self._servers, server.server_number: server}
            self._missing.discard(server.server_number)

    def mark_missing(self, server_number: int) -> None:
        if server_number in self._servers:
            self._servers = {n: s for n, s in self._servers.items() if n != server_number}
        self._missing.add(server_number)

    def is_known_missing(self, server_number: int) -> bool:
        return server_number in self._missing

    def invalidate(self) -> None:
        self._fetched_at = None

    async def servers(self, fetch: Fetch) -> Mapping[int, models.Server]:
        """The account's servers by number (a read-only view); refreshed through ``fetch`` after the TTL."""
        if self.fresh():
            return MappingProxyType(self._servers)
        async with self._lock():
            if self.fresh():  # someone else refreshed while we waited
                return MappingProxyType(self._servers)
            try:
                self.store(await fetch())
            except (errors.RobotRequeue, errors.RobotTransientError):
                age = self._age()
                if age is None or age > self.max_stale_s:
                    raise
        return MappingProxyType(self._servers)
