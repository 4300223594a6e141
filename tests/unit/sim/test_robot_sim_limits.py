"""Robot simulator, access rules: per-endpoint sliding hourly limits answered with the documented 403
body (max_requests, interval), refused requests not counted, time compression, the 10-minute IP block
after three failed logins (401 for everything during it), and the request log over Python and HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from capi_gpu_sim.robot import RobotSim


@pytest.fixture
def sim() -> Iterator[RobotSim]:
    with RobotSim(seed=7) as running:
        running.add_server(321)
        yield running


@pytest.fixture
def http(sim: RobotSim) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, auth=(sim.username, sim.password)) as client:
        yield client


def test_the_51st_reset_in_an_hour_gets_the_documented_403(sim: RobotSim, http: httpx.Client) -> None:
    statuses = [http.post("/reset/321", data={"type": "hw"}).status_code for _ in range(50)]
    assert statuses == [200] * 50
    refused = http.post("/reset/321", data={"type": "hw"})
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error == {
        "status": 403,
        "code": "RATE_LIMIT_EXCEEDED",
        "message": "rate limit exceeded",
        "max_requests": 50,
        "interval": 3600,
    }
    # Other endpoints have their own counters.
    assert http.get("/reset/321").status_code == 200
    # The window slides; refused requests were not counted.
    sim.clock.advance(3599)
    assert http.post("/reset/321", data={"type": "hw"}).status_code == 403
    sim.clock.advance(1.5)
    assert http.post("/reset/321", data={"type": "hw"}).status_code == 200
    assert sim.count("POST", "/reset/") == 53


def test_orders_are_limited_per_day(sim: RobotSim, http: httpx.Client) -> None:
    form = {"product_id": "GEX131", "location": "FSN1", "password": "x", "test": "true"}
    assert [http.post("/order/server/transaction", data=form).status_code for _ in range(20)] == [201] * 20
    refused = http.post("/order/server/transaction", data=form)
    assert refused.status_code == 403
    assert refused.json()["error"]["interval"] == 86400
    assert refused.json()["error"]["max_requests"] == 20


def test_time_compression_shortens_windows() -> None:
    with RobotSim(compression=3600.0) as fast:
        fast.add_server(1)
        before = fast.clock.now()
        with httpx.Client(base_url=fast.url, auth=(fast.username, fast.password)) as http:
            assert http.get("/server/1").status_code == 200
        assert fast.clock.now() - before > 0
        assert fast.clock.real_seconds(3600) == pytest.approx(1.0)


def test_three_failed_logins_block_the_ip_for_ten_minutes(sim: RobotSim, http: httpx.Client) -> None:
    with httpx.Client(base_url=sim.url, auth=(sim.username, "wrong")) as bad:
        answers = [bad.get("/server") for _ in range(3)]
    assert [a.status_code for a in answers] == [401, 401, 401]
    assert answers[0].headers["www-authenticate"].startswith("Basic")
    blocked = http.get("/server")
    assert blocked.status_code == 401
    assert [e.code for e in sim.log][-1] == "BLOCKED"
    sim.clock.advance(599)
    assert http.get("/server").status_code == 401
    sim.clock.advance(2)
    assert http.get("/server").status_code == 200


def test_two_failures_do_not_block(sim: RobotSim, http: httpx.Client) -> None:
    for _ in range(2):
        assert httpx.get(f"{sim.url}/server", auth=(sim.username, "nope")).status_code == 401
    assert httpx.get(f"{sim.url}/server").status_code == 401  # no credentials at all: a third failure
    assert http.get("/server").status_code == 401  # blocked now
    sim.clock.advance(601)
    assert http.get("/server").status_code == 200


def test_the_request_log_is_readable_from_python_and_http(sim: RobotSim, http: httpx.Client) -> None:
    http.get("/server")
    http.get("/server/999")
    http.post("/reset/321", data={"type": "hw"})
    entries = [(e.method, e.path, e.endpoint, e.status, e.code) for e in sim.log]
    assert entries == [
        ("GET", "/server", "GET /server", 200, None),
        ("GET", "/server/999", "GET /server/{n}", 404, "SERVER_NOT_FOUND"),
        ("POST", "/reset/321", "POST /reset/{n}", 200, None),
    ]
    assert sim.count("GET", "/server") == 2
    assert sim.count(None, "/reset") == 1
    over_http = httpx.get(f"{sim.url}/_sim/log", params={"since": 1}).json()
    assert [(e["path"], e["status"], e["code"]) for e in over_http] == [
        ("/server/999", 404, "SERVER_NOT_FOUND"),
        ("/reset/321", 200, None),
    ]
    assert all(e["user"] == sim.username for e in over_http)
    assert "password" not in str(over_http)
