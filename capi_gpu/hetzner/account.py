"""Everything the process shares about one Robot account: budget, circuit breaker, server cache.

Every ``RobotClient`` built for the same Robot username, by any controller, gets the same
``RobotAccount`` from the registry, so the fleet shares one budget and one 401 stops them all. The
registry is keyed by username (several accounts work side by side); the first caller's ``share`` and
limits configure the account, later callers get it as it is.

``default_registry()`` is the process-wide one (metrics on prometheus_client's default registry);
tests build their own ``AccountRegistry`` with their own clock and ``CollectorRegistry``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping

from prometheus_client import REGISTRY as PROMETHEUS_DEFAULT
from prometheus_client import CollectorRegistry

from capi_gpu.hetzner import budget, budget_metrics, cache, circuit, models

VSWITCH_TTL_S = 5.0  # shorter than a poll (10 s): one read per vSwitch per pass of the fleet


class RobotAccount:
    """Shared per-account state. Controllers read ``circuit_open``/``circuit_reason`` for conditions."""

    def __init__(
        self,
        username: str,
        *,
        clock: budget.Clock,
        metrics_sink: budget_metrics.RobotMetrics | None,
        share: float = 1.0,
        limits: Mapping[budget.Family, budget.Limit] | None = None,
        server_ttl_s: float = 60.0,
    ) -> None:
        self.account_hash = budget_metrics.account_hash(username)
        self.budget = budget.AccountBudget(clock=clock, share=share, limits=limits)
        self.circuit = circuit.CircuitBreaker()
        self.servers = cache.ServerCache(clock=clock, ttl_s=server_ttl_s)
        # GET /vswitch/{id} answers for every member at once: the host loops of one pass share one read per
        # vSwitch (a short TTL, dropped by each change we send), not one poll per host (500/h for the account).
        self.clock = clock
        self.vswitch_ttl_s = VSWITCH_TTL_S
        self.vswitch_reads: dict[int, tuple[float, models.VSwitch]] = {}
        # GET /vswitch (the account's vSwitches, without members), read only before an add is sent: the
        # 5-vSwitches-per-server limit is counted over the others' cached reads. Dropped by a create or cancel.
        self.vswitch_list: tuple[float, list[models.VSwitch]] | None = None
        self.vswitch_changes: dict[int, int] = {}  # changes sent per vSwitch: a read begun before one is stale
        self.vswitch_gathering: dict[int, float] = {}  # vSwitch id -> since when an add waits for company
        self.vswitch_create_rest: dict[int, tuple[float, str]] = {}  # VLAN -> until when, Robot's refusal
        # Fingerprints known to exist in Robot: key ensure costs one lookup per process, not per host.
        self.known_keys: set[str] = set()
        self._metrics = metrics_sink
        self._locks: dict[tuple[asyncio.AbstractEventLoop, str], asyncio.Lock] = {}

    def lock(self, name: str) -> asyncio.Lock:
        """An account-wide asyncio lock for single-flight work (one per event loop)."""
        loop = asyncio.get_running_loop()
        for stale in [key for key in self._locks if key[0].is_closed()]:
            del self._locks[stale]
        return self._locks.setdefault((loop, name), asyncio.Lock())

    @property
    def circuit_open(self) -> bool:
        return self.circuit.circuit_open

    @property
    def circuit_reason(self) -> str | None:
        return self.circuit.reason

    def reset_credentials(self, new_fingerprint: str) -> bool:
        """Call when the credentials Secret changed (``circuit.credentials_fingerprint(user, pw)``)."""
        return self.circuit.reset_credentials(new_fingerprint)

    def count(self, family: budget.Family, outcome: budget_metrics.Outcome) -> None:
        if self._metrics is not None:
            self._metrics.count(family.value, outcome)


class AccountRegistry:
    def __init__(
        self,
        *,
        clock: budget.Clock = time.monotonic,
        prometheus: CollectorRegistry | None = None,
    ) -> None:
        self.clock = clock
        self._accounts: dict[str, RobotAccount] = {}
        self._lock = threading.Lock()
        self.metrics = budget_metrics.RobotMetrics(prometheus, self.accounts) if prometheus is not None else None

    def accounts(self) -> list[RobotAccount]:
        with self._lock:
            return list(self._accounts.values())

    def account(
        self,
        username: str,
        *,
        share: float = 1.0,
        limits: Mapping[budget.Family, budget.Limit] | None = None,
        server_ttl_s: float = 60.0,
    ) -> RobotAccount:
        with self._lock:
            found = self._accounts.get(username)
            if found is None:
                found = RobotAccount(
                    username,
                    clock=self.clock,
                    metrics_sink=self.metrics,
                    share=share,
                    limits=limits,
                    server_ttl_s=server_ttl_s,
                )
                self._accounts[username] = found
            return found


_default: AccountRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> AccountRegistry:
    """The process-wide registry; its metrics live on prometheus_client's default registry."""
    global _default  # noqa: PLW0603 - one registry per process is the point
    with _default_lock:
        if _default is None:
            _default = AccountRegistry(prometheus=PROMETHEUS_DEFAULT)
        return _default
