"""A Robot webservice simulator on loopback HTTP, for contract tests, benchmarks and ``dev up``.

It follows the documented behaviour, not what our client happens to expect: Basic auth, form bodies,
wrapped JSON (vSwitch unwrapped), documented error codes, per-endpoint hourly limits answered with
403 ``RATE_LIMIT_EXCEEDED`` + ``max_requests`` + ``interval``, and the 10-minute IP block after three
failed logins. The rules live in ``robot_limits`` (clock, limits, logins, faults), ``robot_world``
(servers, reset, rescue, keys), ``robot_orders`` (products, orders, cancellation) and ``robot_vswitch``
(vSwitches and their asynchronous membership); this
module is the HTTP front and the Python API.

Every request passes, in order: IP block → auth → maintenance (503) → route (404) → rate limit (403)
→ injected 5xx → handler. All state changes happen under one lock; hooks (``PowerHook.on_reset``,
``on_new_server``) run on a separate thread afterwards, so a slow fleet never delays an answer.

**Sim-only endpoints** (no auth, not Robot's): ``GET /_sim/log[?since=i]`` (the request log),
``GET|POST /_sim/faults`` (JSON, partial update of ``SimFaults``) and ``POST /_sim/clock``
(``{"advance": seconds}``), for tests whose operator runs in another process.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import math
import queue
import random
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pydantic

from capi_gpu_sim import robot_hooks, robot_limits, robot_orders, robot_vswitch, robot_world
from capi_gpu_sim.robot_hooks import BootKind, BootTarget, HostKeyPair, NewServer, NullHook, PowerHook
from capi_gpu_sim.robot_limits import SimFaults
from capi_gpu_sim.robot_world import ApiError, Form

__all__ = ["BootKind", "BootTarget", "HostKeyPair", "LogEntry", "NewServer", "PowerHook", "RobotSim", "SimFaults"]

Reply = tuple[int, Any]
Route = Callable[[dict[str, str], Form, dict[str, str]], Reply]


@dataclass(frozen=True)
class LogEntry:
    t: float  # sim seconds
    method: str
    path: str
    endpoint: str | None  # e.g. "POST /reset/{n}"; None for unknown paths and refused logins
    status: int
    code: str | None  # Robot error code, if any
    ip: str
    user: str | None
    detail: str | None = None  # the reset type of a ``POST /reset/{n}`` ("sw", "hw"...)


@dataclass(frozen=True)
class _Answer:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def _json_answer(status: int, body: Any) -> _Answer:
    return _Answer(status, b"" if body is None else json.dumps(body).encode())


class RobotSim:
    def __init__(
        self,
        *,
        users: dict[str, str] | None = None,
        compression: float = 1.0,
        seed: int | None = None,
        power_hook: PowerHook | None = None,
        new_server_hook: robot_hooks.NewServerHook | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.users = users or {"sim-robot": secrets.token_urlsafe(12)}
        self.clock = robot_limits.SimClock(compression)
        self.world = robot_world.RobotWorld(now=self.clock.now, wall=self.clock.wall)
        self.commerce = robot_orders.Commerce(self.world)
        self.vswitches = robot_vswitch.VSwitches(self.world)
        self.faults = SimFaults()
        self.power_hook: PowerHook = power_hook or NullHook()
        self.new_server_hook: robot_hooks.NewServerHook = new_server_hook or NullHook()
        self.hook_errors: list[str] = []
        self._random = random.Random(seed)
        self._admitted = 0  # authenticated requests within their limits, for SimFaults.error_every
        self._limiter = robot_limits.RateLimiter()
        self._logins = robot_limits.LoginGuard()
        self._log: list[LogEntry] = []
        self._lock = threading.RLock()
        self._address = (host, port)
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._hooks: queue.Queue[Callable[[], None]] = queue.Queue()
        self._next_number = 100000

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> RobotSim:
        handler = type("_BoundHandler", (_Handler,), {"sim": self})
        self._server = ThreadingHTTPServer(self._address, handler)
        self._server.daemon_threads = True
        self._stop.clear()
        self._threads = [
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True),
            threading.Thread(target=self._tick_loop, daemon=True),
            threading.Thread(target=self._hook_loop, daemon=True),
        ]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._server = None

    def __enter__(self) -> RobotSim:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def url(self) -> str:
        if self._server is None:
            raise RuntimeError("the simulator is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @property
    def username(self) -> str:
        return next(iter(self.users))

    @property
    def password(self) -> str:
        return self.users[self.username]

    # --- Python API (tests, the fleet, dev up) ------------------------------------------------

    @contextmanager
    def locked(self) -> Iterator[robot_world.RobotWorld]:
        with self._lock:
            yield self.world

    def add_server(self, number: int | None = None, **fields: Any) -> int:
        with self._lock:
            if number is None:
                number = self._next_number
                self._next_number += 1
            octet = number % 250 + 1
            fields.setdefault("name", f"server{number}")
            fields.setdefault("ip", f"192.0.2.{octet}")
            fields.setdefault("ipv6_net", f"2001:db8:{number % 65536:x}::")
            self.world.servers[number] = robot_world.SimServer(number=number, **fields)
            return number

    def consume_boot_target(self, server_number: int) -> BootTarget:
        """What the server boots after a reboot Robot did not order (its OS rebooted itself): the rescue
        system if an activation is pending (consumed, as by any boot), else the disk; ``HUNG`` for a
        server under the ``never_boot`` fault. Raises ``KeyError`` for a server Robot does not know."""
        with self._lock:
            return self.world.next_boot(self.world.servers[server_number])

    def vswitch_links(self) -> dict[int, tuple[int, set[int]]]:
        """vSwitch id -> (VLAN, ready member server numbers): who shares which private link now
        (``capi_gpu_sim.private_link``). A cancelled vSwitch keeps its link while Robot lists it."""
        with self._lock:
            return {vid: (v.vlan, self.vswitches.ready_members(vid)) for vid, v in self.vswitches.by_id.items()}

    def set_server_ip(self, server_number: int, ip: str) -> bool:
        """Point a known server at the address its machine answers on; False if Robot does not know it."""
        with self._lock:
            server = self.world.servers.get(server_number)
            if server is None:
                return False
            server.ip = ip
            return True

    def rescue_host_keys(self, server_number: int) -> list[HostKeyPair]:
        """The host keys (private halves included) of the server's latest rescue activation."""
        with self._lock:
            last = self.world.servers[server_number].last_rescue
            return list(last.host_keys) if last else []

    def set_faults(self, **changes: Any) -> SimFaults:
        with self._lock:
            self.faults = SimFaults.model_validate({**self.faults.model_dump(), **changes})
            self.world.never_boot = set(self.faults.never_boot)
            self.world.impostor_rescue = set(self.faults.impostor_rescue)
            self.vswitches.fail = set(self.faults.vswitch_fail)
            return self.faults

    @property
    def log(self) -> list[LogEntry]:
        with self._lock:
            return list(self._log)

    def count(self, method: str | None = None, path_prefix: str = "/") -> int:
        return sum(1 for e in self.log if (method is None or e.method == method) and e.path.startswith(path_prefix))

    def wait_idle(self, timeout_s: float = 5.0) -> bool:
        """Wait until every hook queued so far has run (real seconds)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                self.world.tick()
                self._queue_hooks()
            if self._hooks.unfinished_tasks == 0:
                return True
            time.sleep(0.005)
        return False

    # --- background threads ----------------------------------------------------------------------

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.02):
            with self._lock:
                self.world.tick()
                self._queue_hooks()

    def _hook_loop(self) -> None:
        while not self._stop.is_set():
            try:
                call = self._hooks.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                call()
            except Exception as exc:  # a broken fleet must not kill the simulator
                self.hook_errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self._hooks.task_done()

    def _queue_hooks(self) -> None:
        for number, kind, target in self.world.power_events:
            self._hooks.put(functools.partial(self.power_hook.on_reset, number, kind, target))
        self.world.power_events.clear()
        for new in self.commerce.new_servers:
            self._hooks.put(functools.partial(self.new_server_hook.on_new_server, new))
        self.commerce.new_servers.clear()

    # --- request handling ----------------------------------------------------------------------

    def _routes(self) -> dict[str, Route]:
        w, c, v = self.world, self.commerce, self.vswitches
        return {
            "GET /server": lambda p, f, q: w.list_servers(),
            "GET /server/{n}": lambda p, f, q: w.get_server(p["n"]),
            "POST /server/{n}": lambda p, f, q: w.rename_server(p["n"], f),
            "GET /server/{n}/cancellation": lambda p, f, q: c.get_cancellation(p["n"]),
            "POST /server/{n}/cancellation": lambda p, f, q: c.cancel(p["n"], f),
            "GET /reset": lambda p, f, q: w.list_resets(),
            "GET /reset/{n}": lambda p, f, q: w.get_reset(p["n"]),
            "POST /reset/{n}": lambda p, f, q: w.reset(p["n"], f),
            "GET /boot/{n}/rescue": lambda p, f, q: w.get_rescue(p["n"]),
            "POST /boot/{n}/rescue": lambda p, f, q: w.activate_rescue(p["n"], f),
            "DELETE /boot/{n}/rescue": lambda p, f, q: w.deactivate_rescue(p["n"]),
            "GET /boot/{n}/rescue/last": lambda p, f, q: w.last_rescue(p["n"]),
            "GET /key": lambda p, f, q: w.list_keys(),
            "POST /key": lambda p, f, q: w.create_key(f),
            "GET /key/{fp}": lambda p, f, q: w.get_key(p["fp"]),
            "POST /key/{fp}": lambda p, f, q: w.rename_key(p["fp"], f),
            "DELETE /key/{fp}": lambda p, f, q: w.delete_key(p["fp"]),
            "GET /order/server/product": lambda p, f, q: c.list_products(q),
            "GET /order/server/product/{id}": lambda p, f, q: c.get_product(p["id"]),
            "POST /order/server/transaction": lambda p, f, q: c.order(f),
            "GET /order/server/transaction": lambda p, f, q: c.list_transactions(),
            "GET /order/server/transaction/{id}": lambda p, f, q: c.get_transaction(p["id"]),
            "GET /vswitch": lambda p, f, q: v.list_all(),
            "POST /vswitch": lambda p, f, q: v.create(f),
            "GET /vswitch/{id}": lambda p, f, q: v.get(p["id"]),
            "POST /vswitch/{id}": lambda p, f, q: v.update(p["id"], f),
            "DELETE /vswitch/{id}": lambda p, f, q: v.cancel(p["id"], f),
            "POST /vswitch/{id}/server": lambda p, f, q: v.add_servers(p["id"], f),
            "DELETE /vswitch/{id}/server": lambda p, f, q: v.remove_servers(p["id"], f),
        }

    def _user(self, authorization: str | None) -> str | None:
        if not authorization or not authorization.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(authorization[6:], validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        expected = self.users.get(user)
        return user if expected is not None and secrets.compare_digest(expected, password) else None

    def handle(self, method: str, target: str, authorization: str | None, body: bytes, ip: str) -> _Answer:
        split = urlsplit(target)
        path = "/" + split.path.strip("/")
        query = {k: v[0] for k, v in parse_qs(split.query).items()}
        with self._lock:
            self.world.tick()
            entry, answer = self._robot_request(method, path, query, authorization, body, ip)
            self._log.append(entry)
            self._queue_hooks()
            latency = self.faults.latency_s
        if latency:
            time.sleep(latency)
        return answer

    def _robot_request(
        self, method: str, path: str, query: dict[str, str], authorization: str | None, body: bytes, ip: str
    ) -> tuple[LogEntry, _Answer]:
        now = self.clock.now()
        detail: str | None = None
        if method == "POST" and path.startswith("/reset/"):
            detail = next(iter(parse_qs(body.decode(errors="replace")).get("type", [])), None)

        def done(answer: _Answer, endpoint: str | None, code: str | None, user: str | None) -> tuple[LogEntry, _Answer]:
            return LogEntry(now, method, path, endpoint, answer.status, code, ip, user, detail), answer

        unauthorized = _Answer(
            401, b"401 Unauthorized", "text/plain", (("WWW-Authenticate", 'Basic realm="Robot Webservice"'),)
        )
        if self._logins.blocked(ip, now):
            return done(unauthorized, None, "BLOCKED", None)
        user = self._user(authorization)
        if user is None:
            self._logins.failed(ip, now)
            return done(unauthorized, None, "UNAUTHORIZED", None)
        if self.faults.maintenance:
            page = b"<html><body><h1>503 Service Unavailable</h1>Maintenance</body></html>"
            return done(_Answer(503, page, "text/html"), None, None, user)
        matched = robot_limits.match_endpoint(method, path)
        if matched is None:
            error = ApiError(404, "NOT_FOUND", "not found")
            return done(_json_answer(404, error.body), None, error.code, user)
        endpoint, params = matched
        endpoint = robot_limits.tightened(endpoint, self.faults.rate_limits)
        if not self._limiter.admit(user, endpoint, now):
            limited = ApiError(
                403,
                "RATE_LIMIT_EXCEEDED",
                "rate limit exceeded",
                max_requests=endpoint.max_requests,
                # In the client's seconds: under compression a window lasts window/compression real seconds,
                # and that is how long a client that waits the interval out must wait.
                interval=max(1, math.ceil(self.clock.real_seconds(endpoint.window_s))),
            )
            return done(_json_answer(403, limited.body), endpoint.name, limited.code, user)
        self._admitted += 1
        every = self.faults.error_every
        if (every and self._admitted % every == 0) or (
            self.faults.error_rate and self._random.random() < self.faults.error_rate
        ):
            failed = ApiError(500, "INTERNAL_ERROR", "internal error")
            return done(_json_answer(500, failed.body), endpoint.name, failed.code, user)
        form = Form(parse_qs(body.decode(errors="replace"), keep_blank_values=True))
        try:
            status, payload = self._routes()[endpoint.name](params, form, query)
        except ApiError as error:
            return done(_json_answer(error.status, error.body), endpoint.name, error.code, user)
        return done(_json_answer(status, payload), endpoint.name, None, user)

    def sim_request(self, method: str, path: str, query: dict[str, str], body: bytes) -> _Answer:
        """The ``/_sim/`` endpoints: test plumbing, never part of Robot."""
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return _json_answer(400, {"error": "body must be JSON"})
        if path == "/_sim/log" and method == "GET":
            since = int(query.get("since", "0"))
            return _json_answer(200, [asdict(e) for e in self.log[since:]])
        if path == "/_sim/faults" and method in {"GET", "POST"}:
            if method == "GET":
                return _json_answer(200, self.faults.model_dump())
            try:
                return _json_answer(200, self.set_faults(**data).model_dump())
            except pydantic.ValidationError as exc:
                return _json_answer(400, {"error": json.loads(exc.json(include_url=False))})
        if path == "/_sim/clock" and method == "POST":
            self.clock.advance(float(data.get("advance", 0)))
            return _json_answer(200, {"now": self.clock.now()})
        return _json_answer(404, {"error": "unknown sim endpoint"})


class _Handler(BaseHTTPRequestHandler):
    sim: RobotSim
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes; no 40 ms delayed-ACK stall

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        split = urlsplit(self.path)
        if split.path.startswith("/_sim/"):
            query = {k: v[0] for k, v in parse_qs(split.query).items()}
            answer = self.sim.sim_request(self.command, split.path, query, body)
        else:
            answer = self.sim.handle(
                self.command, self.path, self.headers.get("Authorization"), body, self.client_address[0]
            )
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", f"{answer.content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            # The client went away while the answer was on its way (a killed operator): Robot carries on.
            self.close_connection = True

    do_GET = do_POST = do_DELETE = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:  # silence the stdlib access log
        return None
