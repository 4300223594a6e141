"""Robot client wire format: object-name unwrapping, vSwitch without wrapping, 404-as-empty lists,
form bodies with name[] arrays, auth and Accept headers, malformed answers."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest

from capi_gpu.hetzner import errors, models
from capi_gpu.hetzner import robot as robot_mod

Sample = Callable[[str], Any]


class Recorder:
    """A handler answering from a route table and keeping every request it saw."""

    def __init__(self, routes: dict[tuple[str, str], tuple[int, Any]]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        status, body = self.routes[(request.method, request.url.path)]
        return httpx.Response(status, json=body) if body is not None else httpx.Response(status)

    def form(self, index: int = -1) -> dict[str, list[str]]:
        return parse_qs(self.requests[index].content.decode())


async def test_server_list_unwraps_each_object_and_nulls_become_empty(make_client: Any, sample: Sample) -> None:
    robot = make_client(Recorder({("GET", "/server"): (200, sample("server_list"))}))
    servers = await robot.list_servers()
    assert [s.server_number for s in servers] == [321, 421]
    assert servers[0].status is models.ServerStatus.READY
    assert servers[0].subnet[0].mask == "64"
    assert servers[1].subnet == []
    assert servers[1].dc == "FSN1-DC10"


async def test_server_get_has_capability_flags_and_404_is_not_found(make_client: Any, sample: Sample) -> None:
    recorder = Recorder(
        {("GET", "/server/321"): (200, sample("server_get")), ("GET", "/server/9"): (404, sample("server_get_404"))}
    )
    robot = make_client(recorder)
    server = await robot.get_server(321)
    assert (server.server_name, server.reset, server.rescue) == ("server1", True, True)
    with pytest.raises(errors.RobotNotFound) as caught:
        await robot.get_server(9)
    assert caught.value.code == "SERVER_NOT_FOUND"


@pytest.mark.parametrize(
    ("path", "method_name"),
    [
        ("/server", "list_servers"),
        ("/key", "list_keys"),
        ("/reset", "list_resets"),
        ("/order/server/transaction", "list_transactions"),
    ],
)
async def test_list_404_means_empty(make_client: Any, path: str, method_name: str) -> None:
    recorder = Recorder({("GET", path): (404, {"error": {"status": 404, "code": "NOT_FOUND", "message": "x"}})})
    robot = make_client(recorder)
    assert await getattr(robot, method_name)() == []
    assert len(recorder.requests) == 1


async def test_requests_carry_basic_auth_and_accept_json(make_client: Any, sample: Sample) -> None:
    recorder = Recorder({("GET", "/server"): (200, sample("server_list"))})
    robot = make_client(recorder, username="alice", password="pw")
    await robot.list_servers()
    headers = recorder.requests[0].headers
    assert headers["accept"] == "application/json"
    assert headers["authorization"] == "Basic " + base64.b64encode(b"alice:pw").decode()


async def test_reset_posts_its_type_and_get_lists_the_types(make_client: Any, sample: Sample) -> None:
    recorder = Recorder(
        {("GET", "/reset/321"): (200, sample("reset_get")), ("POST", "/reset/321"): (200, sample("reset_post"))}
    )
    robot = make_client(recorder)
    options = await robot.get_reset(321)
    assert options.types == ["sw", "hw", "man"]
    assert options.supports(models.ResetType.HARDWARE)
    assert not options.supports(models.ResetType.POWER)
    result = await robot.reset(321, models.ResetType.HARDWARE)
    assert result.type == "hw"
    assert recorder.requests[-1].headers["content-type"] == "application/x-www-form-urlencoded"
    assert recorder.form() == {"type": ["hw"]}


async def test_rescue_activation_sends_fingerprints_as_an_array(make_client: Any, sample: Sample) -> None:
    recorder = Recorder({("POST", "/boot/321/rescue"): (200, sample("boot_rescue_set_with_key"))})
    robot = make_client(recorder)
    rescue = await robot.activate_rescue(321, ["aa:bb", "cc:dd"])
    assert recorder.form() == {"os": ["linux"], "authorized_key[]": ["aa:bb", "cc:dd"]}
    assert rescue.active is True
    assert rescue.password is not None
    assert rescue.password.get_secret_value() == "jEt0dtUvomlyOwRr"
    assert "jEt0dtUvomlyOwRr" not in repr(rescue)
    assert rescue.authorized_fingerprints == ["fi:ng:er:pr:in:t0:00:00:00:00:00:00:00:00:00:00"]


async def test_rescue_get_active_and_inactive_shapes(make_client: Any, sample: Sample) -> None:
    recorder = Recorder(
        {
            ("GET", "/boot/321/rescue"): (200, sample("boot_rescue_get_inactive")),
            ("DELETE", "/boot/321/rescue"): (200, sample("boot_rescue_get_inactive")),
        }
    )
    robot = make_client(recorder)
    inactive = await robot.get_rescue(321)
    assert inactive.active is False
    assert inactive.os == ["linux", "freebsd", "vkvm"]
    assert inactive.password is None
    assert (await robot.disable_rescue(321)).active is False
    assert recorder.requests[-1].method == "DELETE"


async def test_keys_and_transactions_unwrap(make_client: Any, sample: Sample) -> None:
    recorder = Recorder(
        {
            ("GET", "/key"): (200, sample("key_list")),
            ("GET", "/order/server/transaction"): (200, sample("order-server-transaction-list")),
        }
    )
    robot = make_client(recorder)
    keys = await robot.list_keys()
    assert [k.type for k in keys] == ["ECDSA", "ED25519"]
    transactions = await robot.list_transactions()
    assert [t.status for t in transactions] == [models.TransactionStatus.IN_PROCESS, models.TransactionStatus.READY]
    assert transactions[0].server_number is None
    assert transactions[1].server_number == 107239
    assert transactions[1].host_key[0].key.fingerprint == "c1:e4:08:73:dd:f7:e9:d1:94:ab:e9:0f:28:b2:d2:ed"


async def test_vswitch_answers_are_not_wrapped(make_client: Any) -> None:
    vswitch = {
        "id": 4321,
        "name": "gpu-net",
        "vlan": 4000,
        "cancelled": False,
        "server": [{"server_number": 321, "server_ip": "1.2.3.4", "status": "processing"}],
        "subnet": None,
        "cloud_network": [],
    }
    recorder = Recorder(
        {
            ("GET", "/vswitch"): (200, [{"id": 4321, "name": "gpu-net", "vlan": 4000, "cancelled": False}]),
            ("GET", "/vswitch/4321"): (200, vswitch),
            ("POST", "/vswitch/4321/server"): (201, None),
        }
    )
    robot = make_client(recorder)
    assert [v.vlan for v in await robot.list_vswitches()] == [4000]
    got = await robot.get_vswitch(4321)
    assert got.server[0].status == "processing"
    assert got.subnet == []
    await robot.add_vswitch_servers(4321, [321, 421])
    assert recorder.form() == {"server[]": ["321", "421"]}


async def test_order_form_carries_test_flag_keys_and_addons(make_client: Any, sample: Sample) -> None:
    transaction = sample("order-server-transaction-list")[0]
    recorder = Recorder({("POST", "/order/server/transaction"): (201, transaction)})
    robot = make_client(recorder)
    order = models.OrderRequest(
        product_id="GEX131", location="FSN1", authorized_keys=["aa:bb"], addons=["primary_ipv4"]
    )
    result = await robot.order_server(order, test=True)
    assert result.id == "B20150121-344957-251478"
    assert recorder.form() == {
        "product_id": ["GEX131"],
        "location": ["FSN1"],
        "authorized_key[]": ["aa:bb"],
        "addon[]": ["primary_ipv4"],
        "test": ["true"],
    }


def test_order_needs_exactly_one_of_keys_or_password() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        models.OrderRequest(product_id="GEX131", location="FSN1").form(test=True)
    both = models.OrderRequest(product_id="GEX131", location="FSN1", authorized_keys=["a"], password="x")
    with pytest.raises(ValueError, match="exactly one"):
        both.form(test=True)


async def test_unexpected_bodies_are_terminal_not_crashes(make_client: Any) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server/1":
            return httpx.Response(200, json={"reset": {"server_number": 1}})
        return httpx.Response(200, text="<html>proxy</html>")

    robot = make_client(handler)
    for call in (robot.get_server(1), robot.get_server(2)):
        with pytest.raises(errors.RobotTerminalError) as caught:
            await call
        assert caught.value.code == "INVALID_RESPONSE"


def test_urls_with_credentials_or_plain_http_are_refused(registry: Any) -> None:
    with pytest.raises(ValueError, match="credentials"):
        robot_mod.RobotClient("u", "p", base_url="https://u:p@robot-ws.your-server.de", registry=registry)
    with pytest.raises(ValueError, match="https"):
        robot_mod.RobotClient("u", "p", base_url="http://robot-ws.your-server.de", registry=registry)
    assert registry.accounts() == []
