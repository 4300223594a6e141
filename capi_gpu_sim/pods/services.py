"""kube-proxy's stand-in, in its original userspace mode: a listener on each Service's ClusterIP and port
that forwards every connection to a Ready pod the Service selects.

The world's apiserver allocates ClusterIPs from a loopback range (``Options.service_cidr``), so binding
them needs no interface of our own; the apiserver dials a webhook's Service at its ClusterIP (its default
service resolver) with the Service's DNS name as TLS server name, as in a cluster. Only pods the runner
runs are endpoints (the management node is the only node with Services behind it).
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from typing import Any

from capi_gpu.kube import Kube, KubeError, Res
from capi_gpu_sim.pods.podnet import close_listener, pipe

log = logging.getLogger(__name__)
SERVICES = Res("", "v1", "services")
Endpoints = Callable[[str, Mapping[str, str], "int | str"], list[tuple[str, int]]]
"""(namespace, selector, targetPort) -> [(pod IP, port)] of Ready pods."""


class _Listener:
    def __init__(self, ip: str, port: int, target: Callable[[], list[tuple[str, int]]]) -> None:
        self.sock = socket.socket()
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.sock.bind((ip, port))
            self.sock.listen(64)
        except OSError:
            # The proxy retries every sync (0.5 s); an unclosed socket per try piled up 598 of them.
            self.sock.close()
            raise
        self.target = target
        self._rr = itertools.count()
        threading.Thread(target=self._accept, name=f"svc-{ip}:{port}", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        endpoints = self.target()
        if not endpoints:
            conn.close()  # no Ready endpoint: refused, as kube-proxy rejects it
            return
        ip, port = endpoints[next(self._rr) % len(endpoints)]
        try:
            upstream = socket.create_connection((ip, port), timeout=5)
        except OSError:
            conn.close()
            return
        upstream.settimeout(None)
        threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
        pipe(upstream, conn)
        conn.close()
        upstream.close()

    def close(self) -> None:
        close_listener(self.sock)


class ServiceProxy:
    def __init__(self, kube: Kube, cidr: str, endpoints: Endpoints, apiserver: tuple[str, int] | None = None) -> None:
        self.kube, self.net, self.endpoints = kube, ipaddress.ip_network(cidr), endpoints
        self.apiserver = apiserver  # the `kubernetes` Service's one endpoint
        self.listeners: dict[tuple[str, int], _Listener] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="service-proxy", daemon=True)

    def start(self) -> ServiceProxy:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.sync(self.kube.list(SERVICES))
            except (KubeError, OSError) as exc:
                log.info("service proxy: %s", exc)

    def sync(self, services: list[dict[str, Any]]) -> None:
        wanted: dict[tuple[str, int], Callable[[], list[tuple[str, int]]]] = {}
        for svc in services:
            spec = svc.get("spec") or {}
            ip, selector = spec.get("clusterIP") or "", spec.get("selector") or {}
            if not ip or ip == "None" or ipaddress.ip_address(ip) not in self.net:
                continue
            ns = svc["metadata"]["namespace"]
            if (ns, svc["metadata"]["name"]) == ("default", "kubernetes") and self.apiserver is not None:
                api = [self.apiserver]
                wanted[(ip, 443)] = lambda api=api: api  # type: ignore[misc]
                continue
            if not selector:
                continue
            for p in spec.get("ports") or []:
                target = p.get("targetPort", p["port"])
                wanted[(ip, int(p["port"]))] = functools.partial(self.endpoints, ns, selector, target)
        if self._stop.is_set():
            # stop() gives this thread 5 s; a list that outlived them must not bind after stop() closed
            # everything: the leaked listener would hold an address a later world gets (EADDRINUSE on :443).
            return
        for key in [k for k in self.listeners if k not in wanted]:
            self.listeners.pop(key).close()
        for key, target in wanted.items():
            if key in self.listeners:
                self.listeners[key].target = target
                continue
            try:
                self.listeners[key] = _Listener(key[0], key[1], target)
            except OSError as exc:
                log.warning("service proxy: cannot listen on %s:%d: %s", key[0], key[1], exc)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for listener in self.listeners.values():
            listener.close()
        self.listeners.clear()
