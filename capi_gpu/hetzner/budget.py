"""One Robot request budget per account, shared by every controller in the process.

Robot limits each endpoint per hour (``POST /reset`` 50/h, ``GET /server`` 200/h, orders 20/day) and
answers an overrun with 403 ``RATE_LIMIT_EXCEEDED``. CAPH freezes the one object that hit the limit;
we keep the whole fleet inside the account's budget instead, so a 403 should never happen.

Design:

- Endpoints are grouped into *families* (``family_for``). A family spans endpoints that share one
  documented limit, and its bucket holds the smallest limit of its members. Whether Robot counts per
  endpoint or per group is undocumented; a family's total never exceeds any member's limit, so
  either way we stay inside it.
- Each family has a token bucket whose tokens come back exactly one window after they were spent
  (a sliding-window log). A classic bucket with capacity L and refill L/h allows 2L in a sliding
  hour; Robot's window semantics are undocumented, so we need "at most L in *any* window", and this
  gives it while still allowing a full burst of L.
- A token's window starts when its request's answer arrived (``settle``), not when it was reserved:
  Robot counts at arrival, so latency jitter can never squeeze two uses into one of Robot's windows.
- ``reserve`` never waits: it takes a token or raises ``RobotBudgetDeferred(retry_after)``. Callers in
  kopf handlers turn that into ``kopf.TemporaryError(delay=retry_after)``; nobody sleeps on the loop.
- ``share`` scales every limit, for several operator deployments on one Robot account.
- On a 403 the server's ``interval`` freezes the family; its ``max_requests``/``interval`` replace our
  limit when they are stricter than what we assumed.

The clock is a parameter (seconds, monotonic) so tests and the benchmark drive time.
"""

from __future__ import annotations

import bisect
import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from capi_gpu.hetzner import errors

log = logging.getLogger(__name__)

Clock = Callable[[], float]

HOUR = 3600.0
DAY = 86400.0


class Family(StrEnum):
    """Endpoint families, each with one bucket. Names appear in metrics labels."""

    SERVER = "server"  # GET /server, GET /server/{n}, POST /server/{n}
    CANCELLATION = "cancellation"  # GET/POST/DELETE /server/{n}/cancellation
    RESET_READ = "reset_read"  # GET /reset, GET /reset/{n}
    RESET_WRITE = "reset_write"  # POST /reset/{n}
    BOOT = "boot"  # /boot/{n}/... (GET, POST and DELETE share 500/h)
    KEY_READ = "key_read"  # GET /key, GET /key/{fp}
    KEY_WRITE = "key_write"  # POST /key, POST/DELETE /key/{fp}
    ORDER_PRODUCT = "order_product"  # GET /order/server/product[/{id}]
    ORDER_READ = "order_read"  # GET /order/server/transaction[/{id}]
    ORDER_WRITE = "order_write"  # POST /order/server/transaction (test=true counts too)
    VSWITCH_READ = "vswitch_read"  # GET /vswitch[/{id}]
    VSWITCH_WRITE = "vswitch_write"  # POST/DELETE /vswitch[/{id}[/server]]
    WOL_WRITE = "wol_write"  # POST /wol/{n}
    OTHER = "other"  # anything else: the tightest general read limit


@dataclass(frozen=True)
class Limit:
    max_requests: int
    window_s: float

    @property
    def rate(self) -> float:
        return self.max_requests / self.window_s


# Documented limits (robot.hetzner.com/doc/webservice, shared/reference/hetzner.md §1.3).
DEFAULT_LIMITS: Mapping[Family, Limit] = {
    Family.SERVER: Limit(200, HOUR),
    Family.CANCELLATION: Limit(200, HOUR),
    Family.RESET_READ: Limit(500, HOUR),
    Family.RESET_WRITE: Limit(50, HOUR),
    Family.BOOT: Limit(500, HOUR),
    Family.KEY_READ: Limit(500, HOUR),
    Family.KEY_WRITE: Limit(200, HOUR),
    Family.ORDER_PRODUCT: Limit(500, HOUR),
    Family.ORDER_READ: Limit(500, HOUR),
    Family.ORDER_WRITE: Limit(20, DAY),
    Family.VSWITCH_READ: Limit(500, HOUR),
    Family.VSWITCH_WRITE: Limit(100, HOUR),
    Family.WOL_WRITE: Limit(10, HOUR),
    Family.OTHER: Limit(100, HOUR),
}

