"""The Robot simulator's account: servers, reset, rescue and keys, answering with Robot's bodies.

Each handler takes the parsed request and returns ``(status, body)`` shaped like the published
samples (``tests/fixtures/hrobot``), or raises ``ApiError`` with a documented code. The HTTP layer
(``robot.py``) does auth, limits and faults; this module is the account's state and its rules.

Choices where the doc is silent (all strict, so a client cannot rely on leniency):

- A reset type outside the server's ``GET /reset`` list is ``400 INVALID_INPUT`` (invalid: type);
  ``404 RESET_NOT_AVAILABLE`` is kept for servers without any reset option, as its name says.
- Activating rescue while an activation is pending is ``409 BOOT_ALREADY_ENABLED`` (a code the Go and
  Rust clients know but the doc tables lack); CAPH deletes first for this reason.
- Every activation generates a new root password and new ed25519 host keys. The activation is
  consumed by the next boot: after it, ``GET /boot/{n}/rescue`` says ``active: false``.
- ``power`` on a running server is an ACPI shutdown (the machine stays off), ``power_long`` forces it
  off, ``man`` boots after ``manual_reset_delay_s`` and answers 409 ``RESET_MANUAL_ACTIVE`` meanwhile.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import heapq
import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paramiko

from capi_gpu_sim.robot_hooks import BootKind, BootTarget, HostKeyPair

RESET_TYPES = ("sw", "hw", "man", "power", "power_long")
RESCUE_OS = ["linux", "vkvm"]


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(f"{status} {code}")
        self.status = status
        self.code = code
        self.body = {"error": {"status": status, "code": code, "message": message, **extra}}


def invalid_input(*, missing: list[str] | None = None, invalid: list[str] | None = None) -> ApiError:
    return ApiError(400, "INVALID_INPUT", "invalid input", missing=missing, invalid=invalid)


class Form:
    """A form body; ``name[]`` arrays and repeated plain keys (what Go/Rust clients send) both work."""

    def __init__(self, fields: dict[str, list[str]]) -> None:
        self._fields = fields

    def one(self, name: str) -> str | None:
        values = self._fields.get(name)
        return values[0] if values else None

    def required(self, name: str) -> str:
        value = self.one(name)
        if value is None or value == "":
            raise invalid_input(missing=[name])
        return value

    def many(self, name: str) -> list[str]:
        return [*self._fields.get(f"{name}[]", []), *self._fields.get(name, [])]


@dataclass
class RescueActivation:
    os: str
    password: str
    authorized: list[str]  # fingerprints
    host_keys: list[HostKeyPair]
    keyboard: str


@dataclass
class SimKey:
    name: str
    fingerprint: str
    type: str
    size: int
    data: str
    created_at: str


@dataclass
class SimServer:
    number: int
    name: str
    ip: str
    ipv6_net: str
    product: str = "GEX131"
    dc: str = "FSN1-DC14"
    status: str = "ready"
    reset_types: list[str] = field(default_factory=lambda: ["sw", "hw", "man"])
    vswitch_capable: bool = True
    paid_until: str = "2026-12-31"
    cancelled: bool = False
    cancellation: dict[str, Any] | None = None
    powered: bool = True
    rescue: RescueActivation | None = None
    last_rescue: RescueActivation | None = None
    manual_reset_until: float | None = None
    boots: int = 0

    def summary(self) -> dict[str, Any]:
        return {
            "server_ip": self.ip,
            "server_ipv6_net": self.ipv6_net,
            "server_number": self.number,
            "server_name": self.name,
            "product": self.product,
            "dc": self.dc,
            "traffic": "unlimited",
            "status": self.status,
            "cancelled": self.cancelled,
            "paid_until": self.paid_until,
            "ip": [self.ip],
            "subnet": [{"ip": self.ipv6_net, "mask": "64"}],
        }

    def detail(self) -> dict[str, Any]:
        flags = {"rescue": True, "vnc": True, "windows": False, "plesk": False, "cpanel": False, "wol": True}
        return {
            **self.summary(),
            **flags,
            "reset": bool(self.reset_types),
            "hot_swap": False,
            "linked_storagebox": None,
        }

    def address(self) -> dict[str, Any]:
        return {"server_ip": self.ip, "server_ipv6_net": self.ipv6_net, "server_number": self.number}


PowerEvent = tuple[int, str, BootTarget]


class RobotWorld:
    """The account. Not thread-safe by itself: ``robot.RobotSim`` holds one lock around every call."""

    def __init__(self, *, now: Callable[[], float], wall: Callable[[], float]) -> None:
        self.now = now
        self.wall = wall
        self.servers: dict[int, SimServer] = {}
        self.keys: dict[str, SimKey] = {}
        self.never_boot: set[int] = set()
        self.impostor_rescue: set[int] = set()  # their rescue boots present keys Robot never reported
        self.report_host_keys = True
        self.manual_reset_delay_s = 1800.0
        self.power_events: list[PowerEvent] = []  # drained by the sim into the hook thread
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._due: float | None = None

    # --- timers --------------------------------------------------------------------------------

    def schedule(self, delay_s: float, action: Callable[[], None]) -> None:
        # A timer set by a timer counts from when the first one was due, not from when we noticed:
        # after a clock jump, a delivery and its handover keep their documented spacing.
        base = self._due if self._due is not None else self.now()
        heapq.heappush(self._timers, (base + delay_s, next(self._seq), action))

    def tick(self) -> None:
        now = self.now()
        while self._timers and self._timers[0][0] <= now:
            due, _, action = heapq.heappop(self._timers)
            self._due = due
            try:
                action()
            finally:
                self._due = None

    def date(self) -> dt.date:
        return dt.datetime.fromtimestamp(self.wall(), dt.UTC).date()

    def iso_now(self) -> str:
        return dt.datetime.fromtimestamp(self.wall(), dt.UTC).astimezone().isoformat(timespec="seconds")

    # --- servers -------------------------------------------------------------------------------

    def server(self, ref: str) -> SimServer:
        """By number, or by main IP (deprecated in Robot, still accepted)."""
        if ref.isdigit() and int(ref) in self.servers:
            return self.servers[int(ref)]
        for server in self.servers.values():
            if server.ip == ref:
                return server
        raise ApiError(404, "SERVER_NOT_FOUND", "server not found")

    def list_servers(self) -> tuple[int, Any]:
        if not self.servers:
            raise ApiError(404, "SERVER_NOT_FOUND", "no servers")
        return 200, [{"server": s.summary()} for s in sorted(self.servers.values(), key=lambda s: s.number)]

    def get_server(self, n: str) -> tuple[int, Any]:
        return 200, {"server": self.server(n).detail()}

    def rename_server(self, n: str, form: Form) -> tuple[int, Any]:
        server = self.server(n)
        name = form.required("server_name")
        if len(name) > 100:
            raise invalid_input(invalid=["server_name"])
        server.name = name
        return 200, {"server": server.detail()}

    # --- reset ---------------------------------------------------------------------------------

    def _reset_body(self, server: SimServer) -> dict[str, Any]:
        status = ("running" if server.powered else "stopped") if "power" in server.reset_types else "not supported"
        return {**server.address(), "type": list(server.reset_types), "operating_status": status}

    def list_resets(self) -> tuple[int, Any]:
        if not self.servers:
            raise ApiError(404, "SERVER_NOT_FOUND", "no servers")
        return 200, [{"reset": self._reset_body(s)} for s in sorted(self.servers.values(), key=lambda s: s.number)]

    def get_reset(self, n: str) -> tuple[int, Any]:
        server = self.server(n)
        if not server.reset_types:
            raise ApiError(404, "RESET_NOT_AVAILABLE", "the server has no reset option")
        return 200, {"reset": self._reset_body(server)}

    def reset(self, n: str, form: Form) -> tuple[int, Any]:
        server = self.server(n)
        kind = form.required("type")
        if kind not in RESET_TYPES:
            raise invalid_input(invalid=["type"])
        if not server.reset_types:
            raise ApiError(404, "RESET_NOT_AVAILABLE", "the server has no reset option")
        if kind not in server.reset_types:
            raise invalid_input(invalid=["type"])
        if server.manual_reset_until is not None:
            raise ApiError(409, "RESET_MANUAL_ACTIVE", "a manual reset is already pending")
        self._press(server, kind)
        return 200, {"reset": {**server.address(), "type": kind}}

    def _press(self, server: SimServer, kind: str) -> None:
        if kind == "man":
            server.manual_reset_until = self.now() + self.manual_reset_delay_s

            def technician() -> None:
                server.manual_reset_until = None
                self._boot(server, kind)

            self.schedule(self.manual_reset_delay_s, technician)
        elif kind == "power_long" or (kind == "power" and server.powered):
            server.powered = False
            self.power_events.append((server.number, kind, BootTarget(BootKind.OFF)))
        else:
            self._boot(server, kind)

    def _boot(self, server: SimServer, kind: str) -> None:
        server.powered = True
        self.power_events.append((server.number, kind, self.next_boot(server)))

    def next_boot(self, server: SimServer) -> BootTarget:
        """What the boot that starts now loads: it counts as a boot and consumes a pending rescue activation,
        whether Robot reset the server or its OS rebooted itself."""
        server.boots += 1
        if server.number in self.never_boot:
            return BootTarget(BootKind.HUNG)
        if server.rescue is not None:
            rescue, server.rescue = server.rescue, None  # the activation applies to this boot only
            authorized = tuple(self.keys[fp].data for fp in rescue.authorized if fp in self.keys)
            host_keys = tuple(rescue.host_keys)
            if server.number in self.impostor_rescue:
                host_keys = tuple(HostKeyPair.generate() for _ in host_keys)
            return BootTarget(BootKind.RESCUE, rescue.password, authorized, host_keys)
        return BootTarget(BootKind.INSTALLED)

    # --- rescue --------------------------------------------------------------------------------

    def _key_ref(self, fp: str, *, with_name: bool) -> dict[str, Any]:
        key = self.keys.get(fp)
        inner: dict[str, Any] = {
            "fingerprint": fp,
            "type": key.type if key else None,
            "size": key.size if key else None,
        }
        if with_name and key is not None:
            inner["name"] = key.name
        return {"key": inner}

    def _rescue_body(self, server: SimServer, activation: RescueActivation | None, *, active: bool) -> Any:
        if activation is None:
            base = {"os": list(RESCUE_OS), "arch": [64], "active": False, "password": None}
            return {"rescue": {**server.address(), **base, "authorized_key": [], "host_key": []}}
        host_keys = [
            {"key": {"fingerprint": hk.fingerprint, "type": hk.key_type, "size": hk.size}}
            for hk in activation.host_keys
            if self.report_host_keys
        ]
        body = {
            **server.address(),
            "os": activation.os,
            "arch": 64,
            "active": active,
            "password": activation.password,
            "authorized_key": [self._key_ref(fp, with_name=True) for fp in activation.authorized],
            "host_key": host_keys,
            "keyboard": activation.keyboard,
        }
        return {"rescue": body}

    def get_rescue(self, n: str) -> tuple[int, Any]:
        server = self.server(n)
        return 200, self._rescue_body(server, server.rescue, active=server.rescue is not None)

    def last_rescue(self, n: str) -> tuple[int, Any]:
        server = self.server(n)
        if server.last_rescue is None:
            raise ApiError(404, "NOT_FOUND", "no rescue activation yet")
        return 200, self._rescue_body(server, server.last_rescue, active=server.rescue is server.last_rescue)

    def activate_rescue(self, n: str, form: Form) -> tuple[int, Any]:
        server = self.server(n)
        os_name = form.required("os")
        if os_name not in RESCUE_OS:
            raise invalid_input(invalid=["os"])
        fingerprints = form.many("authorized_key")
        if any(fp not in self.keys for fp in fingerprints):
            raise invalid_input(invalid=["authorized_key"])
        if server.rescue is not None:
            raise ApiError(409, "BOOT_ALREADY_ENABLED", "a boot configuration is already active")
        activation = RescueActivation(
            os=os_name,
            password=secrets.token_urlsafe(12),
            authorized=fingerprints,
            host_keys=[HostKeyPair.generate()],
            keyboard=form.one("keyboard") or "us",
        )
        server.rescue = server.last_rescue = activation
        return 200, self._rescue_body(server, activation, active=True)

    def deactivate_rescue(self, n: str) -> tuple[int, Any]:
        server = self.server(n)
        server.rescue = None
        return 200, self._rescue_body(server, None, active=False)

    # --- keys ----------------------------------------------------------------------------------

    def _key_body(self, key: SimKey) -> dict[str, Any]:
        fields = ("name", "fingerprint", "type", "size", "data", "created_at")
        return {"key": {f: getattr(key, f) for f in fields}}

    def list_keys(self) -> tuple[int, Any]:
        if not self.keys:
            raise ApiError(404, "NOT_FOUND", "no keys")
        return 200, [self._key_body(k) for k in self.keys.values()]

    def get_key(self, fp: str) -> tuple[int, Any]:
        if fp not in self.keys:
            raise ApiError(404, "NOT_FOUND", "key not found")
        return 200, self._key_body(self.keys[fp])

    def create_key(self, form: Form) -> tuple[int, Any]:
        name, data = form.required("name"), form.required("data")
        parts = data.split()
        try:
            pkey = paramiko.PKey.from_type_string(parts[0], base64.b64decode(parts[1], validate=True))
        except (IndexError, ValueError, binascii.Error, paramiko.SSHException) as exc:
            raise invalid_input(invalid=["data"]) from exc
        digest = pkey.get_fingerprint().hex()  # paramiko's MD5, independent of the client's
        fp = ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))
        if fp in self.keys:
            raise ApiError(409, "KEY_ALREADY_EXISTS", "the key already exists")
        key_type = parts[0].removeprefix("ssh-").split("-")[0].upper()
        self.keys[fp] = SimKey(name, fp, key_type, pkey.get_bits(), data, self.iso_now())
        return 201, self._key_body(self.keys[fp])

    def rename_key(self, fp: str, form: Form) -> tuple[int, Any]:
        if fp not in self.keys:
            raise ApiError(404, "NOT_FOUND", "key not found")
        self.keys[fp].name = form.required("name")
        return 200, self._key_body(self.keys[fp])

    def delete_key(self, fp: str) -> tuple[int, Any]:
        if self.keys.pop(fp, None) is None:
            raise ApiError(404, "NOT_FOUND", "key not found")
        return 200, None
