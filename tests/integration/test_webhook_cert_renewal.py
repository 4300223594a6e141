"""Issue 28: the webhook follows its renewed certificate without a restart. Real TLS over loopback: the
server `capi-gpu run` builds (`webhook.server`) serves cert A from a test CA; the files are replaced as the
kubelet updates a mounted Secret (a new `..data` directory, swapped in by an atomic rename of the
symlink); within a bound, a new connection gets B. A half-written renewal is logged and B keeps serving;
the next good one (C) is served."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from capi_gpu.controllers import webhook
from capi_gpu_sim import pki

pytestmark = pytest.mark.integration
BOUND_S = 10.0  # the server checks every 2 s; kopf's own reload (60 s, restarting the listener) misses it


class Mount:
    """A Secret volume as the kubelet writes it: tls.crt -> ..data/tls.crt, ..data -> ..<version>."""

    def __init__(self, directory: Path, ca: pki.CA) -> None:
        self.dir, self.ca, self.version = directory, ca, 0
        directory.mkdir()
        for name in (webhook.CERT_FILE, webhook.KEY_FILE):
            (directory / name).symlink_to(Path("..data") / name)

    def publish(self, common_name: str, corrupt: bool = False) -> None:
        self.version += 1
        version = self.dir / f"..v{self.version}"
        self.ca.serving(common_name, ["localhost"], ["127.0.0.1"], out=version)
        if corrupt:  # what a reader could see of a file being written
            cert = version / webhook.CERT_FILE
            cert.write_bytes(cert.read_bytes()[:100])
        tmp = self.dir / "..data_tmp"
        tmp.symlink_to(version.name)
        os.replace(tmp, self.dir / "..data")


def peer(port: int, ca: pki.CA) -> str:
    client = ssl.create_default_context(cafile=str(ca.cert_path))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        cert: Any = tls.getpeercert()
    return str(dict(x[0] for x in cert["subject"])["commonName"])


async def sees(port: int, ca: pki.CA, want: str) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + BOUND_S
    while loop.time() < deadline:
        if await asyncio.to_thread(peer, port, ca) == want:
            return True
        await asyncio.sleep(0.2)
    return False


async def _review(*_: Any, **__: Any) -> dict[str, Any]:
    return {}


@contextlib.asynccontextmanager
async def served(directory: Path) -> AsyncIterator[int]:
    """The server `capi-gpu run` builds, listening; its port. Entered as kopf enters it (its exit closes
    the server's generators)."""
    async with webhook.server("127.0.0.1", 0, directory) as server:
        stream = server(_review)
        client_config = await stream.__anext__()
        port = urllib.parse.urlsplit(client_config["url"]).port
        assert port is not None
        yield port


async def test_a_renewed_certificate_is_served_without_a_restart(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ca = pki.CA(tmp_path / "ca")
    mount = Mount(tmp_path / "certs", ca)
    mount.publish("cert-a")
    async with served(mount.dir) as port:
        assert await asyncio.to_thread(peer, port, ca) == "cert-a"
        mount.publish("cert-b")
        assert await sees(port, ca, "cert-b"), "the renewed certificate was not served"

        caplog.set_level(logging.WARNING)
        mount.publish("cert-broken", corrupt=True)
        await asyncio.sleep(3 * webhook.CERT_CHECK_S)
        assert await asyncio.to_thread(peer, port, ca) == "cert-b"
        assert [r for r in caplog.records if "not loaded, still serving the previous one" in r.getMessage()]

        mount.publish("cert-c")
        assert await sees(port, ca, "cert-c")
