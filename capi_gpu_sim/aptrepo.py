"""The simulation's local apt repository: stand-in .debs under their real names, one flat repo per source.

Why a real apt repository and not files copied into the guest: the node playbook is production code.
It adds signed sources, refreshes them, installs pinned versions, holds packages and installs a .deb
by path; all of that must run for real against a simulated host. So the stand-ins
(``capi_gpu_sim.apt_standins``) are built with ``dpkg-deb --build`` and indexed with a ``Packages``
file (fields and checksums as dpkg-scanpackages writes them) plus an unsigned ``Release``, served as
``deb [trusted=yes] file:<guest dir>/<channel> ./``. One channel per real repository (NVIDIA's CUDA
repo, the container toolkit repo, Docker's, pkgs.k8s.io), so each role points at "its" repository.

Built once per content hash and cached under ``~/.cache/capi-gpu/apt/<hash>/`` (built in a temporary
directory under a lock, then renamed). The guest sees it at ``GUEST_DIR`` (``/srv/capi-gpu-apt``):
``FleetConfig.apt_repo`` has the fleet bind-mount ``repo_dir`` there read-only in every boot of a host's disk
(nothing copied per host, and an install that resets the disk keeps it); ``install_into`` copies it into
a guest root instead.
``playbook_repositories`` gives the ``PlaybookVars`` fields that point the roles at it. The nvidia-mig-manager
stand-in .deb is there for the optional .deb route; the default route copies the operator's built binary.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from capi_gpu.provisioning import playbook_vars
from capi_gpu_sim import apt_standins, host_shims

GUEST_DIR: Final = host_shims.APT_GUEST_DIR
FORMAT: Final = "v3"  # bump when the build itself changes, so caches are rebuilt
MAINTAINER: Final = "capi-gpu simulation <sim@capi-gpu.invalid>"
RELEASE_DATE: Final = "Thu, 01 Jan 2026 00:00:00 UTC"  # fixed: the cache key covers content, not time
LOCK_TIMEOUT_S: Final = 300.0


@dataclass(frozen=True)
class AptRepo:
    """A built repository: ``repo_dir/<channel>/{*.deb,Packages,Release}``."""

    repo_dir: Path
    packages: tuple[apt_standins.Package, ...]

    def channel_dir(self, channel: str) -> Path:
        return self.repo_dir / channel

    def deb_path(self, name: str) -> Path:
        pkg = next(p for p in self.packages if p.name == name)
        return self.channel_dir(pkg.channel) / pkg.deb_name

    def guest_deb(self, name: str, guest_dir: str = GUEST_DIR) -> str:
        pkg = next(p for p in self.packages if p.name == name)
        return f"{guest_dir}/{pkg.channel}/{pkg.deb_name}"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "capi-gpu" / "apt"


def content_key(pkgs: list[apt_standins.Package]) -> str:
    h = hashlib.sha256(FORMAT.encode())
    for pkg in sorted(pkgs, key=lambda p: p.name):
        h.update(control(pkg, 0).encode() + pkg.postinst.encode())
        for path, f in sorted(pkg.files.items()):
            h.update(f"{path}\0{f.mode:o}\0{f.link}\0".encode() + f.content)
    return h.hexdigest()[:16]


def ensure_repo(kubernetes_version: str, driver_branch: str = "580", root: Path | None = None) -> AptRepo:
    """The repository for this cluster version and driver branch, built first if it is not cached."""
    pkgs = apt_standins.packages(kubernetes_version, driver_branch)  # the archive for the running kernel
    base = root or cache_root()
    base.mkdir(parents=True, exist_ok=True)
    final = base / content_key(pkgs)
    repo = AptRepo(final, tuple(pkgs))
    if (final / ".complete").exists():
        return repo
    with _locked(base / f"{final.name}.lock"):
        if (final / ".complete").exists():
            return repo
        tmp = Path(tempfile.mkdtemp(prefix=f"{final.name}.tmp-", dir=base))
        try:
            build(tmp, pkgs)
            (tmp / ".complete").write_text("\n".join(p.deb_name for p in pkgs) + "\n")
            shutil.rmtree(final, ignore_errors=True)
            tmp.rename(final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return repo


def build(repo_dir: Path, pkgs: list[apt_standins.Package]) -> None:
    """Build every package into its channel and write each channel's Packages and Release."""
    with tempfile.TemporaryDirectory(prefix="capi-gpu-deb-") as staging:
        for pkg in pkgs:
            out = repo_dir / pkg.channel
            out.mkdir(parents=True, exist_ok=True)
            build_deb(pkg, Path(staging) / pkg.channel / pkg.name, out / pkg.deb_name)  # a name may be in two channels
    for channel in {p.channel for p in pkgs}:
        write_index(repo_dir / channel, [p for p in pkgs if p.channel == channel])


