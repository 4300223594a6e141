"""Robot error classification: every class, both spellings of max_requests, transport translation."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from capi_gpu.hetzner import errors


def body(status: int, code: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"status": status, "code": code, "message": f"{code} happened", **extra}}


@pytest.mark.parametrize(
    ("status", "code", "cls"),
    [
        (400, "INVALID_INPUT", errors.RobotTerminalError),
        (404, "SERVER_NOT_FOUND", errors.RobotNotFound),
        (404, "RESET_NOT_AVAILABLE", errors.RobotNotFound),
        (404, "BOOT_NOT_AVAILABLE", errors.RobotNotFound),
        (404, "VSWITCH_NOT_AVAILABLE", errors.RobotNotFound),
        (403, "FORBIDDEN", errors.RobotTerminalError),
        (409, "RESET_MANUAL_ACTIVE", errors.RobotRequeue),
        (409, "FIREWALL_IN_PROCESS", errors.RobotRequeue),
        (409, "VSWITCH_IN_PROCESS", errors.RobotRequeue),
        (409, "FAILOVER_LOCKED", errors.RobotRequeue),
        (409, "SOMETHING_NEW", errors.RobotRequeue),
        (409, "KEY_ALREADY_EXISTS", errors.RobotConflict),
        (409, "CONFLICT", errors.RobotConflict),
        (409, "BOOT_ALREADY_ENABLED", errors.RobotConflict),
        (409, "VSWITCH_LIMIT_REACHED", errors.RobotConflict),
        (409, "VSWITCH_VLAN_NOT_UNIQUE", errors.RobotConflict),
        (409, "VSWITCH_SERVER_LIMIT_REACHED", errors.RobotConflict),
        (409, "VSWITCH_PER_SERVER_LIMIT_REACHED", errors.RobotConflict),
        (404, "NOT_FOUND", errors.RobotNotFound),
        (409, "SERVER_CANCELLATION_RESERVE_LOCATION_FALSE_ONLY", errors.RobotConflict),
        (409, "FIREWALL_RULE_LIMIT_EXCEEDED", errors.RobotConflict),
        (500, "INTERNAL_ERROR", errors.RobotTransientError),
        (500, "RESET_FAILED", errors.RobotTransientError),
        (500, "BOOT_ACTIVATION_FAILED", errors.RobotTransientError),
        (502, "HTTP_502", errors.RobotTransientError),
        (503, "HTTP_503", errors.RobotMaintenance),
    ],
)
def test_codes_map_to_the_class_that_says_what_to_do(status: int, code: str, cls: type) -> None:
    error = errors.classify(status, body(status, code))
    assert type(error) is cls
    assert error.status == status
    assert error.code == code or cls is errors.RobotMaintenance
    assert isinstance(error, errors.RobotError)


def test_401_is_terminal_auth_error_without_a_body_code() -> None:
    error = errors.classify(401, None)
    assert type(error) is errors.RobotAuthError
    assert isinstance(error, errors.RobotTerminalError)
    assert error.code == "UNAUTHORIZED"


def test_circuit_open_is_an_auth_error_that_sent_nothing() -> None:
    error = errors.RobotCircuitOpen("401 earlier")
    assert isinstance(error, errors.RobotAuthError)
    assert error.status is None


def test_budget_deferred_is_a_requeue_that_sent_nothing() -> None:
    error = errors.RobotBudgetDeferred("reset_write", retry_after=12.5)
    assert isinstance(error, errors.RobotRequeue)
    assert error.status is None
    assert error.retry_after == 12.5
    assert error.family == "reset_write"


def test_rate_limit_sample_uses_max_requests(sample: Any) -> None:
    error = errors.classify(403, sample("error-rate-limit-exceeded"))
    assert isinstance(error, errors.RobotRateLimited)
    assert isinstance(error, errors.RobotRequeue)
    assert (error.max_requests, error.interval, error.retry_after) == (1, 5.0, 5.0)


def test_rate_limit_accepts_the_documented_max_request_spelling() -> None:
    error = errors.classify(403, body(403, "RATE_LIMIT_EXCEEDED", max_request=200, interval=3600))
    assert isinstance(error, errors.RobotRateLimited)
    assert (error.max_requests, error.interval) == (200, 3600.0)


def test_invalid_input_keeps_missing_and_invalid(sample: Any) -> None:
    error = errors.classify(400, sample("error-invalid-input"))
    assert isinstance(error, errors.RobotTerminalError)
    assert error.invalid == ["rules"]
    assert error.missing == []


def test_non_json_error_body_is_classified_by_status() -> None:
    assert isinstance(errors.classify(503, None), errors.RobotMaintenance)
    error = errors.classify(500, None)
    assert isinstance(error, errors.RobotTransientError)
    assert error.code == "HTTP_500"


def test_failed_codes_were_not_applied_but_bare_500s_may_have_been() -> None:
    failed = errors.classify(500, body(500, "RESET_FAILED"))
    internal = errors.classify(500, body(500, "INTERNAL_ERROR"))
    assert isinstance(failed, errors.RobotTransientError)
    assert isinstance(internal, errors.RobotTransientError)
    assert failed.maybe_applied is False
    assert internal.maybe_applied is True
    assert errors.RobotMaintenance().maybe_applied is False


@pytest.mark.parametrize(
    ("exc", "maybe_applied"),
    [
        (httpx.ConnectError("refused"), False),
        (httpx.ConnectTimeout("slow"), False),
        (httpx.ReadTimeout("slow"), True),
        (httpx.RemoteProtocolError("cut"), True),
    ],
)
def test_transport_errors_are_transient(exc: httpx.TransportError, maybe_applied: bool) -> None:
    error = errors.from_transport(exc)
    assert isinstance(error, errors.RobotTransientError)
    assert error.status is None
    assert error.maybe_applied is maybe_applied


def test_requeue_delay_per_class() -> None:
    assert errors.requeue_delay(errors.RobotBudgetDeferred("server", retry_after=7)) == 7
    assert errors.requeue_delay(errors.classify(403, body(403, "RATE_LIMIT_EXCEEDED", interval=3600))) == 3600
    assert errors.requeue_delay(errors.classify(409, body(409, "RESET_MANUAL_ACTIVE"))) == errors.DEFAULT_REQUEUE_S
    assert errors.requeue_delay(errors.RobotMaintenance(), transient_s=5) == 5
    for terminal in (errors.classify(400, None), errors.classify(401, None), errors.RobotCircuitOpen("x")):
        assert errors.requeue_delay(terminal) is None
    assert errors.requeue_delay(errors.classify(409, body(409, "KEY_ALREADY_EXISTS"))) is None
