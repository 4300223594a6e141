"""No secret reaches a log record, an exception or a repr: the webservice password, the Authorization
header, the rescue root password and an order password (captured at DEBUG from every logger)."""

from __future__ import annotations

import base64
import logging
from typing import Any

import httpx
import pytest

from capi_gpu.hetzner import errors, models

USER = "robot-user"
PASSWORD = "s3cret-Passw0rd"
RESCUE_PASSWORD = "R3scue-r00t-pw"
ORDER_PASSWORD = "0rder-r00t-pw"
SECRETS = (PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(), RESCUE_PASSWORD, ORDER_PASSWORD)


def handler(request: httpx.Request) -> httpx.Response:
    path = request.url.path
    if path == "/boot/1/rescue":
        rescue = {"server_number": 1, "os": "linux", "active": True, "password": RESCUE_PASSWORD}
        return httpx.Response(200, json={"rescue": rescue})
    if path == "/server":
        return httpx.Response(500, json={"error": {"status": 500, "code": "INTERNAL_ERROR", "message": "x"}})
    if path == "/order/server/transaction":
        raise httpx.ConnectError("refused")
    return httpx.Response(401, text="Unauthorized")


def assert_clean(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


async def test_no_secret_in_logs_errors_or_reprs(make_client: Any, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    robot = make_client(handler, username=USER, password=PASSWORD)
    raised: list[BaseException] = []

    rescue = await robot.activate_rescue(1, ["aa:bb"])
    logging.getLogger("test").info("activated %s", rescue)
    order = models.OrderRequest(product_id="GEX131", location="FSN1", password=ORDER_PASSWORD)
    logging.getLogger("test").info("ordering %s", order)
    for call in (robot.list_servers(), robot.order_server(order, test=True), robot.get_server(1), robot.get_key("x")):
        with pytest.raises(errors.RobotError) as caught:
            await call
        raised.append(caught.value)
        logging.getLogger("test").exception("robot failed", exc_info=caught.value)

    assert {type(e) for e in raised} >= {errors.RobotTransientError, errors.RobotAuthError, errors.RobotCircuitOpen}
    # Not vacuous: our client, httpx and the test's own lines were all captured.
    loggers = {record.name for record in caplog.records}
    assert {"capi_gpu.hetzner.transport", "httpx", "test"} <= loggers
    for record in caplog.records:
        assert_clean(record.getMessage())
        assert_clean(repr(record.args))
    assert_clean(caplog.text)
    for exc in raised:
        assert_clean(str(exc) + repr(exc) + repr(exc.__cause__))
    assert_clean(repr(robot) + repr(rescue) + repr(order) + str(rescue.model_dump()))
