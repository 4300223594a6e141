"""A stand-in repository publisher that signs: its key expires, and it extends the expiry by re-signing the key.

Why: the simulation's channels are ``trusted=yes`` (``capi_gpu_sim.aptrepo``), so nothing in them exercises
what the roles do with a signing key over a long-lived node's life. pkgs.k8s.io extends its key's expiry by
re-signing it, and a node that kept its old copy fails ``apt-get update`` with EXPKEYSIG while the pinned
fingerprint still matches. A ``Publisher`` plays that publisher with real gpg: a key made (with gpg's faked
clock) long ago with an expiry that has passed, Release files signed the way apt verifies them (``InRelease``
clear-signed and ``Release.gpg`` detached), and ``extend`` for the re-signed key with a new expiry. An
``attacker`` is just another publisher whose key lands at the same URL.
"""

from __future__ import annotations

import hashlib
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

GPG_TIMEOUT_S = 120


def _short_home(home: Path) -> Path:
    """A short symlink to ``home``: gpg-agent puts its sockets in the homedir, and a Unix socket's path is
    at most 107 bytes, which pytest's default temp paths pass (the agent then exits 2 and gpg reports "No
    agent running"). gpg does not resolve the link, so its sockets get the short path."""
    digest = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    link = Path(tempfile.gettempdir()) / f"capi-gpu-gpg-{digest}"
    if not (link.is_symlink() and link.resolve() == home.resolve()):
        link.unlink(missing_ok=True)
        link.symlink_to(home.resolve(), target_is_directory=True)
    return link


def _gpg(home: Path, *args: str, faked: str | None = None) -> str:
    short = _short_home(home)
    argv = ["gpg", "--homedir", str(short), "--batch", "--pinentry-mode", "loopback", "--passphrase", ""]
    if faked is not None:
        argv += ["--faked-system-time", faked]  # e.g. 20200101T000000: gpg's clock for this call only
    try:
        done = subprocess.run([*argv, *args], capture_output=True, text=True, timeout=GPG_TIMEOUT_S, check=False)
    finally:
        # gpg starts a gpg-agent per homedir for secret-key work, and it outlives the test: each holds 2 inotify
        # instances of the user's 128, and a CI run that leaked dozens starved CAPI's manager ("too many open
        # files") and the simulated hosts. The next call starts it again if needed.
        subprocess.run(["gpgconf", "--homedir", str(short), "--kill", "gpg-agent"], capture_output=True, check=False)
        short.unlink(missing_ok=True)
    if done.returncode != 0:
        raise RuntimeError(f"gpg {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Publisher:
    home: Path
    fingerprint: str

    @classmethod
    def create(cls, home: Path, name: str, created: str | None = None, expires: str = "2y") -> Publisher:
        """A signing key for ``name``, made at ``created`` (gpg's faked clock; None: now), valid for ``expires``."""
        home.mkdir(parents=True, exist_ok=True, mode=0o700)
        uid = f"{name} (capi-gpu simulation) <{name}@capi-gpu.invalid>"
        _gpg(home, "--quick-gen-key", uid, "rsa2048", "sign", expires, faked=created)
        listing = _gpg(home, "--with-colons", "--list-keys", uid)
        fingerprint = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:"))
        return cls(home, fingerprint)

    def export(self, dest: Path) -> Path:
        """The armored public key, as a publisher serves it at its key URL."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(_gpg(self.home, "--armor", "--export", self.fingerprint))
        return dest

    def sign(self, channel_dir: Path, at: str | None = None) -> None:
        """Sign ``channel_dir/Release`` at ``at`` (faked clock; None: now) into InRelease and Release.gpg."""
        release = channel_dir / "Release"
        for out, mode in ((channel_dir / "InRelease", "--clearsign"), (channel_dir / "Release.gpg", "--detach-sign")):
            out.unlink(missing_ok=True)
            _gpg(self.home, "--local-user", self.fingerprint, "--armor", mode, "-o", str(out), str(release), faked=at)

    def extend(self, expires: str = "2y") -> None:
        """A new self-signature with a new expiry (from now), as pkgs.k8s.io re-signs its key: same fingerprint."""
        _gpg(self.home, "--quick-set-expire", self.fingerprint, expires)
