"""The fleet's image server: baked node images over https, fetched by the rescue system's curl as on
Hetzner (``spec.image.url: https://...``), not read through a bind mount.

One directory (``FleetConfig.images_dir``) is served read-only on port 443 of the test machine's end of
each host's veth (``HostNames.host_ip``, an address inside the /30 the fleet created, never a public
interface). Every host's rescue system resolves ``NAME`` to its own end and trusts the server's CA: both
are files the rescue boot writes (``rescue_files``), as Hetzner's rescue image carries its own CA store
and resolver. The server is a plain static file server: GET and HEAD of a file by name, 404 for anything
else, no directory listings, no redirects; what it answers is what a CDN in front of a bucket answers.
"""

from __future__ import annotations

import http.server
import logging
import ssl
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Final

from capi_gpu_sim import pki
from capi_gpu_sim.hosts import views

log = logging.getLogger(__name__)

NAME: Final = "images.capi-gpu-sim.test"
PORT: Final = 443
CA_BUNDLE_GUEST: Final = "/etc/ssl/certs/ca-certificates.crt"  # where Ubuntu's curl looks (--with-ca-bundle)


class _Files(http.server.BaseHTTPRequestHandler):
    directory: Path  # set on the subclass ImageServer makes

    def do_GET(self) -> None:
        self._send(body=True)

    def do_HEAD(self) -> None:
        self._send(body=False)

    def _send(self, body: bool) -> None:
        path = self._file()
        if path is None:
            self.send_error(404)
            return
        size = path.stat().st_size
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if body:
            with path.open("rb") as fh:
                while chunk := fh.read(1 << 20):
                    self.wfile.write(chunk)

    def _file(self) -> Path | None:
        """A regular file directly in the directory, named by the request path; anything else is None."""
        name = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        if not name or "/" in name or name in (".", ".."):
            return None
        path = self.directory / name
        return path if path.is_file() and not path.is_symlink() else None

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("image server: " + format, *args)


class ImageServer:
    """``directory`` served on ``serve_on(address)`` for each host; ``close()`` stops every listener."""

    def __init__(self, directory: Path, state_dir: Path) -> None:
        ca = pki.CA(state_dir, name="capi-gpu-sim-image-ca")
        pair = ca.serving("image-server", [NAME], [])
        self.ca_pem = ca.pem
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._context.load_cert_chain(pair.cert, pair.key)
        self._handler = type("Files", (_Files,), {"directory": directory})
        self._servers: dict[str, tuple[http.server.ThreadingHTTPServer, threading.Thread]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def url(file_name: str) -> str:
        return f"https://{NAME}/{urllib.parse.quote(file_name)}"

    def rescue_files(self, address: str) -> dict[str, bytes]:
        """What a rescue boot of the host whose veth end is ``address`` needs: the name, and the CA."""
        hosts = f"{views.RESCUE_HOSTS}{address} {NAME}\n"
        return {"/etc/hosts": hosts.encode(), CA_BUNDLE_GUEST: self.ca_pem}

    def serve_on(self, address: str) -> None:
        server = http.server.ThreadingHTTPServer((address, PORT), self._handler, bind_and_activate=False)
        try:
            # The handshake runs in the request's thread, not in accept(): one slow client stalls nobody.
            server.socket = self._context.wrap_socket(server.socket, server_side=True, do_handshake_on_connect=False)
            server.server_bind()
            server.server_activate()
        except BaseException:
            server.server_close()
            raise
        server.daemon_threads = True
        thread = threading.Thread(target=server.serve_forever, name=f"image-server-{address}", daemon=True)
        thread.start()
        with self._lock:
            self._servers[address] = (server, thread)

    def close(self) -> None:
        with self._lock:
            servers, self._servers = list(self._servers.values()), {}
        for server, thread in servers:
            server.shutdown()  # ends serve_forever, which polls: no accept() left blocked
            server.server_close()
            thread.join(5)
