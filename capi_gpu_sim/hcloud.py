"""A small fake of the Hetzner Cloud API (Load Balancers and actions) on loopback HTTP.

hcloud-python talks through ``requests``, which httpx-level fakes cannot intercept, and patching its
internals would test our patch rather than the library. So the fake speaks HTTP, and tests point
``hcloud.Client(api_endpoint=fake.url)`` at it: the real library parses real JSON.

Only what the control-plane endpoint needs: list/get/create/delete Load Balancers and the actions
``add_target``, ``remove_target``, ``add_service``, ``update_service``, ``delete_service``, plus
``GET /actions/{id}``. Bodies have the documented shapes; errors use the documented envelope
``{"error": {"code", "message", "details"}}`` and codes (``not_found``, ``uniqueness_error``,
``invalid_input``, ``target_already_defined``, ``source_port_already_used``, ``unauthorized``).
Actions start ``running`` and finish ``success`` after ``action_polls`` reads, so callers really wait.
``fail_next_action`` makes the next action end in ``error``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import itertools
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

LOCATIONS = {
    "fsn1": ("Falkenstein DC Park 1", "DE", "Falkenstein", "eu-central"),
    "nbg1": ("Nuremberg DC Park 1", "DE", "Nuremberg", "eu-central"),
    "hel1": ("Helsinki DC Park 1", "FI", "Helsinki", "eu-central"),
}
LB_TYPES = {"lb11": (5, 25), "lb21": (15, 75), "lb31": (30, 150)}  # max services, max targets


class CloudApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(code)
        self.status, self.code, self.message = status, code, message


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


class FakeHCloud:
    def __init__(
        self,
        *,
        token: str = "fake-hcloud-token",
        action_polls: int = 1,
        public_ipv4: Callable[[int], str] = lambda n: f"203.0.113.{n % 250 + 1}",
    ) -> None:
        self.token = token
        self.action_polls = action_polls
        self.public_ipv4 = public_ipv4
        self.fail_next_action = False
        self.load_balancers: dict[int, dict[str, Any]] = {}
        self.actions: dict[int, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self._polls: dict[int, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> FakeHCloud:
        handler = type("_BoundHandler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> FakeHCloud:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("not running")
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    # --- state ---------------------------------------------------------------------------------

    def _action(self, command: str, lb_id: int) -> dict[str, Any]:
        action_id = next(self._ids)
        failed, self.fail_next_action = self.fail_next_action, False
        self.actions[action_id] = {
            "id": action_id,
            "command": command,
            "status": "running",
            "progress": 0,
            "started": _now(),
            "finished": None,
            "resources": [{"id": lb_id, "type": "load_balancer"}],
            "error": {"code": "action_failed", "message": "injected failure"} if failed else None,
        }
        self._polls[action_id] = 0
        return dict(self.actions[action_id], error=None)

    def _read_action(self, action_id: int) -> dict[str, Any]:
        action = self.actions.get(action_id)
        if action is None:
            raise CloudApiError(404, "not_found", "action not found")
        self._polls[action_id] += 1
        if action["status"] == "running" and self._polls[action_id] >= self.action_polls:
            action.update(status="error" if action["error"] else "success", progress=100, finished=_now())
        return action if action["status"] == "error" else dict(action, error=None)

    def _lb(self, lb_id: str) -> dict[str, Any]:
        if not lb_id.isdigit() or int(lb_id) not in self.load_balancers:
            raise CloudApiError(404, "not_found", "load balancer not found")
        return self.load_balancers[int(lb_id)]

    @staticmethod
    def _target(body: dict[str, Any]) -> dict[str, Any]:
        if body.get("type") != "ip":
            raise CloudApiError(400, "invalid_input", "only ip targets are faked")
        try:
            address = ipaddress.ip_address(str((body.get("ip") or {}).get("ip")))
        except ValueError as exc:
            raise CloudApiError(400, "invalid_input", "invalid ip target") from exc
        return {"type": "ip", "ip": {"ip": str(address)}, "health_status": []}

    @staticmethod
    def _service(body: dict[str, Any]) -> dict[str, Any]:
        protocol = body.get("protocol")
        if protocol not in {"tcp", "http", "https"} or not isinstance(body.get("listen_port"), int):
            raise CloudApiError(400, "invalid_input", "invalid service")
        health = body.get("health_check") or {"protocol": "tcp", "port": body["listen_port"]}
        health = {"interval": 15, "timeout": 10, "retries": 3, **health}
        return {
            "protocol": protocol,
            "listen_port": body["listen_port"],
            "destination_port": body.get("destination_port", body["listen_port"]),
            "proxyprotocol": bool(body.get("proxyprotocol", False)),
            "health_check": health,
        }

    def _create(self, body: dict[str, Any]) -> tuple[int, Any]:
        name, lb_type, location = body.get("name"), body.get("load_balancer_type"), body.get("location", "fsn1")
        if not isinstance(name, str) or not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}", name):
            raise CloudApiError(400, "invalid_input", "invalid name")
        if lb_type not in LB_TYPES or location not in LOCATIONS:
            raise CloudApiError(400, "invalid_input", "unknown load_balancer_type or location")
        if any(lb["name"] == name for lb in self.load_balancers.values()):
            raise CloudApiError(409, "uniqueness_error", "name is already used")
        lb_id = next(self._ids)
        description, country, city, zone = LOCATIONS[location]
        max_services, max_targets = LB_TYPES[lb_type]
        self.load_balancers[lb_id] = {
            "id": lb_id,
            "name": name,
            "public_net": {
                "enabled": bool(body.get("public_interface", True)),
                "ipv4": {"ip": self.public_ipv4(lb_id), "dns_ptr": f"static.{lb_id}.example"},
                "ipv6": {"ip": f"2001:db8:cafe::{lb_id:x}", "dns_ptr": f"static.{lb_id}.example"},
            },
            "private_net": [],
            "location": {
                "id": list(LOCATIONS).index(location) + 1,
                "name": location,
                "description": description,
                "country": country,
                "city": city,
                "latitude": 0.0,
                "longitude": 0.0,
                "network_zone": zone,
            },
            "load_balancer_type": {
                "id": list(LB_TYPES).index(lb_type) + 1,
                "name": lb_type,
                "description": lb_type.upper(),
                "max_connections": 10000,
                "max_services": max_services,
                "max_targets": max_targets,
                "max_assigned_certificates": 10,
                "prices": [],
            },
            "protection": {"delete": False},
            "labels": dict(body.get("labels") or {}),
            "targets": [self._target(t) for t in body.get("targets") or []],
            "services": [self._service(s) for s in body.get("services") or []],
            "algorithm": {"type": (body.get("algorithm") or {}).get("type", "round_robin")},
            "outgoing_traffic": None,
            "ingoing_traffic": None,
            "included_traffic": 21990232555520,
            "created": _now(),
        }
        return 201, {"load_balancer": self.load_balancers[lb_id], "action": self._action("create_load_balancer", lb_id)}

    def _lb_action(self, lb: dict[str, Any], command: str, body: dict[str, Any]) -> tuple[int, Any]:
        if command == "add_target":
            target = self._target(body)
            if any(t["ip"] == target["ip"] for t in lb["targets"]):
                raise CloudApiError(409, "target_already_defined", "target already defined")
            lb["targets"].append(target)
        elif command == "remove_target":
            target = self._target(body)
            kept = [t for t in lb["targets"] if t["ip"] != target["ip"]]
            if len(kept) == len(lb["targets"]):
                raise CloudApiError(404, "not_found", "target not found")
            lb["targets"] = kept
        elif command in {"add_service", "update_service"}:
            service = self._service(body)
            exists = any(s["listen_port"] == service["listen_port"] for s in lb["services"])
            if command == "add_service" and exists:
                raise CloudApiError(409, "source_port_already_used", "listen port already used")
            if command == "update_service" and not exists:
                raise CloudApiError(404, "not_found", "service not found")
            lb["services"] = [s for s in lb["services"] if s["listen_port"] != service["listen_port"]] + [service]
        elif command == "delete_service":
            lb["services"] = [s for s in lb["services"] if s["listen_port"] != body.get("listen_port")]
        else:
            raise CloudApiError(404, "not_found", f"unknown action {command}")
        return 201, {"action": self._action(command, lb["id"])}

    def handle(self, method: str, target: str, authorization: str | None, raw: bytes) -> tuple[int, Any]:
        split = urlsplit(target)
        path = split.path.removeprefix("/v1")
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        with self._lock:
            self.requests.append((method, path))
            if authorization != f"Bearer {self.token}":
                raise CloudApiError(401, "unauthorized", "unable to authenticate")
            body = json.loads(raw) if raw else {}
            parts = [p for p in path.split("/") if p]
            if parts == ["load_balancers"] and method == "GET":
                found = [lb for lb in self.load_balancers.values() if query.get("name") in (None, lb["name"])]
                meta = {"page": 1, "per_page": 50, "previous_page": None, "next_page": None, "last_page": 1}
                return 200, {"load_balancers": found, "meta": {"pagination": {**meta, "total_entries": len(found)}}}
            if parts == ["load_balancers"] and method == "POST":
                return self._create(body)
            if len(parts) == 2 and parts[0] == "load_balancers" and method == "GET":
                return 200, {"load_balancer": self._lb(parts[1])}
            if len(parts) == 2 and parts[0] == "load_balancers" and method == "DELETE":
                lb = self._lb(parts[1])
                del self.load_balancers[lb["id"]]
                return 200, {"action": self._action("delete_load_balancer", lb["id"])}
            if len(parts) == 4 and parts[0] == "load_balancers" and parts[2] == "actions" and method == "POST":
                return self._lb_action(self._lb(parts[1]), parts[3], body)
            if len(parts) == 2 and parts[0] == "actions" and parts[1].isdigit() and method == "GET":
                return 200, {"action": self._read_action(int(parts[1]))}
            raise CloudApiError(404, "not_found", "no such endpoint")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeHCloud
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            status, body = self.fake.handle(self.command, self.path, self.headers.get("Authorization"), raw)
        except CloudApiError as error:
            status, body = error.status, {"error": {"code": error.code, "message": error.message, "details": {}}}
        except ValueError:
            status, body = 400, {"error": {"code": "json_error", "message": "invalid JSON", "details": {}}}
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-Correlation-Id", f"fake-{len(self.fake.requests)}")
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # silence the stdlib access log
        return None
