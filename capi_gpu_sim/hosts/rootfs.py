"""The one Debian tree every simulated GEX131 host boots from, built once and cached.

Why a real debootstrap and not a hand-made tree: Ansible, apt, systemd and sshd inside a host must be
the real Debian programs, so that a playbook that works here works on a real server. Why cached and
keyed by the package list: a cold build takes most of a minute and ~250 MB; every host and every boot
reuses it read-only through overlay views (see ``views``), so a changed package list is a new key and
an old tree is never mutated in place.

The tree is post-processed for life inside a namespace: no ssh host keys (each view gets its own), an
empty machine-id, gettys and kernel-facing units masked (sysctl, modules, debugfs...), so that a guest's
systemd cannot reach the test machine's kernel settings by accident.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

SUITE: Final = "bookworm"
DEFAULT_MIRROR: Final = "http://deb.debian.org/debian"

# What ansible (apt module needs python3-apt), systemd-as-PID-1, sshd with sftp (ansible's transfer),
# the cloud-init stand-in (python3-yaml) and `become` (sudo) need inside a host.
PACKAGES: Final[tuple[str, ...]] = (
    "python3",
    "python3-apt",
    "python3-yaml",
    "openssh-server",
    "openssh-sftp-server",
    "iproute2",
    "systemd",
    "systemd-sysv",
    "dbus",
    "procps",
    "sudo",
    "curl",  # rescue fetches https node images with it (Hetzner's rescue has it)
)

# Units that would touch the real kernel or a real console; masked in the base tree.
MASKED_UNITS: Final[tuple[str, ...]] = (
    "getty@.service",
    "serial-getty@.service",
    "console-getty.service",
    "getty.target",
    "systemd-sysctl.service",
    "systemd-modules-load.service",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount",
    "dev-hugepages.mount",
    "dev-mqueue.mount",
    "systemd-random-seed.service",
    "systemd-timesyncd.service",
    "systemd-networkd-wait-online.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
    "e2scrub_all.timer",
    "fstrim.timer",
    "ssh.socket",
)

BUILD_TIMEOUT_S: Final = 1800.0
LOCK_TIMEOUT_S: Final = 2400.0


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "capi-gpu" / "rootfs"


def cache_key(packages: tuple[str, ...] = PACKAGES, suite: str = SUITE) -> str:
    text = "\n".join([suite, *sorted(packages), *MASKED_UNITS, "v4"])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BuildReport:
    """What a build cost; ``cached`` is True when nothing was built."""

    path: Path
    cached: bool
    seconds: float
    size_bytes: int


def ensure_rootfs(
    packages: tuple[str, ...] = PACKAGES, mirror: str | None = None, root: Path | None = None
) -> BuildReport:
    """Return the cached tree for ``packages``, building it first (under a lock) if absent."""
    base = root or cache_root()
    base.mkdir(parents=True, exist_ok=True)
    key = cache_key(packages)
    final = base / key
    if (final / ".complete").exists():
        return BuildReport(final, True, 0.0, 0)
    with _locked(base / f"{key}.lock"):
        if (final / ".complete").exists():
            return BuildReport(final, True, 0.0, 0)
        started = time.monotonic()
        tmp = base / f"{key}.tmp-{os.getpid()}"
        _remove_tree(tmp)
        try:
            _debootstrap(tmp, packages, mirror or os.environ.get("CAPI_GPU_DEBIAN_MIRROR") or DEFAULT_MIRROR)
            _postprocess(tmp)
            (tmp / ".complete").write_text(",".join(packages) + "\n")
            _remove_tree(final)
            tmp.rename(final)
        finally:
            _remove_tree(tmp)
        return BuildReport(final, False, time.monotonic() - started, tree_size(final))


def tree_size(path: Path) -> int:
    out = subprocess.run(["du", "-sb", str(path)], check=True, capture_output=True, text=True, timeout=120)
    return int(out.stdout.split()[0])


class _locked:
    """An exclusive flock with a bounded wait, so two test sessions never build the same tree."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._fd = -1

    def __enter__(self) -> None:
        self._fd = os.open(self._path, os.O_CREAT | os.O_RDWR, 0o644)
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(self._fd)
                    raise TimeoutError(f"rootfs lock {self._path} held too long") from None
                time.sleep(0.5)

    def __exit__(self, *_: object) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)


def _debootstrap(target: Path, packages: tuple[str, ...], mirror: str) -> None:
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap missing: run hack/install-system-deps.sh")
    cmd = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        SUITE,
        str(target),
        mirror,
    ]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env, check=False)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        log = target / "debootstrap" / "debootstrap.log"
        if log.exists():
            tail += "\n" + log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"debootstrap failed ({proc.returncode}):\n{tail}")


def _postprocess(root: Path) -> None:
    subprocess.run(["chroot", str(root), "apt-get", "clean"], check=True, timeout=120, capture_output=True)
    for key in (root / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc" / "machine-id").write_text("")
    dbus_id = root / "var" / "lib" / "dbus" / "machine-id"
    if dbus_id.is_symlink() or dbus_id.exists():
        dbus_id.unlink()
    units = root / "etc" / "systemd" / "system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        link = units / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    # sshd's privilege-separation dir normally comes from tmpfiles at boot; rescue runs sshd as PID 1.
    (root / "run" / "sshd").mkdir(parents=True, exist_ok=True)
    shutil.rmtree(root / "var" / "lib" / "apt" / "lists", ignore_errors=True)
    (root / "var" / "lib" / "apt" / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    # No root password ("*", not the locked "!": sshd refuses key logins to locked accounts); the rescue
    # view sets one when Robot generated it.
    subprocess.run(["chroot", str(root), "usermod", "-p", "*", "root"], check=True, timeout=30, capture_output=True)


def _remove_tree(path: Path) -> None:
    """rmtree that first detaches anything a failed debootstrap left mounted inside (proc, sys)."""
    if not (path.exists() or path.is_symlink()):
        return
    unmount_below(path)
    shutil.rmtree(path, ignore_errors=False)


def unmount_below(path: Path) -> None:
    """Lazily unmount every mount point at or below ``path``, deepest first."""
    prefix = str(path.resolve())
    points = []
    with open("/proc/self/mounts") as fh:
        for line in fh:
            point = line.split()[1].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, timeout=30, capture_output=True)
