"""Robot simulator, boots: rescue activation (generated password, host_key fingerprints of keys the
sim holds), consumption by the next reset or by a reboot the OS did itself (``consume_boot_target``),
the PowerHook's BootTarget, per-server reset types and the documented errors, power/power_long/man
semantics, the key store."""

from __future__ import annotations

import base64
import hashlib
import threading
from collections.abc import Iterator

import httpx
import paramiko
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from capi_gpu_sim.robot import BootKind, BootTarget, RobotSim


class Fleet:
    def __init__(self) -> None:
        self.events: list[tuple[int, str, BootTarget]] = []
        self.lock = threading.Lock()

    def on_reset(self, server_number: int, kind: str, boot: BootTarget) -> None:
        with self.lock:
            self.events.append((server_number, kind, boot))


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


@pytest.fixture
def sim(fleet: Fleet) -> Iterator[RobotSim]:
    with RobotSim(seed=3, power_hook=fleet) as running:
        running.add_server(321)
        running.add_server(322, reset_types=["sw", "hw", "man", "power", "power_long"])
        running.add_server(323, reset_types=[])
        yield running


@pytest.fixture
def http(sim: RobotSim) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, auth=(sim.username, sim.password)) as client:
        yield client


def new_public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " op@test"


def upload(http: httpx.Client, public_key: str) -> str:
    answer = http.post("/key", data={"name": "op", "data": public_key})
    assert answer.status_code == 201
    return str(answer.json()["key"]["fingerprint"])


def test_key_store_fingerprints_and_conflicts(http: httpx.Client) -> None:
    public_key = new_public_key()
    fingerprint = upload(http, public_key)
    blob = paramiko.Ed25519Key(data=base64.b64decode(public_key.split()[1])).asbytes()
    assert fingerprint == ":".join(f"{b:02x}" for b in hashlib.md5(blob).digest())
    again = http.post("/key", data={"name": "dup", "data": public_key})
    assert (again.status_code, again.json()["error"]["code"]) == (409, "KEY_ALREADY_EXISTS")
    assert http.get(f"/key/{fingerprint}").json()["key"]["type"] == "ED25519"
    bad = http.post("/key", data={"name": "x", "data": "ssh-ed25519 not-base64"})
    assert bad.json()["error"]["invalid"] == ["data"]


def test_rescue_activation_returns_password_and_host_keys_it_holds(sim: RobotSim, http: httpx.Client) -> None:
    fingerprint = upload(http, new_public_key())
    rescue = http.post("/boot/321/rescue", data={"os": "linux", "authorized_key[]": [fingerprint]}).json()["rescue"]
    assert rescue["active"] is True
    assert len(rescue["password"]) >= 12
    assert [k["key"]["fingerprint"] for k in rescue["authorized_key"]] == [fingerprint]
    held = sim.rescue_host_keys(321)
    assert [k["key"]["fingerprint"] for k in rescue["host_key"]] == [k.fingerprint for k in held]
    assert all(len(k["key"]["fingerprint"].split(":")) == 16 for k in rescue["host_key"])
    private = serialization.load_ssh_private_key(held[0].private_openssh.encode(), password=None)
    public = private.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert public.decode() == held[0].public_openssh
    assert http.get("/boot/321/rescue").json()["rescue"]["password"] == rescue["password"]


def test_next_boot_consumes_the_rescue_activation(sim: RobotSim, http: httpx.Client, fleet: Fleet) -> None:
    public_key = new_public_key()
    fingerprint = upload(http, public_key)
    password = http.post("/boot/321/rescue", data={"os": "linux", "authorized_key": fingerprint}).json()["rescue"][
        "password"
    ]
    assert http.post("/reset/321", data={"type": "hw"}).json() == {
        "reset": {"server_ip": "192.0.2.72", "server_ipv6_net": "2001:db8:141::", "server_number": 321, "type": "hw"}
    }
    assert http.get("/boot/321/rescue").json()["rescue"]["active"] is False
    assert http.get("/boot/321/rescue/last").json()["rescue"]["password"] == password
    http.post("/reset/321", data={"type": "sw"})
    assert sim.wait_idle()
    (n1, kind1, first), (n2, kind2, second) = fleet.events
    assert (n1, kind1, first.kind) == (321, "hw", BootKind.RESCUE)
    assert first.rescue_password == password
    assert first.authorized_keys == (public_key,)
    assert first.host_keys == tuple(sim.rescue_host_keys(321))
    assert (n2, kind2, second.kind) == (321, "sw", BootKind.INSTALLED)
    assert password not in repr(first)


