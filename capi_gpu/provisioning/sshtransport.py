"""One SSH session with a pinned host key: connect, verify, authenticate, run, upload; errors classified.

Why separate from ``ssh``: this is the transport (paramiko, sockets, timeouts, what a dropped
connection looks like), ``ssh`` is what provisioning asks of a server. paramiko is used at the
``Transport`` level, not through ``SSHClient``: that way the host key check is ours alone (no
``AutoAddPolicy``, no known_hosts file), only pinned key types are offered in the key exchange, and
the check runs before any credential is sent. The exception hierarchy is drawn in ``ssh``'s docstring.

Nothing here logs command output, file contents or credentials; log lines name the host and the
operation only.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import paramiko

log = logging.getLogger(__name__)

# Robot / ssh-keygen names for key types -> the host key algorithms paramiko may negotiate for them.
KEY_ALGORITHMS: dict[str, tuple[str, ...]] = {
    "ssh-ed25519": ("ssh-ed25519",),
    "ed25519": ("ssh-ed25519",),
    "ecdsa-sha2-nistp256": ("ecdsa-sha2-nistp256",),
    "ecdsa": ("ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521"),
    "ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
    "rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa"),
}
RSA_ALGS = ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")
STDERR_TAIL = 2000


class SSHError(Exception):
    """Root of this module's errors."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class ConnectTimeout(SSHError):
    pass


class ConnectionRefused(SSHError):
    pass


class HostKeyMismatch(SSHError):
    def __init__(self, host: str, presented: str, expected: Sequence[str]) -> None:
        super().__init__(host, f"host key {presented} is not pinned (expected one of {', '.join(expected)})")
        self.presented = presented
        self.expected = tuple(expected)


class AuthenticationFailed(SSHError):
    pass


class SessionDropped(SSHError):
    pass


class CommandTimeout(SSHError):
    pass


class CommandFailed(SSHError):
    def __init__(self, host: str, operation: str, exit_status: int, stderr_tail: str) -> None:
        super().__init__(host, f"{operation} exited {exit_status}: {stderr_tail[-300:].strip()}")
        self.operation = operation
        self.exit_status = exit_status
        self.stderr_tail = stderr_tail


@dataclass(frozen=True)
class HostKeyPin:
    """What the server must present: Robot's MD5 fingerprints by key type, or exact public keys."""

    fingerprints: tuple[tuple[str, str], ...] = ()  # (key type as Robot names it, "aa:bb:...")
    public_keys: tuple[str, ...] = ()  # OpenSSH lines: "ssh-ed25519 AAAA... [comment]"

    def __post_init__(self) -> None:
        if not self.fingerprints and not self.public_keys:
            raise ValueError("an empty HostKeyPin would accept nothing; refuse to build one")

    @classmethod
    def from_robot(cls, host_keys: Sequence[Mapping[str, object]]) -> HostKeyPin:
        """From Robot's rescue response: ``host_key: [{"key": {"key_type": ..., "fingerprint": ...}}]``."""
        pairs = []
        for entry in host_keys:
            key = entry.get("key", entry)
            if isinstance(key, Mapping):
                pairs.append((str(key.get("key_type", key.get("type", ""))), str(key["fingerprint"]).lower()))
        return cls(fingerprints=tuple(pairs))

    @classmethod
    def from_public_key(cls, *lines: str) -> HostKeyPin:
        return cls(public_keys=tuple(" ".join(line.split()[:2]) for line in lines))

    def describe(self) -> list[str]:
        return [f"{t} MD5:{fp}" for t, fp in self.fingerprints] + [line[:40] + "..." for line in self.public_keys]


@dataclass(frozen=True)
class Endpoint:
    host: str
    pin: HostKeyPin
    port: int = 22
    user: str = "root"
    connect_timeout_s: float = 5.0  # CAPH's dial and handshake timeout
    auth_timeout_s: float = 10.0
    command_timeout_s: float = 120.0


@dataclass(frozen=True)
class Credentials:
    """A private key (OpenSSH/PEM text) and/or a password; repr never shows them."""

    private_key: str | None = None
    password: str | None = None

    def __repr__(self) -> str:
        return (
            f"Credentials(private_key={'<set>' if self.private_key else None}, "
            f"password={'<set>' if self.password else None})"
        )


def md5_fingerprint(blob: bytes) -> str:
    digest = hashlib.md5(blob, usedforsecurity=False).hexdigest()
    return ":".join(digest[i : i + 2] for i in range(0, len(digest), 2))