_RULES: tuple[tuple[str | None, re.Pattern[str], Family], ...] = tuple(
    (method, re.compile(pattern), family)
    for method, pattern, family in (
        (None, r"^/server/[^/]+/cancellation$", Family.CANCELLATION),
        (None, r"^/server(/[^/]+)?$", Family.SERVER),
        ("GET", r"^/reset(/[^/]+)?$", Family.RESET_READ),
        ("POST", r"^/reset/[^/]+$", Family.RESET_WRITE),
        (None, r"^/boot/[^/]+(/.*)?$", Family.BOOT),
        ("GET", r"^/key(/[^/]+)?$", Family.KEY_READ),
        (None, r"^/key(/[^/]+)?$", Family.KEY_WRITE),
        ("GET", r"^/order/server(_market)?/product(/[^/]+)?$", Family.ORDER_PRODUCT),
        ("GET", r"^/order/server(_market)?/transaction(/[^/]+)?$", Family.ORDER_READ),
        ("POST", r"^/order/server(_market)?/transaction$", Family.ORDER_WRITE),
        ("GET", r"^/vswitch(/[^/]+)?$", Family.VSWITCH_READ),
        (None, r"^/vswitch(/.*)?$", Family.VSWITCH_WRITE),
        ("POST", r"^/wol/[^/]+$", Family.WOL_WRITE),
        ("GET", r"^/wol/[^/]+$", Family.RESET_READ),
    )
)


def family_for(method: str, path: str) -> Family:
    """The budget family of a request; the one place that maps endpoints to buckets."""
    path = "/" + path.split("?", 1)[0].strip("/")
    for rule_method, pattern, family in _RULES:
        if (rule_method is None or rule_method == method.upper()) and pattern.match(path):
            return family
    return Family.OTHER


class TokenBucket:
    """At most ``limit.max_requests`` takes in any window of ``limit.window_s`` seconds."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self._spent: list[float] = []  # sorted
        self._frozen_until = -math.inf

    def _expire(self, now: float) -> None:
        horizon = now - self.limit.window_s
        del self._spent[: bisect.bisect_right(self._spent, horizon)]

    def remaining(self, now: float) -> int:
        if now < self._frozen_until:
            return 0
        self._expire(now)
        return max(0, self.limit.max_requests - len(self._spent))

    def retry_after(self, now: float) -> float:
        """Seconds until a take can succeed (0 when one can now)."""
        if self.remaining(now) > 0:
            return 0.0
        wait = self._frozen_until - now
        overflow = len(self._spent) - self.limit.max_requests
        if overflow >= 0:
            wait = max(wait, self._spent[overflow] + self.limit.window_s - now)
        return max(wait, 0.0)

    def take(self, now: float) -> bool:
        if self.remaining(now) <= 0:
            return False
        bisect.insort(self._spent, now)
        return True

    def settle(self, taken_at: float, now: float) -> None:
        """Re-date a token to when its request finished: Robot saw it no earlier than that."""
        index = bisect.bisect_left(self._spent, taken_at)
        if index < len(self._spent) and self._spent[index] == taken_at and now > taken_at:
            del self._spent[index]
            bisect.insort(self._spent, now)

    def freeze(self, now: float, seconds: float) -> None:
        self._frozen_until = max(self._frozen_until, now + seconds)

    def adopt(self, limit: Limit) -> None:
        self.limit = limit


def scaled(limit: Limit, share: float) -> Limit:
    return Limit(max(1, math.floor(limit.max_requests * share)), limit.window_s)


class AccountBudget:
    """The buckets of one Robot account (or of this deployment's ``share`` of it)."""

    def __init__(
        self,
        *,
        clock: Clock,
        share: float = 1.0,
        limits: Mapping[Family, Limit] | None = None,
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError("share must be in (0, 1]")
        self.clock = clock
        self.share = share
        merged = {**DEFAULT_LIMITS, **(limits or {})}
        self._buckets = {family: TokenBucket(scaled(merged[family], share)) for family in Family}

    def limit(self, family: Family) -> Limit:
        return self._buckets[family].limit

    def remaining(self, family: Family) -> int:
        return self._buckets[family].remaining(self.clock())

    def snapshot(self) -> dict[Family, int]:
        now = self.clock()
        return {family: bucket.remaining(now) for family, bucket in self._buckets.items()}

    def reserve(self, family: Family) -> float:
        """Take one token (returns when), or raise ``RobotBudgetDeferred`` with the seconds until one is free."""
        bucket = self._buckets[family]
        now = self.clock()
        if not bucket.take(now):
            raise errors.RobotBudgetDeferred(family.value, retry_after=max(bucket.retry_after(now), 0.001))
        return now

    def settle(self, family: Family, taken_at: float) -> None:
        """The request that used the token is over: count its window from now.

        Robot counts a request when it arrives, which is after we reserved and before we read the
        answer. A token that returns one window after the *answer* can therefore never be reused
        inside Robot's window, however long the request waited in a queue or on the network.
        """
        self._buckets[family].settle(taken_at, self.clock())

    def on_rate_limited(self, family: Family, interval: float, max_requests: int | None) -> None:
        """Robot said 403: freeze the family for its ``interval``; adopt its limit when stricter."""
        bucket = self._buckets[family]
        bucket.freeze(self.clock(), interval)
        if max_requests is not None and max_requests > 0 and interval > 0:
            theirs = scaled(Limit(max_requests, interval), self.share)
            if theirs.rate < bucket.limit.rate:
                bucket.adopt(theirs)
        log.warning(
            "Robot rate limit hit for %s (max_requests=%s, interval=%ss); our budget was too generous",
            family.value,
            max_requests,
            interval,
        )
