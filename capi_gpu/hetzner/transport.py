"""How one Robot request is sent: circuit, budget, httpx, classification, retry, metrics.

Every endpoint method of ``RobotClient`` goes through ``RobotSession.call``, so the rules hold for
all of them:

1. the account's circuit admits the request (no request at all after a 401);
2. the account's budget gives a token for the endpoint family (or ``RobotBudgetDeferred``);
3. httpx sends it (basic auth, ``Accept: application/json``, form body); httpx errors are
   translated here, ``raise ... from exc``;
4. an error response is classified (``errors.classify``); a 401 trips the circuit, a 403 rate limit
   feeds its ``interval`` back into the budget;
5. tenacity retries *transient* errors only, with exponential backoff and jitter; a retry takes a
   new token, because Robot counts it. Calls that are not idempotent retry only when the failed
   attempt cannot have been applied; orders never retry.

The transport is a seam: pass ``httpx.MockTransport(handler)`` in unit tests. Backoff and sleep are
parameters too, so retry tests assert the delays without waiting for them.

Nothing here logs a body, the password or the ``Authorization`` header.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import random
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import httpx
import tenacity

from capi_gpu.hetzner import account as account_mod
from capi_gpu.hetzner import budget, budget_metrics, circuit, errors

log = logging.getLogger(__name__)

ROBOT_URL = "https://robot-ws.your-server.de"

Backoff = Callable[[int], float]  # failed attempt number (1-based) -> seconds before the next
Sleep = Callable[[float], Awaitable[None]]
FormData = Mapping[str, str | list[str]]


class Retry(StrEnum):
    """What a failed attempt allows."""

    SAFE = "safe"  # reads and idempotent writes (rename, rescue delete): retry any transient error
    UNLESS_APPLIED = "unless_applied"  # reset, rescue activation: retry only if nothing can have happened
    NEVER = "never"  # orders cost money: never send twice


@dataclass(frozen=True)
class _Request:
    """One logical request, the same for every attempt at it."""

    method: str
    path: str
    family: budget.Family
    data: FormData | None
    params: Mapping[str, str] | None


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    initial_s: float = 0.5
    max_s: float = 8.0
    jitter_s: float = 0.5


def exponential_jitter(policy: RetryPolicy, rng: Callable[[], float] = random.random) -> Backoff:
    """``initial * 2**(n-1)`` capped at ``max``, plus up to ``jitter`` seconds of uniform noise."""

    def backoff(attempt: int) -> float:
        base: float = min(policy.max_s, policy.initial_s * 2.0 ** (attempt - 1))
        return base + policy.jitter_s * rng()

    return backoff


def _should_retry(exc: BaseException, mode: Retry) -> bool:
    if not isinstance(exc, errors.RobotTransientError):
        return False
    if mode is Retry.SAFE:
        return True
    if mode is Retry.UNLESS_APPLIED:
        return not exc.maybe_applied
    return False


def check_url(base_url: str) -> httpx.URL:
    url = httpx.URL(base_url)
    if url.userinfo:
        raise ValueError("the Robot URL must not carry credentials; pass username and password")
    if url.scheme == "http":
        try:
            loopback = ipaddress.ip_address(url.host).is_loopback
        except ValueError:
            loopback = url.host == "localhost"
        if not loopback:
            raise ValueError("plain http would send the Robot password in clear; use https")
    elif url.scheme != "https":
        raise ValueError(f"unsupported scheme {url.scheme!r}")
    return url


def _parse_body(response: httpx.Response) -> Any:
    if not response.content:
        return None
    try:
        return response.json()
    except ValueError:
        return None


class RobotSession:
    """One authenticated connection pool to Robot, bound to the shared ``RobotAccount``."""

    def __init__(
        self,
        username: str,
        password: str,
        *,
        base_url: str = ROBOT_URL,
        account: account_mod.RobotAccount,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        backoff: Backoff | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.account = account
        self.retry = retry or RetryPolicy()
        self._backoff = backoff or exponential_jitter(self.retry)
        self._sleep = sleep
        self._fingerprint = circuit.credentials_fingerprint(username, password)
        self._http = httpx.AsyncClient(
            base_url=check_url(base_url),
            auth=httpx.BasicAuth(username, password),
            headers={"Accept": "application/json", "User-Agent": "capi-gpu"},
            transport=transport,
            timeout=timeout_s,
        )

    @property
    def credentials_fingerprint(self) -> str:
        return self._fingerprint

    def __repr__(self) -> str:
        return f"RobotSession(base_url={str(self._http.base_url)!r}, account={self.account.account_hash})"

    async def aclose(self) -> None:
        await self._http.aclose()

    async def call(
        self,
        method: str,
        path: str,
        *,
        retry: Retry,
        data: FormData | None = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        """Send one logical request (with retries) and return the parsed JSON body (None if empty)."""
        req = _Request(method, path, budget.family_for(method, path), data, params)
        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self.retry.attempts),
            wait=lambda state: self._backoff(state.attempt_number),
            sleep=self._sleep,
            retry=tenacity.retry_if_exception(lambda exc: _should_retry(exc, retry)),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await self._attempt(req)
        raise AssertionError("unreachable: tenacity reraises")  # pragma: no cover

    async def _attempt(self, req: _Request) -> Any:
        try:
            async with self.account.circuit.admit(self._fingerprint):
                taken_at = self.account.budget.reserve(req.family)
                try:
                    body = await self._send(req)
                finally:
                    self.account.budget.settle(req.family, taken_at)
        except errors.RobotError as exc:
            self.account.count(req.family, budget_metrics.outcome_of(exc))
            log.debug("robot %s %s [%s]: %s %s", req.method, req.path, req.family.value, exc.status, exc.code)
            raise
        self.account.count(req.family, budget_metrics.Outcome.OK)
        return body

    async def _send(self, req: _Request) -> Any:
        try:
            response = await self._http.request(req.method, req.path, data=req.data, params=req.params)
        except httpx.TransportError as exc:
            raise errors.from_transport(exc) from exc
        except httpx.HTTPError as exc:
            raise errors.RobotTerminalError(None, "HTTP_CLIENT_ERROR", type(exc).__name__) from exc
        body = _parse_body(response)
        status = response.status_code
        if status == 401:
            self.account.circuit.trip(self._fingerprint, "Robot rejected the webservice credentials (401)")
        else:
            self.account.circuit.record_success(self._fingerprint)
        if status >= 400:
            error = errors.classify(status, body)
            if isinstance(error, errors.RobotRateLimited):
                self.account.budget.on_rate_limited(req.family, error.interval, error.max_requests)
            raise error
        if response.content and body is None:
            raise errors.RobotTerminalError(status, "INVALID_RESPONSE", "Robot answered with a non-JSON body")
        log.debug("robot %s %s [%s]: %s", req.method, req.path, req.family.value, status)
        return body
