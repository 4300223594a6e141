"""Prometheus view of the Robot budget: what is left per family, and how requests ended.

``capi_gpu_robot_budget_remaining{account_hash,family}`` is computed at scrape time (tokens come back
as time passes, so a gauge set on each request would go stale). ``capi_gpu_robot_requests_total
{family,outcome}`` counts every call, including those that sent nothing (``deferred``,
``circuit_open``), so a dashboard shows both Robot's answers and our own refusals.

The account is identified by a hash of the Robot username, never the username itself.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from enum import StrEnum
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from capi_gpu.hetzner import errors

if TYPE_CHECKING:
    from capi_gpu.hetzner.account import RobotAccount

BUDGET_REMAINING = "capi_gpu_robot_budget_remaining"
REQUESTS_TOTAL = "capi_gpu_robot_requests_total"
CIRCUIT_OPEN = "capi_gpu_robot_circuit_open"


def account_hash(username: str) -> str:
    return hashlib.sha256(username.encode()).hexdigest()[:12]


class Outcome(StrEnum):
    OK = "ok"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    TERMINAL = "terminal"
    AUTH = "auth"
    TRANSIENT = "transient"
    MAINTENANCE = "maintenance"
    REQUEUE = "requeue"
    RATE_LIMITED = "rate_limited"
    DEFERRED = "deferred"  # not sent: our budget
    CIRCUIT_OPEN = "circuit_open"  # not sent: an earlier 401


_ORDER: tuple[tuple[type[errors.RobotError], Outcome], ...] = (
    (errors.RobotCircuitOpen, Outcome.CIRCUIT_OPEN),
    (errors.RobotAuthError, Outcome.AUTH),
    (errors.RobotNotFound, Outcome.NOT_FOUND),
    (errors.RobotConflict, Outcome.CONFLICT),
    (errors.RobotTerminalError, Outcome.TERMINAL),
    (errors.RobotMaintenance, Outcome.MAINTENANCE),
    (errors.RobotTransientError, Outcome.TRANSIENT),
    (errors.RobotBudgetDeferred, Outcome.DEFERRED),
    (errors.RobotRateLimited, Outcome.RATE_LIMITED),
    (errors.RobotRequeue, Outcome.REQUEUE),
)


def outcome_of(exc: errors.RobotError | None) -> Outcome:
    if exc is None:
        return Outcome.OK
    for cls, outcome in _ORDER:
        if isinstance(exc, cls):
            return outcome
    return Outcome.TERMINAL


class _BudgetCollector(Collector):
    def __init__(self, accounts: Callable[[], Iterable[RobotAccount]]) -> None:
        self._accounts = accounts

    def collect(self) -> Iterator[Metric]:
        remaining = GaugeMetricFamily(
            BUDGET_REMAINING,
            "Robot requests this deployment may still send in the current window, per endpoint family",
            labels=["account_hash", "family"],
        )
        circuit = GaugeMetricFamily(CIRCUIT_OPEN, "1 while a 401 holds every Robot call back", labels=["account_hash"])
        for account in self._accounts():
            for family, left in account.budget.snapshot().items():
                remaining.add_metric([account.account_hash, family.value], float(left))
            circuit.add_metric([account.account_hash], 1.0 if account.circuit.circuit_open else 0.0)
        yield remaining
        yield circuit


class RobotMetrics:
    """The metric objects of one registry (the process default, or a test's own)."""

    def __init__(self, registry: CollectorRegistry, accounts: Callable[[], Iterable[RobotAccount]]) -> None:
        self.requests = Counter(
            REQUESTS_TOTAL,
            "Robot calls by endpoint family and outcome (deferred and circuit_open sent nothing)",
            labelnames=["family", "outcome"],
            registry=registry,
        )
        registry.register(_BudgetCollector(accounts))

    def count(self, family: str, outcome: Outcome) -> None:
        self.requests.labels(family=family, outcome=outcome.value).inc()
