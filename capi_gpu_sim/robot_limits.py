"""The Robot simulator's clock, endpoint table, rate limits, login blocking and faults.

These follow the documented behaviour (``shared/reference/hetzner.md``), independently of the
client's budget (``capi_gpu.hetzner.budget``): the sim counts *per endpoint* with the limits of the
doc tables, so a client whose families were drawn wrong gets a 403 here.

Decisions the doc leaves open, made strict so a client cannot get away with more than Robot might
allow:

- Windows slide (any 3,600 s, not clock hours). Requests answered 403 or 401 are not counted.
- Three failed logins from one IP within ten minutes block that IP for ten minutes; during the block
  every request gets 401, even with good credentials, and a success does not clear earlier failures.
- The sim counts per username (the doc does not say whether Robot counts per user or per IP).

Time is *sim time*: real seconds times ``compression``. Windows, the login block and every delay are
in sim seconds, so with compression 600 an hour-long window lasts six real seconds. The one number a
client acts on, a 403's ``interval``, is said in its own (real) seconds: the window's real length, so a
client that waits it out waits as long as the window lasts (3600 at compression 1, 6 at 600).
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

HOUR = 3600.0
DAY = 86400.0
LOGIN_FAILURES_TO_BLOCK = 3
LOGIN_BLOCK_S = 600.0


class SimClock:
    """Sim seconds since start: ``(real elapsed) * compression + manual advances``."""

    def __init__(self, compression: float = 1.0, *, epoch: float | None = None) -> None:
        if compression <= 0:
            raise ValueError("compression must be positive")
        self.compression = compression
        self._start = time.monotonic()
        self._epoch = time.time() if epoch is None else epoch
        self._offset = 0.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return (time.monotonic() - self._start) * self.compression + self._offset

    def wall(self) -> float:
        """Unix time in the sim's world, for dates Robot prints."""
        return self._epoch + self.now()

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._offset += seconds

    def real_seconds(self, sim_seconds: float) -> float:
        return sim_seconds / self.compression


@dataclass(frozen=True)
class Endpoint:
    method: str
    pattern: re.Pattern[str]
    name: str
    max_requests: int
    window_s: float


def _ep(method: str, pattern: str, name: str, max_requests: int, window_s: float = HOUR) -> Endpoint:
    return Endpoint(method, re.compile(pattern + r"$"), name, max_requests, window_s)


_N = r"/(?P<n>[^/]+)"
# Documented limits per endpoint (hetzner.md §1.3). Order matters: first match wins.
ENDPOINTS: tuple[Endpoint, ...] = (
    _ep("GET", r"^/server", "GET /server", 200),
    _ep("GET", r"^/server" + _N + "/cancellation", "GET /server/{n}/cancellation", 200),
    _ep("POST", r"^/server" + _N + "/cancellation", "POST /server/{n}/cancellation", 200),
    _ep("GET", r"^/server" + _N, "GET /server/{n}", 200),
    _ep("POST", r"^/server" + _N, "POST /server/{n}", 200),
    _ep("GET", r"^/reset", "GET /reset", 500),
    _ep("GET", r"^/reset" + _N, "GET /reset/{n}", 500),
    _ep("POST", r"^/reset" + _N, "POST /reset/{n}", 50),
    _ep("GET", r"^/boot" + _N + "/rescue", "GET /boot/{n}/rescue", 500),
    _ep("POST", r"^/boot" + _N + "/rescue", "POST /boot/{n}/rescue", 500),
    _ep("DELETE", r"^/boot" + _N + "/rescue", "DELETE /boot/{n}/rescue", 500),
    _ep("GET", r"^/boot" + _N + "/rescue/last", "GET /boot/{n}/rescue/last", 500),
    _ep("GET", r"^/key", "GET /key", 500),
    _ep("POST", r"^/key", "POST /key", 200),
    _ep("GET", r"^/key/(?P<fp>[^/]+)", "GET /key/{fp}", 500),
    _ep("POST", r"^/key/(?P<fp>[^/]+)", "POST /key/{fp}", 200),
    _ep("DELETE", r"^/key/(?P<fp>[^/]+)", "DELETE /key/{fp}", 200),
    _ep("GET", r"^/order/server/product", "GET /order/server/product", 500),
    _ep("GET", r"^/order/server/product/(?P<id>[^/]+)", "GET /order/server/product/{id}", 500),
    _ep("POST", r"^/order/server/transaction", "POST /order/server/transaction", 20, DAY),
    _ep("GET", r"^/order/server/transaction", "GET /order/server/transaction", 500),
    _ep("GET", r"^/order/server/transaction/(?P<id>[^/]+)", "GET /order/server/transaction/{id}", 500),
    _ep("GET", r"^/vswitch", "GET /vswitch", 500),
    _ep("POST", r"^/vswitch", "POST /vswitch", 100),
    _ep("GET", r"^/vswitch/(?P<id>\d+)", "GET /vswitch/{id}", 500),
    _ep("POST", r"^/vswitch/(?P<id>\d+)", "POST /vswitch/{id}", 100),
    _ep("DELETE", r"^/vswitch/(?P<id>\d+)", "DELETE /vswitch/{id}", 100),
    _ep("POST", r"^/vswitch/(?P<id>\d+)/server", "POST /vswitch/{id}/server", 100),
    _ep("DELETE", r"^/vswitch/(?P<id>\d+)/server", "DELETE /vswitch/{id}/server", 100),
)