def build_deb(pkg: apt_standins.Package, staging: Path, out: Path) -> None:
    size_kib = 0
    for guest_path, f in pkg.files.items():
        target = staging / guest_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.link is not None:
            target.symlink_to(f.link)
        else:
            target.write_bytes(f.content)
            target.chmod(f.mode)
            size_kib += (len(f.content) + 1023) // 1024
    debian = staging / "DEBIAN"
    debian.mkdir(parents=True)
    (debian / "control").write_text(control(pkg, size_kib))
    if pkg.postinst:
        (debian / "postinst").write_text(pkg.postinst)
    conffiles = sorted(p for p in pkg.files if p.startswith("/etc/"))
    if conffiles:
        (debian / "conffiles").write_text("".join(c + "\n" for c in conffiles))
    for d in [staging, *staging.rglob("*")]:
        if d.is_dir() and not d.is_symlink():
            d.chmod(0o755)
    if pkg.postinst:
        (debian / "postinst").chmod(0o755)
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", str(staging), str(out)],
        check=True,
        capture_output=True,
        timeout=120,
    )


def control(pkg: apt_standins.Package, installed_size_kib: int) -> str:
    fields = [
        ("Package", pkg.name),
        ("Version", pkg.version),
        ("Architecture", "all"),
        ("Maintainer", MAINTAINER),
        ("Installed-Size", str(max(1, installed_size_kib))),
        ("Depends", ", ".join(pkg.depends)),
        ("Provides", ", ".join(pkg.provides)),
        ("Conflicts", ", ".join(pkg.conflicts)),
        ("Section", "misc"),
        ("Priority", "optional"),
        ("Description", f"{pkg.description} (capi-gpu stand-in)\n Simulation stand-in for the real {pkg.name}."),
    ]
    return "".join(f"{k}: {v}\n" for k, v in fields if v)


def write_index(channel_dir: Path, pkgs: list[apt_standins.Package]) -> None:
    """Packages (the deb's control stanza plus Filename, Size and checksums) and an unsigned Release."""
    stanzas = []
    for pkg in sorted(pkgs, key=lambda p: p.name):
        deb = channel_dir / pkg.deb_name
        data = deb.read_bytes()
        ctrl = subprocess.run(
            ["dpkg-deb", "--field", str(deb)], check=True, capture_output=True, text=True, timeout=60
        ).stdout
        stanzas.append(
            ctrl.rstrip("\n")
            + f"\nFilename: ./{pkg.deb_name}\nSize: {len(data)}\n"
            + f"MD5sum: {hashlib.md5(data, usedforsecurity=False).hexdigest()}\n"
            + f"SHA1: {hashlib.sha1(data, usedforsecurity=False).hexdigest()}\n"
            + f"SHA256: {hashlib.sha256(data).hexdigest()}\n"
        )
    index = "\n".join(stanzas).encode()
    (channel_dir / "Packages").write_bytes(index)
    (channel_dir / "Packages.gz").write_bytes(gzip.compress(index, mtime=0))
    sums: dict[str, list[str]] = {"MD5Sum": [], "SHA256": []}
    for name in ("Packages", "Packages.gz"):
        blob = (channel_dir / name).read_bytes()
        sums["MD5Sum"].append(f" {hashlib.md5(blob, usedforsecurity=False).hexdigest()} {len(blob)} {name}")
        sums["SHA256"].append(f" {hashlib.sha256(blob).hexdigest()} {len(blob)} {name}")
    origin, label = apt_standins.RELEASE_ORIGINS.get(
        channel_dir.name, ("capi-gpu-sim", f"capi-gpu-sim {channel_dir.name}")
    )
    release = [
        f"Origin: {origin}",
        f"Label: {label}",
        f"Date: {RELEASE_DATE}",
        "Architectures: all amd64 arm64",
        *[line for key, lines in sums.items() for line in [f"{key}:", *lines]],
    ]
    (channel_dir / "Release").write_text("\n".join(release) + "\n")


def playbook_repositories(repo: AptRepo, guest_dir: str = GUEST_DIR) -> dict[str, object]:
    """``PlaybookVars`` keyword arguments that point every role at the local repository."""

    def source(channel: str) -> playbook_vars.AptRepository:
        return playbook_vars.AptRepository(uri=f"file:{guest_dir}/{channel}", suite="./", trusted=True)

    return {
        "nvidia_repo": source(apt_standins.NVIDIA),
        "container_toolkit_repo": source(apt_standins.TOOLKIT),
        "containerd_repo": source(apt_standins.DOCKER),
        "kubernetes_repo": source(apt_standins.KUBERNETES),
        # The shipped nvidia-mig-parted is copied and checked; the GPU shim's applies the layout (no NVML here).
        "mig_parted_exec": apt_standins.SIM_MIG_PARTED,
    }


def install_into(repo: AptRepo, guest_root: Path, guest_dir: str = GUEST_DIR) -> Path:
    """Copy the repository into a guest root (a running guest's /proc/<pid>/root, or an upper dir)."""
    dest = guest_root / guest_dir.lstrip("/")
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(repo.repo_dir, dest, ignore=shutil.ignore_patterns(".complete"))
    return dest


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"apt repo lock {path} held too long") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)
