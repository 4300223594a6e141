"""Robot errors, classified by what the caller should do next, in one place.

Robot answers with ``{"error": {"status", "code", "message", ...}}`` and a handful of HTTP statuses
that mean very different things: a 401 must stop every call (three failed logins block our IP for
ten minutes), a 403 ``RATE_LIMIT_EXCEEDED`` means "wait for ``interval``", a 409 ``*_IN_PROCESS``
means "look again later", and a 404 ``*_NOT_AVAILABLE`` will never succeed. Controllers branch on
these classes, never on status numbers, and map them to kopf errors in one helper::

    RobotError(status, code, message)         root; status is None when nothing was sent
    ├── RobotTerminalError                    give up: 400, other 4xx, 404 *_NOT_FOUND/*_NOT_AVAILABLE
    │   ├── RobotNotFound                     404: not there (server, key, product, transaction)
    │   ├── RobotConflict                     409: state already differs (KEY_ALREADY_EXISTS, CONFLICT)
    │   └── RobotAuthError                    401: credentials rejected; opens the circuit
    │       └── RobotCircuitOpen              an earlier 401; no request was sent
    ├── RobotTransientError                   retry with backoff: 5xx, *_FAILED, INTERNAL_ERROR, network
    │   └── RobotMaintenance                  503
    └── RobotRequeue(retry_after)             come back later: 409 *_IN_PROCESS, RESET_MANUAL_ACTIVE
        ├── RobotRateLimited(interval, max)   403 RATE_LIMIT_EXCEEDED (max_requests or max_request)
        └── RobotBudgetDeferred(retry_after)  our own budget said "not yet"; no request was sent

Decisions the reference leaves open:

- ``RobotConflict`` is terminal *for the request*: sending it again fails the same way. The caller
  usually resolves it by reading the state and adopting it (``KEY_ALREADY_EXISTS`` → ``GET /key/{fp}``,
  ``CONFLICT`` "already cancelled" → done). A generic error mapper that knows nothing better treats it
  as permanent, so it can never loop.
- A 409 whose code we do not know is a ``RobotRequeue``: a 409 says the resource's current state
  refuses the request; looking again later rediscovers that state at the cost of one request.
- ``BOOT_ALREADY_ENABLED`` (kept by the Go and Rust clients, not in the doc tables) is a conflict.

``RobotTransientError.maybe_applied`` says whether the server may have executed the request anyway
(a read timeout, a 502, a bare 500). The client only retries non-idempotent calls when it is False.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

# Requeue delay when Robot gives no hint (a 409 *_IN_PROCESS): long enough to let Robot finish.
DEFAULT_REQUEUE_S = 30.0


class RobotError(Exception):
    """Root of every Robot failure. ``status`` is the HTTP status, or None when no request was sent."""

    def __init__(self, status: int | None, code: str, message: str) -> None:
        super().__init__(f"{status if status is not None else '-'} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message


class RobotTerminalError(RobotError):
    """The request can never succeed as sent. Do not retry; surface it."""

    def __init__(
        self,
        status: int | None,
        code: str,
        message: str,
        *,
        missing: list[str] | None = None,
        invalid: list[str] | None = None,
    ) -> None:
        super().__init__(status, code, message)
        self.missing = missing or []
        self.invalid = invalid or []


class RobotNotFound(RobotTerminalError):
    """404: the server, key, product or transaction does not exist (or never will for this account)."""


class RobotConflict(RobotTerminalError):
    """409: the state already differs from what the request assumes. Read it and adopt, don't resend."""


class RobotAuthError(RobotTerminalError):
    """401: the webservice credentials were rejected. Every further call stops until they change."""


class RobotCircuitOpen(RobotAuthError):
    """An earlier 401 opened the account's circuit; this call sent nothing."""

    def __init__(self, reason: str) -> None:
        super().__init__(None, "CIRCUIT_OPEN", reason)


class RobotTransientError(RobotError):
    """The server or the network failed; the same request may succeed after a short backoff."""

    def __init__(self, status: int | None, code: str, message: str, *, maybe_applied: bool) -> None:
        super().__init__(status, code, message)
        self.maybe_applied = maybe_applied


class RobotMaintenance(RobotTransientError):
    """503: Robot is in maintenance. Nothing was applied."""

    def __init__(self, message: str = "service unavailable (maintenance)") -> None:
        super().__init__(503, "MAINTENANCE", message, maybe_applied=False)


