"""Robot simulator, commerce: the GEX131 product and its Oct 2026 prices, order validation, test=true
ordering nothing, delivery after the configured delay (in process, then ready) with on_new_server,
cancellation rules (vSwitches: test_robot_sim_vswitch.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from capi_gpu_sim.robot import NewServer, RobotSim

ORDER = {"product_id": "GEX131", "location": "FSN1", "password": "not-a-real-one"}


class Deliveries:
    def __init__(self) -> None:
        self.servers: list[NewServer] = []
        self.lock = threading.Lock()

    def on_new_server(self, server: NewServer) -> None:
        with self.lock:
            self.servers.append(server)


@pytest.fixture
def deliveries() -> Deliveries:
    return Deliveries()


@pytest.fixture
def sim(deliveries: Deliveries) -> Iterator[RobotSim]:
    with RobotSim(seed=5, new_server_hook=deliveries) as running:
        running.add_server(321)
        running.add_server(322, vswitch_capable=False)
        yield running


@pytest.fixture
def http(sim: RobotSim) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, auth=(sim.username, sim.password)) as client:
        yield client


def test_gex131_carries_the_october_2026_prices(http: httpx.Client) -> None:
    product = http.get("/order/server/product/GEX131").json()["product"]
    assert product["location"] == ["FSN1", "NBG1"]
    fsn1 = next(p for p in product["prices"] if p["location"] == "FSN1")
    assert fsn1["price"]["net"] == "1497.3000"
    assert fsn1["price"]["hourly_net"] == "2.3995"
    assert fsn1["price_setup"]["net"] == "1499.0000"
    assert [p["product"]["id"] for p in http.get("/order/server/product", params={"location": "NBG1"}).json()] == [
        "GEX131"
    ]
    assert http.get("/order/server/product", params={"location": "HEL1"}).status_code == 404
    assert http.get("/order/server/product/GEX999").json()["error"]["code"] == "NOT_FOUND"


@pytest.mark.parametrize(
    ("change", "field", "kind"),
    [
        ({"product_id": "GEX999"}, "product_id", "invalid"),
        ({"location": "HEL1"}, "location", "invalid"),
        ({"password": ""}, "authorized_key", "missing"),
        ({"authorized_key[]": "00:11"}, "password", "invalid"),
        ({"addon[]": "gpu_upgrade"}, "addon", "invalid"),
    ],
)
def test_orders_are_validated(http: httpx.Client, change: dict[str, str], field: str, kind: str) -> None:
    form = {**ORDER, **change}
    if form["password"] == "":
        del form["password"]
    answer = http.post("/order/server/transaction", data=form)
    assert answer.status_code == 400
    assert field in answer.json()["error"][kind]


def test_a_dry_run_orders_nothing(sim: RobotSim, http: httpx.Client) -> None:
    answer = http.post("/order/server/transaction", data={**ORDER, "test": "true"})
    assert answer.status_code == 201
    assert answer.json()["transaction"]["status"] == "in process"
    assert http.get("/order/server/transaction").status_code == 404
    sim.clock.advance(10 * 86400)
    assert sim.wait_idle()
    assert len(http.get("/server").json()) == 2


def test_an_order_becomes_a_server_after_the_delay(sim: RobotSim, http: httpx.Client, deliveries: Deliveries) -> None:
    sim.commerce.delivery_delay_s = 3600
    transaction = http.post("/order/server/transaction", data=ORDER).json()["transaction"]
    assert (transaction["status"], transaction["server_number"]) == ("in process", None)
    assert transaction["id"].startswith("B")
    sim.clock.advance(3599)
    assert sim.wait_idle()
    assert len(http.get("/server").json()) == 2
    sim.clock.advance(1)
    assert sim.wait_idle()
    (delivered,) = deliveries.servers
    assert delivered.product == "GEX131"
    server = http.get(f"/server/{delivered.server_number}").json()["server"]
    assert (server["status"], server["dc"]) == ("in process", "FSN1-DC14")
    assert http.get(f"/order/server/transaction/{transaction['id']}").json()["transaction"]["status"] == "in process"
    sim.clock.advance(sim.commerce.handover_s)
    assert sim.wait_idle()
    done = http.get(f"/order/server/transaction/{transaction['id']}").json()["transaction"]
    assert (done["status"], done["server_number"]) == ("ready", delivered.server_number)
    assert http.get(f"/server/{delivered.server_number}").json()["server"]["status"] == "ready"


def test_cancellation_rules(http: httpx.Client) -> None:
    before = http.get("/server/321/cancellation").json()["cancellation"]
    assert (before["cancelled"], before["reservation_possible"]) == (False, False)
    assert isinstance(before["cancellation_reason"], list)
    reserve = http.post("/server/321/cancellation", data={"cancellation_date": "now", "reserve_location": "true"})
    assert reserve.json()["error"]["code"] == "SERVER_CANCELLATION_RESERVE_LOCATION_FALSE_ONLY"
    past = http.post("/server/321/cancellation", data={"cancellation_date": "2001-01-01", "reserve_location": "false"})
    assert past.json()["error"]["invalid"] == ["cancellation_date"]
    done = http.post("/server/321/cancellation", data={"cancellation_date": "now", "reserve_location": "false"})
    assert done.json()["cancellation"]["cancelled"] is True
    again = http.post("/server/321/cancellation", data={"cancellation_date": "now", "reserve_location": "false"})
    assert (again.status_code, again.json()["error"]["code"]) == (409, "CONFLICT")
    assert http.get("/server/321").json()["server"]["cancelled"] is True