def test_a_reboot_from_inside_the_os_consumes_the_activation_without_a_power_event(
    sim: RobotSim, http: httpx.Client, fleet: Fleet
) -> None:
    public_key = new_public_key()
    fingerprint = upload(http, public_key)
    password = http.post("/boot/321/rescue", data={"os": "linux", "authorized_key[]": [fingerprint]}).json()["rescue"][
        "password"
    ]
    with sim.locked() as world:
        boots = world.servers[321].boots
    first = sim.consume_boot_target(321)
    assert (first.kind, first.rescue_password, first.authorized_keys) == (BootKind.RESCUE, password, (public_key,))
    assert first.host_keys == tuple(sim.rescue_host_keys(321))
    assert http.get("/boot/321/rescue").json()["rescue"]["active"] is False
    assert sim.consume_boot_target(321).kind is BootKind.INSTALLED
    with sim.locked() as world:
        assert world.servers[321].boots == boots + 2
    sim.set_faults(never_boot=[321])
    assert sim.consume_boot_target(321).kind is BootKind.HUNG
    assert sim.wait_idle()
    assert fleet.events == [], "the OS rebooted itself: Robot pressed no button"
    with pytest.raises(KeyError):
        sim.consume_boot_target(999)
    assert sim.set_server_ip(321, "10.0.0.7") and not sim.set_server_ip(999, "10.0.0.8")
    assert http.get("/server/321").json()["server"]["server_ip"] == "10.0.0.7"


def test_rescue_cannot_be_activated_twice_and_unknown_keys_are_refused(http: httpx.Client) -> None:
    unknown = http.post("/boot/321/rescue", data={"os": "linux", "authorized_key[]": ["00:11"]})
    assert (unknown.status_code, unknown.json()["error"]["invalid"]) == (400, ["authorized_key"])
    missing = http.post("/boot/321/rescue", data={})
    assert missing.json()["error"]["missing"] == ["os"]
    assert http.post("/boot/321/rescue", data={"os": "linux"}).status_code == 200
    twice = http.post("/boot/321/rescue", data={"os": "linux"})
    assert (twice.status_code, twice.json()["error"]["code"]) == (409, "BOOT_ALREADY_ENABLED")
    assert http.delete("/boot/321/rescue").json()["rescue"]["active"] is False
    assert http.post("/boot/321/rescue", data={"os": "linux"}).status_code == 200


def test_reset_types_are_per_server(http: httpx.Client) -> None:
    assert http.get("/reset/321").json()["reset"]["type"] == ["sw", "hw", "man"]
    assert http.get("/reset/322").json()["reset"]["operating_status"] == "running"
    not_listed = http.post("/reset/321", data={"type": "power"})
    assert (not_listed.status_code, not_listed.json()["error"]["invalid"]) == (400, ["type"])
    nonsense = http.post("/reset/321", data={"type": "kick"})
    assert nonsense.json()["error"]["code"] == "INVALID_INPUT"
    none = http.post("/reset/323", data={"type": "hw"})
    assert (none.status_code, none.json()["error"]["code"]) == (404, "RESET_NOT_AVAILABLE")
    missing = http.post("/reset/999", data={"type": "hw"})
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "SERVER_NOT_FOUND")
    listing = http.get("/reset").json()
    assert [r["reset"]["server_number"] for r in listing] == [321, 322, 323]


def test_power_button_semantics(sim: RobotSim, http: httpx.Client, fleet: Fleet) -> None:
    http.post("/reset/322", data={"type": "power"})  # running: ACPI shutdown
    assert http.get("/reset/322").json()["reset"]["operating_status"] == "stopped"
    http.post("/reset/322", data={"type": "power"})  # off: power on and boot
    http.post("/reset/322", data={"type": "power_long"})
    assert sim.wait_idle()
    assert [e[2].kind for e in fleet.events] == [BootKind.OFF, BootKind.INSTALLED, BootKind.OFF]


def test_manual_reset_blocks_further_resets_until_the_technician_came(
    sim: RobotSim, http: httpx.Client, fleet: Fleet
) -> None:
    assert http.post("/reset/321", data={"type": "man"}).status_code == 200
    busy = http.post("/reset/321", data={"type": "hw"})
    assert (busy.status_code, busy.json()["error"]["code"]) == (409, "RESET_MANUAL_ACTIVE")
    assert sim.wait_idle()
    assert fleet.events == []
    sim.clock.advance(1800)
    assert sim.wait_idle()
    assert [(e[1], e[2].kind) for e in fleet.events] == [("man", BootKind.INSTALLED)]
    assert http.post("/reset/321", data={"type": "hw"}).status_code == 200
