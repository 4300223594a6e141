"""The files that make a boot target what it is: rescue system, freshly installed image, previous OS.

Why layers: every host boots the one cached Debian tree (``rootfs``), never modified. On top of it,
per fleet, sit two read-only layers built once from ``host_shims``: ``rescue`` (installimage, hardware
tools, stand-in images under /root/.oldroot/nfs/images) and ``image`` (what an installed image brings:
the cloud-init stand-in, lspci). Per host there are two writable upper dirs:

- ``rescue/upper``: rebuilt at every rescue boot, like the RAM-backed rescue system: hostname
  ``rescue``, the host keys Robot generated, root's authorized keys (and password) as Robot was given;
- ``disk/upper``: the installed system, i.e. the host's "disk". installimage (inside rescue) resets it;
  until then it holds a "previous OS" with a host key nobody knows, so a pin against it must fail.

``disk/`` also holds ``partitions.json`` (what lsblk shows) and ``installed.json`` (what is installed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from capi_gpu_sim import host_shims
from capi_gpu_sim.hosts import hardware, targets

# Stand-ins for Hetzner's image directory; installimage validates names and existence, never content.
IMAGES = (
    "Ubuntu-2404-noble-amd64-base.tar.gz",
    "Ubuntu-2404-noble-amd64-base.tar.zst",  # the form hetzner.md §4.2 shows
    "Ubuntu-2204-jammy-amd64-base.tar.gz",
    "Debian-1208-bookworm-amd64-base.tar.gz",
    "Debian-1300-trixie-amd64-base.tar.zst",
    "Rocky-95-amd64-base.tar.gz",
)
SSHD_RESCUE = """# Hetzner rescue system (simulated)
Port 22
{host_keys}
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication {password}
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
PidFile /run/sshd.pid
UseDNS no
MaxStartups 100:30:200
Subsystem sftp /usr/lib/openssh/sftp-server
"""


def write_files(root: Path, files: dict[str, host_shims.GuestFile]) -> None:
    for guest_path, f in files.items():
        target = root / guest_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        if f.link is not None:
            target.symlink_to(f.link)
        else:
            target.write_bytes(f.content)
            target.chmod(f.mode)


def build_layers(layers: Path, mount_points: tuple[str, ...] = ()) -> tuple[Path, Path]:
    """(rescue layer, image layer) for one fleet; ``mount_points`` are empty directories in the image layer
    for what a boot binds into the installed OS, so that binding them never writes into a host's disk."""
    rescue, image = layers / "rescue", layers / "image"
    for d in (rescue, image):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    write_files(rescue, host_shims.rescue_files())
    images = rescue / "root" / ".oldroot" / "nfs" / "images"
    images.mkdir(parents=True, exist_ok=True)
    for name in IMAGES:
        (images / name).write_bytes(b"")
    (rescue / "etc").mkdir(exist_ok=True)
    (rescue / "etc" / "motd").write_text("\n  Welcome to the Hetzner Rescue System (simulated).\n\n")
    os.chmod(rescue / "root", 0o700)
    write_files(image, host_shims.installed_files())
    for point in mount_points:
        (image / point.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return rescue, image


def _reset(*dirs: Path) -> None:
    for d in dirs:
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)


def key_file_name(private_key: str) -> str:
    """``ssh_host_<type>_key`` for a private key in OpenSSH or PEM form."""
    data = private_key.encode()
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except ValueError:
        key = serialization.load_pem_private_key(data, password=None)  # type: ignore[assignment]
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "ssh_host_ed25519_key"
    if isinstance(key, rsa.RSAPrivateKey):
        return "ssh_host_rsa_key"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return "ssh_host_ecdsa_key"
    raise ValueError(f"unsupported host key type {type(key).__name__}")


RESCUE_HOSTS = "127.0.0.1 localhost\n127.0.1.1 rescue\n::1 localhost\n"
"""The rescue system's /etc/hosts; a rescue file for /etc/hosts extends it rather than restating it."""


def prepare_rescue(
    upper: Path, work: Path, boot_dir: Path, boot: targets.RescueBoot, files: Mapping[str, bytes] | None = None
) -> None:
    """The RAM-backed rescue system's writable layer, fresh: hostname, sshd with Robot's host keys, root's
    authorized keys, and ``files`` (guest path -> content, written last, so they may replace /etc/hosts)."""
    _reset(upper, work)
    etc = upper / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "hostname").write_text("rescue\n")
    (etc / "hosts").write_text(RESCUE_HOSTS)
    key_lines = []
    for private in boot.host_keys:
        name = key_file_name(private)
        path = etc / "ssh" / name
        path.write_text(private if private.endswith("\n") else private + "\n")
        path.chmod(0o600)
        key_lines.append(f"HostKey /etc/ssh/{name}")
    if not key_lines:
        raise ValueError("a rescue boot needs at least one host key (Robot generates them)")
    (etc / "ssh" / "sshd_config").write_text(
        SSHD_RESCUE.format(host_keys="\n".join(key_lines), password="yes" if boot.password else "no")
    )
    dot_ssh = upper / "root" / ".ssh"
    dot_ssh.mkdir(parents=True, mode=0o700)
    os.chmod(upper / "root", 0o700)
    (dot_ssh / "authorized_keys").write_text("".join(k.strip() + "\n" for k in boot.authorized_keys))
    (dot_ssh / "authorized_keys").chmod(0o600)
    for guest_path, content in (files or {}).items():
        target = upper / guest_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    pw = boot_dir / "password"
    if boot.password:
        pw.write_text(f"root:{boot.password}\n")
        pw.chmod(0o600)
    else:
        pw.unlink(missing_ok=True)


def install_previous_os(disk_dir: Path, hw: hardware.Hardware, hostname: str) -> None:
    """The OS a server had before it was handed to us: unknown host key, no keys of ours."""
    upper, work = disk_dir / "upper", disk_dir / "work"
    _reset(upper, work)
    etc = upper / "etc"
    (etc / "ssh").mkdir(parents=True)
    (etc / "hostname").write_text(hostname + "\n")
    (etc / "hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n")
    subprocess.run(
        [
            "ssh-keygen",
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            f"root@{hostname}",
            "-f",
            str(etc / "ssh" / "ssh_host_ed25519_key"),
        ],
        check=True,
        timeout=30,
    )
    first = hw.disks[0]
    parts = {
        first.name: [
            {"size": 1024 * 1024 * 1024, "fstype": "ext4", "mount": "/boot"},
            {"size": first.size - 1024**3 - 1024**2, "fstype": "ext4", "mount": "/"},
        ]
    }
    (disk_dir / "partitions.json").write_text(json.dumps(parts, indent=1))
    record = {"hostname": hostname, "previous": True, "disks": [first.name]}
    (disk_dir / "installed.json").write_text(json.dumps(record))


def wipe_disk(disk_dir: Path) -> None:
    """A blank disk: nothing boots from it."""
    _reset(disk_dir / "upper", disk_dir / "work")
    (disk_dir / "partitions.json").write_text("{}")
    (disk_dir / "installed.json").unlink(missing_ok=True)


def installed(disk_dir: Path) -> dict[str, object] | None:
    try:
        data: dict[str, object] = json.loads((disk_dir / "installed.json").read_text())
    except (OSError, ValueError):
        return None
    return data