class RobotRequeue(RobotError):
    """Robot is busy with this resource; come back after ``retry_after`` seconds (a kopf requeue)."""

    def __init__(self, status: int | None, code: str, message: str, *, retry_after: float) -> None:
        super().__init__(status, code, message)
        self.retry_after = retry_after


class RobotRateLimited(RobotRequeue):
    """403 ``RATE_LIMIT_EXCEEDED``: at most ``max_requests`` per ``interval`` seconds for this endpoint."""

    def __init__(self, message: str, *, interval: float, max_requests: int | None) -> None:
        super().__init__(403, "RATE_LIMIT_EXCEEDED", message, retry_after=interval)
        self.interval = interval
        self.max_requests = max_requests


class RobotBudgetDeferred(RobotRequeue):
    """Our account-wide budget has no token for this endpoint family yet; nothing was sent."""

    def __init__(self, family: str, retry_after: float) -> None:
        super().__init__(None, "BUDGET_DEFERRED", f"no budget left for {family}", retry_after=retry_after)
        self.family = family


_REQUEUE_409_SUFFIXES = ("_IN_PROCESS", "_LOCKED", "_MANUAL_ACTIVE")
_CONFLICT_409_MARKERS = (
    "_ALREADY_",
    "_EXISTS",
    "_LIMIT_",
    "_NOT_UNIQUE",
    "_NOT_POSSIBLE",
    "_ONLY",
    "_CANNOT_",
)


def _is_conflict_code(code: str) -> bool:
    return code == "CONFLICT" or any(marker in code for marker in _CONFLICT_409_MARKERS)


def _classify_409(code: str, message: str) -> RobotError:
    if code.endswith(_REQUEUE_409_SUFFIXES):
        return RobotRequeue(409, code, message, retry_after=DEFAULT_REQUEUE_S)
    if _is_conflict_code(code):
        return RobotConflict(409, code, message)
    return RobotRequeue(409, code, message, retry_after=DEFAULT_REQUEUE_S)


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _rate_limited(error: Mapping[str, Any], message: str) -> RobotRateLimited:
    # The doc spells it max_request; the live API sends max_requests (hrobot-rs errata). Accept both.
    raw_max = error.get("max_requests", error.get("max_request"))
    interval = _int_or_none(error.get("interval"))
    return RobotRateLimited(
        message, interval=float(interval if interval is not None else 60), max_requests=_int_or_none(raw_max)
    )


def _str_list(value: Any) -> list[str] | None:
    if isinstance(value, list):
        return [str(v) for v in value]
    return None


def classify(status: int, body: Any) -> RobotError:
    """Map an error response (status + parsed JSON body, or None) to its class. The one place."""
    error: Mapping[str, Any] = {}
    if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
        error = body["error"]
    code = str(error.get("code") or f"HTTP_{status}")
    message = str(error.get("message") or "")
    if status == 401:
        return RobotAuthError(401, "UNAUTHORIZED", message or "webservice credentials rejected")
    if status == 403 and code == "RATE_LIMIT_EXCEEDED":
        return _rate_limited(error, message or "rate limit exceeded")
    if status == 503:
        return RobotMaintenance(message or "service unavailable")
    if status >= 500:
        # *_FAILED says the operation failed on Robot's side, so nothing happened; anything else is unclear.
        return RobotTransientError(status, code, message, maybe_applied=not code.endswith("_FAILED"))
    if status == 409:
        return _classify_409(code, message)
    if status == 404:
        return RobotNotFound(404, code, message)
    return RobotTerminalError(
        status,
        code,
        message,
        missing=_str_list(error.get("missing")),
        invalid=_str_list(error.get("invalid")),
    )


def from_transport(exc: httpx.TransportError) -> RobotTransientError:
    """Translate an httpx failure. Only a connection that never opened is certain not to have applied."""
    never_sent = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout)
    message = f"{type(exc).__name__}: {exc}"
    return RobotTransientError(None, "TRANSPORT_ERROR", message, maybe_applied=not never_sent)


def requeue_delay(exc: RobotError, *, transient_s: float = 30.0) -> float | None:
    """Seconds after which a reconcile should look again, or None when only a human can help.

    The controllers' one error helper turns a number into ``kopf.TemporaryError(delay=...)`` and None
    into ``kopf.PermanentError``/a condition; this keeps that mapping next to the classification.
    A transient error arrives here after the client's own retries, hence a longer requeue.
    """
    if isinstance(exc, RobotRequeue):
        return exc.retry_after
    if isinstance(exc, RobotTransientError):
        return transient_s
    return None