def match_endpoint(method: str, path: str) -> tuple[Endpoint, dict[str, str]] | None:
    for endpoint in ENDPOINTS:
        if endpoint.method == method:
            found = endpoint.pattern.match(path)
            if found:
                return endpoint, found.groupdict()
    return None


def tightened(endpoint: Endpoint, limits: dict[str, tuple[int, float]]) -> Endpoint:
    """``endpoint`` under a test's tighter limit (``SimFaults.rate_limits``), if it names one."""
    if endpoint.name not in limits:
        return endpoint
    max_requests, window_s = limits[endpoint.name]
    return dataclasses.replace(endpoint, max_requests=max_requests, window_s=window_s)


class RateLimiter:
    """Sliding-window counts per (user, endpoint)."""

    def __init__(self) -> None:
        self._hits: dict[tuple[str, str], deque[float]] = defaultdict(deque)

    def admit(self, user: str, endpoint: Endpoint, now: float) -> bool:
        hits = self._hits[(user, endpoint.name)]
        while hits and hits[0] <= now - endpoint.window_s:
            hits.popleft()
        if len(hits) >= endpoint.max_requests:
            return False
        hits.append(now)
        return True


class LoginGuard:
    """Three failed logins from an IP within ten minutes block it for ten minutes."""

    def __init__(self) -> None:
        self._failures: dict[str, deque[float]] = defaultdict(deque)
        self._blocked_until: dict[str, float] = {}

    def blocked(self, ip: str, now: float) -> bool:
        return now < self._blocked_until.get(ip, float("-inf"))

    def failed(self, ip: str, now: float) -> None:
        failures = self._failures[ip]
        failures.append(now)
        while failures and failures[0] <= now - LOGIN_BLOCK_S:
            failures.popleft()
        if len(failures) >= LOGIN_FAILURES_TO_BLOCK:
            self._blocked_until[ip] = now + LOGIN_BLOCK_S
            failures.clear()


class SimFaults(BaseModel):
    """Injected faults; settable from Python or over HTTP (``POST /_sim/faults`` with JSON)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    error_rate: float = Field(0.0, ge=0.0, le=1.0)  # share of authenticated requests answered 500
    # Every Nth authenticated request answered 500: a rate that bites for sure in a test with few requests.
    error_every: int = Field(0, ge=0)
    latency_s: float = Field(0.0, ge=0.0, le=30.0)  # real seconds added to every answer
    maintenance: bool = False  # every Robot request answered 503
    never_boot: list[int] = Field(default_factory=list)  # servers whose resets hang (BootKind.HUNG)
    # Limits tighter than the documented ones: endpoint name ("POST /reset/{n}") -> (max requests, window in
    # sim seconds); the 403's ``interval`` is that window in real seconds.
    rate_limits: dict[str, tuple[int, float]] = Field(default_factory=dict)
    # Servers whose rescue system presents host keys other than the ones Robot reported (a swapped machine).
    impostor_rescue: list[int] = Field(default_factory=list)
    # Servers whose vSwitch joins end "failed" instead of "ready" (a port Robot could not configure).
    vswitch_fail: list[int] = Field(default_factory=list)

    @field_validator("rate_limits")
    @classmethod
    def _known_endpoints(cls, value: dict[str, tuple[int, float]]) -> dict[str, tuple[int, float]]:
        unknown = set(value) - {e.name for e in ENDPOINTS}
        if unknown:
            raise ValueError(f"unknown endpoints {sorted(unknown)}")
        if any(n < 0 or w <= 0 for n, w in value.values()):
            raise ValueError("max requests must be >= 0 and windows > 0")
        return value