def _pin_algorithms(pin: HostKeyPin) -> list[str]:
    types = [t for t, _ in pin.fingerprints] + [line.split()[0] for line in pin.public_keys]
    algs: list[str] = []
    for t in types:
        for alg in KEY_ALGORITHMS.get(t.lower(), (t,)):
            if alg not in algs:
                algs.append(alg)
    return algs


def pin_matches(pin: HostKeyPin, key: paramiko.PKey) -> bool:
    blob = key.asbytes()
    name = key.get_name()
    family = "ssh-rsa" if name in RSA_ALGS else name
    for line in pin.public_keys:
        kind, b64 = line.split()[:2]
        if kind == family and base64.b64decode(b64) == blob:
            return True
    fp = md5_fingerprint(blob)
    for kind, expected in pin.fingerprints:
        allowed = KEY_ALGORITHMS.get(kind.lower(), (kind,))
        if (name in allowed or family in allowed or not kind) and expected.removeprefix("md5:") == fp:
            return True
    return False


def load_private_key(text: str) -> paramiko.PKey:
    errors = []
    for cls in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return cls.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError) as exc:
            errors.append(type(exc).__name__)
    raise ValueError(f"unreadable private key ({', '.join(errors)})")


@dataclass(frozen=True)
class Result:
    exit_status: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def tail(self) -> str:
        both = (self.stderr or self.stdout).decode(errors="replace")
        return both[-STDERR_TAIL:]


