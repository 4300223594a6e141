"""Retries: only transient errors, with the injected backoff (no real sleeping), a budget token per
attempt, non-idempotent calls only when nothing can have been applied, orders never; 403 feeds the
budget and is not retried; the default backoff grows exponentially with bounded jitter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from capi_gpu.hetzner import budget, errors, models, transport

RESET_OK = {"reset": {"server_number": 1, "type": "hw"}}


class Script:
    """Answers with the given responses in turn (the last one repeats)."""

    def __init__(self, *responses: httpx.Response | Exception) -> None:
        self.responses = list(responses)
        self.seen = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen += 1
        answer = self.responses[min(self.seen, len(self.responses)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer


def err(status: int, code: str, **extra: Any) -> httpx.Response:
    return httpx.Response(status, json={"error": {"status": status, "code": code, "message": code, **extra}})


def servers() -> httpx.Response:
    return httpx.Response(200, json=[{"server": {"server_number": 1, "status": "ready"}}])


async def test_transient_errors_are_retried_with_the_injected_backoff(make_client: Any, sleep: Any) -> None:
    script = Script(err(500, "INTERNAL_ERROR"), httpx.Response(503, text="maintenance"), servers())
    robot = make_client(script)
    assert len(await robot.list_servers()) == 1
    assert script.seen == 3
    assert sleep.delays == [0.5, 1.0]


async def test_retries_stop_after_the_configured_attempts(make_client: Any, sleep: Any) -> None:
    script = Script(err(500, "INTERNAL_ERROR"))
    robot = make_client(script, retry=transport.RetryPolicy(attempts=4))
    with pytest.raises(errors.RobotTransientError):
        await robot.get_server(1)
    assert script.seen == 4
    assert sleep.delays == [0.5, 1.0, 2.0]


@pytest.mark.parametrize(
    "response",
    [
        err(400, "INVALID_INPUT"),
        err(404, "SERVER_NOT_FOUND"),
        err(409, "RESET_MANUAL_ACTIVE"),
        err(409, "KEY_ALREADY_EXISTS"),
        err(403, "RATE_LIMIT_EXCEEDED", max_requests=200, interval=3600),
        httpx.Response(401, text="no"),
    ],
)
async def test_non_transient_errors_are_not_retried(make_client: Any, sleep: Any, response: httpx.Response) -> None:
    script = Script(response)
    robot = make_client(script)
    with pytest.raises(errors.RobotError) as caught:
        await robot.get_server(1)
    assert not isinstance(caught.value, errors.RobotTransientError)
    assert script.seen == 1
    assert sleep.delays == []


async def test_each_attempt_takes_a_budget_token(make_client: Any) -> None:
    script = Script(err(500, "INTERNAL_ERROR"), err(500, "INTERNAL_ERROR"), servers())
    robot = make_client(script)
    before = robot.account.budget.remaining(budget.Family.SERVER)
    await robot.list_servers()
    assert robot.account.budget.remaining(budget.Family.SERVER) == before - 3


async def test_retry_stops_when_the_budget_runs_dry(make_client: Any) -> None:
    script = Script(err(500, "RESET_FAILED"))
    robot = make_client(script, limits={budget.Family.RESET_WRITE: budget.Limit(2, 3600)})
    with pytest.raises(errors.RobotBudgetDeferred) as caught:
        await robot.reset(1, models.ResetType.HARDWARE)
    assert script.seen == 2
    assert caught.value.retry_after > 3000


async def test_reset_is_retried_only_when_it_cannot_have_happened(make_client: Any) -> None:
    failed = Script(err(500, "RESET_FAILED"), httpx.Response(200, json=RESET_OK))
    assert (await make_client(failed).reset(1, models.ResetType.HARDWARE)).type == "hw"
    assert failed.seen == 2

    refused = Script(httpx.ConnectError("refused"), httpx.Response(200, json=RESET_OK))
    assert (await make_client(refused).reset(1, models.ResetType.HARDWARE)).type == "hw"
    assert refused.seen == 2

    for ambiguous in (httpx.ReadTimeout("slow"), err(500, "INTERNAL_ERROR"), httpx.Response(502, text="bad gw")):
        script = Script(ambiguous, httpx.Response(200, json=RESET_OK))
        with pytest.raises(errors.RobotTransientError) as caught:
            await make_client(script).reset(1, models.ResetType.HARDWARE)
        assert caught.value.maybe_applied
        assert script.seen == 1


async def test_orders_are_never_resent(make_client: Any, sleep: Any) -> None:
    script = Script(httpx.ConnectError("refused"))
    robot = make_client(script)
    order = models.OrderRequest(product_id="GEX131", location="FSN1", authorized_keys=["aa"])
    with pytest.raises(errors.RobotTransientError):
        await robot.order_server(order, test=False)
    assert script.seen == 1
    assert sleep.delays == []


async def test_rate_limit_freezes_the_family_for_the_server_interval(make_client: Any, clock: Any) -> None:
    script = Script(err(403, "RATE_LIMIT_EXCEEDED", max_requests=1, interval=5), servers())
    robot = make_client(script)
    with pytest.raises(errors.RobotRateLimited) as caught:
        await robot.list_servers()
    assert caught.value.retry_after == 5
    with pytest.raises(errors.RobotBudgetDeferred) as deferred:
        await robot.list_servers()
    assert 0 < deferred.value.retry_after <= 5
    assert script.seen == 1
    clock.advance(5)
    assert len(await robot.list_servers()) == 1
    # 1 per 5 s is looser than our 200/h: we keep ours, stricter limits win.
    assert robot.account.budget.limit(budget.Family.SERVER) == budget.Limit(200, 3600)


async def test_a_stricter_server_limit_replaces_ours(make_client: Any, clock: Any) -> None:
    script = Script(err(403, "RATE_LIMIT_EXCEEDED", max_request=40, interval=3600))
    robot = make_client(script)
    with pytest.raises(errors.RobotRateLimited):
        await robot.reset(1, models.ResetType.HARDWARE)
    assert robot.account.budget.limit(budget.Family.RESET_WRITE) == budget.Limit(40, 3600)
    assert robot.account.budget.remaining(budget.Family.RESET_WRITE) == 0
    clock.advance(3600)
    assert robot.account.budget.remaining(budget.Family.RESET_WRITE) == 40


def test_default_backoff_is_exponential_with_bounded_jitter() -> None:
    policy = transport.RetryPolicy(initial_s=0.5, max_s=4.0, jitter_s=0.25)
    noise: Iterator[float] = iter([0.0, 1.0, 0.5, 0.0, 0.999])
    backoff = transport.exponential_jitter(policy, rng=lambda: next(noise))
    assert [backoff(n) for n in range(1, 6)] == [0.5, 1.25, 2.125, 4.0, pytest.approx(4.24975)]
