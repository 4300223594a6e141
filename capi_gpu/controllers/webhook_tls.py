"""The webhook's serving certificate, followed as cert-manager renews it.

kopf's ``WebhookServer`` loads ``certfile``/``pkeyfile`` into one ``SSLContext`` when it starts listening
(kopf 1.45 re-reads the files every 60 s and then closes and reopens the listener; older ones never).
Here kopf gets a context whose SNI callback hands each handshake the newest context loaded: OpenSSL calls
it on every ClientHello (with ``None`` when the client sent no server name), so every new connection
gets the current certificate and an open one keeps its own. No listener restart, no refused connection.

The kubelet updates a mounted Secret by swapping a ``..data`` symlink, which inotify on the file paths
doesn't see; ``os.stat`` follows the links, so a new inode, size or mtime of tls.crt or tls.key is a new
version. A version that doesn't load (half written, cert and key from different issues, gone) is logged
once and the last good certificate keeps serving; the next change is tried again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf

LOG = logging.getLogger(__name__)
Signature = tuple[int, ...]


def _signature(*paths: Path) -> Signature | None:
    try:
        stats = [os.stat(p) for p in paths]
    except OSError:
        return None
    return tuple(v for s in stats for v in (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns))


class ReloadingWebhookServer(kopf.WebhookServer):
    """kopf's HTTPS webhook server with a certificate that follows its files without a restart."""

    def __init__(self, *, addr: str, port: int, certfile: Path, pkeyfile: Path, check_interval_s: float) -> None:
        # No certfile/pkeyfile for kopf: it would load them itself and restart on every change.
        super().__init__(addr=addr, port=port)
        self.cert, self.key = certfile, pkeyfile
        self.check_interval_s = check_interval_s
        self._current: ssl.SSLContext | None = None
        self._loaded: Signature | None = None
        self._refused: Signature | None = None

    def _load(self) -> ssl.SSLContext:
        context = ssl.create_default_context(purpose=ssl.Purpose.CLIENT_AUTH)  # as kopf builds its own
        context.load_cert_chain(self.cert, self.key)
        return context

    def _build_ssl(self) -> tuple[bytes | None, ssl.SSLContext | None]:
        """kopf's hook for the listener's context (once per listen). No usable certificate at start is
        fatal, as it was: there is nothing to serve. No CA bundle: the webhook configuration is ours."""
        signature = _signature(self.cert, self.key)
        self._current = context = self._load()
        self._loaded = signature
        context.sni_callback = self._pick
        return None, context

    def _pick(self, sslobj: ssl.SSLObject, _name: str | None, _context: ssl.SSLContext) -> None:
        if self._current is not None:
            sslobj.context = self._current

    def reload(self) -> bool:
        """Load the files if they changed since the last load; True when a new certificate is served."""
        signature = _signature(self.cert, self.key)
        if signature == self._loaded:
            return False
        try:
            context = self._load()
        except (OSError, ssl.SSLError) as exc:
            if signature != self._refused:
                LOG.warning("webhook: certificate %s not loaded, still serving the previous one: %s", self.cert, exc)
                self._refused = signature
            return False
        self._current, self._loaded = context, signature
        LOG.info("webhook: serving the renewed certificate from %s", self.cert)
        return True

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(self.check_interval_s)
            try:
                self.reload()
            except Exception:  # never let a renewal check end the webhook
                LOG.exception("webhook: certificate check failed")

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        follower = asyncio.create_task(self._follow())
        try:
            async for client_config in super().__call__(fn):
                yield client_config
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