class Session:
    """One authenticated SSH transport; opened lazily, reopened when it died."""

    def __init__(self, endpoint: Endpoint, credentials: Credentials) -> None:
        self.endpoint = endpoint
        self._credentials = credentials
        self._transport: paramiko.Transport | None = None

    @property
    def alive(self) -> bool:
        return self._transport is not None and self._transport.is_active()

    def open(self) -> paramiko.Transport:
        if self._transport is not None and self._transport.is_active():
            return self._transport
        self.close()
        ep = self.endpoint
        sock = self._dial()
        t = paramiko.Transport(sock)
        try:
            self._handshake(t)
            self._verify(t)
            self._authenticate(t)
        except BaseException:
            t.close()
            raise
        self._transport = t
        log.debug("ssh %s: session open", ep.host)
        return t

    def _dial(self) -> socket.socket:
        ep = self.endpoint
        try:
            return socket.create_connection((ep.host, ep.port), timeout=ep.connect_timeout_s)
        except ConnectionRefusedError as exc:
            raise ConnectionRefused(ep.host, f"port {ep.port} refused") from exc
        except TimeoutError as exc:
            raise ConnectTimeout(ep.host, f"no TCP connection within {ep.connect_timeout_s}s") from exc
        except OSError as exc:
            raise ConnectTimeout(ep.host, f"unreachable ({exc.strerror or exc})") from exc

    def _handshake(self, t: paramiko.Transport) -> None:
        ep = self.endpoint
        t.banner_timeout = ep.connect_timeout_s
        t.handshake_timeout = ep.connect_timeout_s
        opts = t.get_security_options()
        wanted = [a for a in _pin_algorithms(ep.pin) if a in opts.key_types]
        if not wanted:
            raise HostKeyMismatch(ep.host, "no pinned key type is supported", ep.pin.describe())
        opts.key_types = wanted
        try:
            t.start_client(timeout=ep.connect_timeout_s)
        except paramiko.SSHException as exc:
            text = str(exc)
            if "host key" in text.lower():
                raise HostKeyMismatch(ep.host, "none of the pinned key types offered", ep.pin.describe()) from exc
            if "banner" in text.lower() or "timeout" in text.lower():
                raise ConnectTimeout(ep.host, f"SSH handshake: {text}") from exc
            raise SessionDropped(ep.host, f"SSH handshake: {text}") from exc
        except (EOFError, OSError) as exc:
            raise SessionDropped(ep.host, f"SSH handshake: {type(exc).__name__}") from exc

    def _verify(self, t: paramiko.Transport) -> None:
        ep = self.endpoint
        key = t.get_remote_server_key()
        if not pin_matches(ep.pin, key):
            presented = f"{key.get_name()} MD5:{md5_fingerprint(key.asbytes())}"
            log.warning("ssh %s: host key mismatch (%s)", ep.host, presented)
            raise HostKeyMismatch(ep.host, presented, ep.pin.describe())

    def _authenticate(self, t: paramiko.Transport) -> None:
        ep, cred = self.endpoint, self._credentials
        t.auth_timeout = ep.auth_timeout_s
        try:
            if cred.private_key:
                t.auth_publickey(ep.user, load_private_key(cred.private_key))
            elif cred.password:
                t.auth_password(ep.user, cred.password)
            else:
                raise AuthenticationFailed(ep.host, "no credentials given")
        except paramiko.AuthenticationException as exc:
            raise AuthenticationFailed(ep.host, f"{ep.user}: {type(exc).__name__}") from exc
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise SessionDropped(ep.host, f"during authentication: {type(exc).__name__}") from exc

    def run(self, operation: str, command: str, timeout: float | None = None, stdin: bytes | None = None) -> Result:
        """Run ``command`` (never containing secrets); bounded by ``timeout``."""
        ep = self.endpoint
        limit = timeout if timeout is not None else ep.command_timeout_s
        chan = self._channel(operation)
        try:
            chan.exec_command(command)
            if stdin is not None:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = self._drain(chan, operation, limit)
            status = chan.recv_exit_status() if chan.exit_status_ready() else -1
            chan.close()
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.close()
            raise SessionDropped(ep.host, f"{operation}: {type(exc).__name__}: {exc}") from exc
        if status == -1:
            self.close()
            raise SessionDropped(ep.host, f"{operation}: remote command exited without exit status")
        log.debug("ssh %s: %s exited %d", ep.host, operation, status)
        return Result(status, bytes(out), bytes(err))

    def _channel(self, operation: str) -> paramiko.Channel:
        """A channel on the cached transport, or on a new one when the cached one died unnoticed: its reader
        thread may not have seen the peer's reset yet. Nothing ran on the failed open, so one retry is safe."""
        reused = self.alive
        try:
            return self.open().open_session(timeout=self.endpoint.connect_timeout_s)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            self.close()
            if not reused:
                raise SessionDropped(self.endpoint.host, f"{operation}: {type(exc).__name__}: {exc}") from exc
            log.debug("ssh %s: cached session was dead (%s); reconnecting", self.endpoint.host, type(exc).__name__)
        return self._channel(operation)  # closed now, so not ``reused``: at most one retry

    def _drain(self, chan: paramiko.Channel, operation: str, limit: float) -> tuple[bytearray, bytearray]:
        out, err = bytearray(), bytearray()
        deadline = time.monotonic() + limit
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                return out, err
            if chan.closed or (chan.eof_received and not self.alive):
                return out, err
            if time.monotonic() > deadline:
                chan.close()
                raise CommandTimeout(self.endpoint.host, f"{operation} still running after {limit}s")
            chan.status_event.wait(0.02)

    def put(self, path: str, data: bytes, mode: int) -> None:
        """Write a file atomically over SFTP: created 0600 first, chmod, then renamed into place."""
        tmp = f"{path}.capigpu-tmp"
        self.run("write_file", f"umask 077 && : > '{tmp}'")
        t = self.open()
        try:
            sftp = paramiko.SFTPClient.from_transport(t)
            if sftp is None:
                raise SessionDropped(self.endpoint.host, "write_file: no SFTP channel")
            with sftp:
                with sftp.open(tmp, "wb") as fh:
                    fh.write(data)
                sftp.chmod(tmp, mode)
                sftp.posix_rename(tmp, path)
        except OSError as exc:
            raise CommandFailed(self.endpoint.host, f"write_file {path}", -1, type(exc).__name__) from exc
        except (paramiko.SSHException, EOFError) as exc:
            self.close()
            raise SessionDropped(self.endpoint.host, f"write_file: {type(exc).__name__}") from exc

    def get(self, path: str, local: str) -> None:
        """Copy a remote file to ``local`` over SFTP, streamed (node images are GBs), via ``local.part``."""
        t = self.open()
        part = f"{local}.part"
        try:
            sftp = paramiko.SFTPClient.from_transport(t)
            if sftp is None:
                raise SessionDropped(self.endpoint.host, "get: no SFTP channel")
            with sftp:
                sftp.get(path, part)
            os.replace(part, local)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise CommandFailed(self.endpoint.host, f"get {path}", -1, type(exc).__name__) from exc
        except (paramiko.SSHException, EOFError) as exc:
            self.close()
            raise SessionDropped(self.endpoint.host, f"get: {type(exc).__name__}") from exc

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
