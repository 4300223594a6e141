"""A network namespace for a pod whose listeners can't be told an address (cert-manager's webhook binds
``:10250`` and ``:6080``, its controller and cainjector both ``:9402``): the pod gets its own loopback,
so two such pods, or two worlds side by side, never collide.

The pod reaches the apiserver through a forwarder listening on the pod's ``127.0.0.1:<apiserver port>``,
and everything reaches the pod through its declared container ports, published on the pod's IP in the
machine's namespace (as ``docker run -p`` does): probes, the Service stand-in and the apiserver's webhook
calls dial the pod IP as they would in a cluster. Sockets are created in the other namespace by a thread
that enters it with setns(2) and returns: a socket keeps the namespace it was created in.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_ns_lock = threading.Lock()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def in_netns(name: str, make: Callable[[], socket.socket]) -> socket.socket:
    """``make()`` run inside netns ``name``; the thread is back in its own namespace afterwards."""
    with _ns_lock, open("/proc/thread-self/ns/net") as home, open(f"/run/netns/{name}") as target:
        _setns(target.fileno())
        try:
            return make()
        finally:
            _setns(home.fileno())


def create(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False, timeout=20)
    subprocess.run(["ip", "netns", "add", name], capture_output=True, check=True, timeout=20)
    subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], capture_output=True, check=True, timeout=20)


def delete(name: str) -> None:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False, timeout=20)


def exec_prefix(name: str) -> list[str]:
    return ["nsenter", f"--net={Path('/run/netns') / name}", "--"]


def pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


class Forward:
    """Accept on ``listener``; connect with ``dial()`` for each connection; copy both ways."""

    def __init__(self, listener: socket.socket, dial: Callable[[], socket.socket]) -> None:
        self.listener, self.dial = listener, dial
        threading.Thread(target=self._accept, daemon=True, name="podnet-forward").start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            upstream = self.dial()
        except OSError:
            conn.close()
            return
        threading.Thread(target=pipe, args=(conn, upstream), daemon=True).start()
        pipe(upstream, conn)
        conn.close()
        upstream.close()

    def close(self) -> None:
        close_listener(self.listener)


def close_listener(sock: socket.socket) -> None:
    """Unbind a listener whose accept thread is blocked in accept(2).

    Why shutdown first: close(2) from another thread does not wake a blocked accept(2), which keeps its
    reference to the socket, so the address stays bound and listening for the life of the process. A
    later world given the same loopback octet then failed with EADDRINUSE on its ``kubernetes`` Service
    (``127.64.X.1:443``) and its cert-manager pods' published ports, and ``clusterctl init`` timed out.
    shutdown(2) makes the blocked accept return EINVAL, so the thread exits and the close takes effect.
    """
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def listener(host: str, port: int) -> socket.socket:
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, port))
        s.listen(64)
    except OSError:
        s.close()  # else garbage collection reports it, unraisable, in whichever test runs next
        raise
    return s


def dialer(host: str, port: int, netns: str | None = None) -> Callable[[], socket.socket]:
    def dial() -> socket.socket:
        if netns is None:
            conn = socket.create_connection((host, port), timeout=5)
            conn.settimeout(None)  # the connect's bound only: a watch stream stays idle for minutes
            return conn
        s = in_netns(netns, socket.socket)
        s.settimeout(5)
        try:
            s.connect((host, port))
        except OSError:
            s.close()
            raise
        s.settimeout(None)
        return s

    return dial


class PodNetwork:
    """The pod's namespace, the apiserver forwarder inside it, and its ports published on ``pod_ip``."""

    def __init__(self, name: str, pod_ip: str, api: tuple[str, int], ports: list[int]) -> None:
        self.name = name
        create(name)
        self.forwards: list[Forward] = []
        try:
            self.forwards.append(Forward(in_netns(name, lambda: listener("127.0.0.1", api[1])), dialer(*api)))
            for port in ports:
                self.forwards.append(Forward(listener(pod_ip, port), dialer("127.0.0.1", port, name)))
        except OSError:
            self.close()  # the pod fails to start; nothing it half-made stays bound
            raise

    def close(self) -> None:
        for f in self.forwards:
            f.close()
        delete(self.name)
