"""Robot simulator, faults and fidelity: injected 5xx rate, latency, maintenance 503, a server that
never boots, tighter per-endpoint limits (403 with their window as ``interval``), a rescue system that
presents keys Robot never reported, all settable over HTTP (POST /_sim/faults) as well as from Python; the
request log names a reset's type; and the sim's bodies have the published samples' shapes (same keys, same
wrapping, same error envelope)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from capi_gpu_sim.robot import BootKind, BootTarget, RobotSim

SAMPLES = Path(__file__).resolve().parents[2] / "fixtures" / "hrobot"


def sample(name: str) -> Any:
    return json.loads((SAMPLES / f"hrobot-{name}.json").read_text())


class Fleet:
    def __init__(self) -> None:
        self.kinds: list[BootKind] = []
        self.lock = threading.Lock()

    def on_reset(self, server_number: int, kind: str, boot: BootTarget) -> None:
        with self.lock:
            self.kinds.append(boot.kind)


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


@pytest.fixture
def sim(fleet: Fleet) -> Iterator[RobotSim]:
    with RobotSim(seed=11, power_hook=fleet) as running:
        running.add_server(321)
        yield running


@pytest.fixture
def http(sim: RobotSim) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, auth=(sim.username, sim.password)) as client:
        yield client


def test_error_rate_over_http(sim: RobotSim, http: httpx.Client) -> None:
    assert httpx.post(f"{sim.url}/_sim/faults", json={"error_rate": 1.0}).json()["error_rate"] == 1.0
    failed = http.get("/server")
    assert (failed.status_code, failed.json()["error"]["code"]) == (500, "INTERNAL_ERROR")
    sim.set_faults(error_rate=0.5)
    statuses = [http.get("/server/321").status_code for _ in range(60)]
    assert 10 < statuses.count(500) < 50
    assert set(statuses) == {200, 500}


def test_error_every_nth_request(sim: RobotSim, http: httpx.Client) -> None:
    assert httpx.post(f"{sim.url}/_sim/faults", json={"error_every": 3}).status_code == 200
    statuses = [http.get("/server/321").status_code for _ in range(9)]
    sim.set_faults(error_every=0)
    assert statuses.count(500) == 3
    assert statuses.count(200) == 6
    assert http.get("/server/321").status_code == 200


def test_maintenance_and_latency(sim: RobotSim, http: httpx.Client) -> None:
    httpx.post(f"{sim.url}/_sim/faults", json={"maintenance": True})
    down = http.get("/server")
    assert down.status_code == 503
    assert down.headers["content-type"].startswith("text/html")
    httpx.post(f"{sim.url}/_sim/faults", json={"maintenance": False, "latency_s": 0.2})
    started = time.monotonic()
    assert http.get("/server").status_code == 200
    assert time.monotonic() - started >= 0.2
    assert httpx.get(f"{sim.url}/_sim/faults").json() == {
        "error_rate": 0.0,
        "error_every": 0,
        "latency_s": 0.2,
        "maintenance": False,
        "never_boot": [],
        "rate_limits": {},
        "impostor_rescue": [],
        "vswitch_fail": [],
    }


def test_bad_fault_settings_are_refused(sim: RobotSim) -> None:
    assert httpx.post(f"{sim.url}/_sim/faults", json={"error_rate": 2}).status_code == 400
    assert httpx.post(f"{sim.url}/_sim/faults", json={"typo": 1}).status_code == 400
    assert sim.faults.error_rate == 0.0


def test_a_server_that_never_boots(sim: RobotSim, http: httpx.Client, fleet: Fleet) -> None:
    httpx.post(f"{sim.url}/_sim/faults", json={"never_boot": [321]})
    http.post("/boot/321/rescue", data={"os": "linux"})
    assert http.post("/reset/321", data={"type": "hw"}).status_code == 200
    sim.set_faults(never_boot=[])
    http.post("/reset/321", data={"type": "hw"})
    assert sim.wait_idle()
    assert fleet.kinds == [BootKind.HUNG, BootKind.RESCUE]


def test_tight_limits_answer_403_with_their_window_and_pass_again_after_it(sim: RobotSim, http: httpx.Client) -> None:
    answer = httpx.post(f"{sim.url}/_sim/faults", json={"rate_limits": {"POST /reset/{n}": [1, 120]}})
    assert answer.json()["rate_limits"] == {"POST /reset/{n}": [1, 120.0]}
    assert http.post("/reset/321", data={"type": "sw"}).status_code == 200
    limited = http.post("/reset/321", data={"type": "hw"})
    assert limited.status_code == 403
    assert limited.json()["error"] | {"message": ""} == {
        "status": 403,
        "code": "RATE_LIMIT_EXCEEDED",
        "message": "",
        "max_requests": 1,
        "interval": 120,
    }
    assert http.get("/reset/321").status_code == 200  # other endpoints keep Robot's own limits
    sim.clock.advance(121)
    assert http.post("/reset/321", data={"type": "hw"}).status_code == 200
    assert [(e.status, e.detail) for e in sim.log if e.method == "POST"] == [(200, "sw"), (403, "hw"), (200, "hw")]
    assert httpx.post(f"{sim.url}/_sim/faults", json={"rate_limits": {"GET /nope": [1, 1]}}).status_code == 400


def test_an_impostor_rescue_presents_keys_robot_never_reported(sim: RobotSim, http: httpx.Client) -> None:
    sim.set_faults(impostor_rescue=[321])
    reported = http.post("/boot/321/rescue", data={"os": "linux"}).json()["rescue"]["host_key"]
    booted: list[BootTarget] = []
    sim.power_hook = type("Hook", (), {"on_reset": lambda self, n, kind, boot: booted.append(boot)})()
    assert http.post("/reset/321", data={"type": "hw"}).status_code == 200
    assert sim.wait_idle()
    presented = [k.fingerprint for k in booted[0].host_keys]
    assert booted[0].kind is BootKind.RESCUE and len(presented) == len(reported) == 1
    assert presented[0] != reported[0]["key"]["fingerprint"]


def test_clock_advance_over_http(sim: RobotSim) -> None:
    before = sim.clock.now()
    assert httpx.post(f"{sim.url}/_sim/clock", json={"advance": 3600}).json()["now"] >= before + 3600


def keys_of(body: Any) -> Any:
    if isinstance(body, dict):
        return {k: keys_of(v) for k, v in body.items()}
    if isinstance(body, list):
        return [keys_of(body[0])] if body else []
    return None


@pytest.mark.parametrize(
    ("path", "name", "ignore"),
    [
        ("/server/321", "server_get", set()),
        ("/reset/321", "reset_get", set()),
        ("/server/999", "server_get_404", set()),
    ],
)
def test_bodies_have_the_shape_of_the_published_samples(
    http: httpx.Client, path: str, name: str, ignore: set[str]
) -> None:
    ours, theirs = http.get(path).json(), sample(name)
    (wrapper,) = theirs
    assert set(ours) == {wrapper}
    assert set(theirs[wrapper]) - ignore <= set(ours[wrapper])


def test_list_and_rescue_shapes_match_the_samples(http: httpx.Client) -> None:
    server_list = http.get("/server").json()
    assert set(server_list[0]) == {"server"}
    assert set(sample("server_list")[0]["server"]) <= set(server_list[0]["server"])
    inactive = http.get("/boot/321/rescue").json()["rescue"]
    assert set(sample("boot_rescue_get_inactive")["rescue"]) <= set(inactive)
    active = http.post("/boot/321/rescue", data={"os": "linux"}).json()["rescue"]
    assert set(sample("boot_rescue_set")["rescue"]) <= set(active)
    posted = http.post("/reset/321", data={"type": "hw"}).json()
    assert keys_of(posted) == keys_of(sample("reset_post"))
    invalid = http.post("/reset/321", data={}).json()
    assert set(invalid["error"]) == set(sample("error-invalid-input")["error"])
    assert invalid["error"]["missing"] == ["type"]
