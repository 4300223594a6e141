"""SSH to a server in rescue or in its installed OS, with pinned host keys, as one narrow Protocol.

Why a Protocol of meaningful operations (``hostname()``, ``start_installimage()``...) and not "run a
command": the provisioning steps say what they need, tests and the simulator exercise exactly those
operations, and the shell text (which differs between rescue and OS, between CAPH's scripts and ours)
stays in one place. ``ParamikoShell`` is the real implementation; the simulated fleet supplies real
sshd servers, so there is no fake of this module.

Host keys are always verified, never trusted on first use. A ``HostKeyPin`` holds either the MD5
fingerprints Robot reported for the rescue system (``host_key[].key.fingerprint`` + type) or the exact
public key the controller generated for the installed OS. The check happens after key exchange and
before authentication: on a mismatch no credential is offered and ``HostKeyMismatch`` is raised.
Only pinned key types are negotiated, so a server can't pick an unpinned type and look "changed".

Errors (all carry ``host``)::

    SSHError
     +-- ConnectTimeout        no TCP/SSH handshake in time (host down, booting, filtered)
     +-- ConnectionRefused     nothing listens on the port (sshd not up yet)
     +-- HostKeyMismatch       the server's key is not the pinned one (wrong boot target, or MITM)
     +-- AuthenticationFailed  key (or password) refused
     +-- SessionDropped        the connection died mid-operation (reboot, sshd killed)
     +-- CommandTimeout        the remote command outlived its timeout
     +-- CommandFailed         non-zero exit: ``operation``, ``exit_status``, ``stderr_tail``

Secrets (private keys, passwords, post-install scripts carrying bootstrap data) are passed as
values, go over SFTP rather than command lines, and never reach logs or exception messages.
"""

from __future__ import annotations

import asyncio
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol

from capi_gpu import domain
from capi_gpu.gpu import nvidia_smi
from capi_gpu.provisioning import hostfacts, image_bake, node_image, sshtransport
from capi_gpu.provisioning.model import CloudInitState, InstallProgress
from capi_gpu.provisioning.sshtransport import (
    AuthenticationFailed,
    CommandFailed,
    CommandTimeout,
    ConnectionRefused,
    ConnectTimeout,
    Credentials,
    Endpoint,
    HostKeyMismatch,
    HostKeyPin,
    SessionDropped,
    SSHError,
)

__all__ = [
    "AsyncHostShell",
    "AuthenticationFailed",
    "CommandFailed",
    "CommandTimeout",
    "ConnectTimeout",
    "ConnectionRefused",
    "Credentials",
    "Endpoint",
    "HostKeyMismatch",
    "HostKeyPin",
    "HostShell",
    "InstallImageStatus",
    "ParamikoShell",
    "SSHError",
    "SessionDropped",
    "UnknownDisk",
]

INSTALLIMAGE = "/root/.oldroot/nfs/install/installimage"
AUTOSETUP = "/autosetup"
POST_INSTALL = "/root/post-install.sh"
WRAPPER = "/root/installimage-wrapper.sh"
WRAPPER_LOG = "/root/installimage-wrapper.sh.log"
EXIT_FILE = "/root/installimage-wrapper.exit"
PID_FILE = "/root/installimage-wrapper.pid"
DEBUG_LOG = "/root/debug.txt"
LSBLK = "lsblk -J -b -o NAME,WWN,SIZE,MODEL,SERIAL,ROTA,TYPE,FSTYPE"


class UnknownDisk(ValueError):
    """A WWN the caller named (root device hint) is not a disk of this server."""


@dataclass(frozen=True)
class InstallImageStatus:
    state: InstallProgress
    exit_status: int | None = None
    log_tail: str = ""  # wrapper output + /root/debug.txt; no secrets (the post-install echoes none)


class HostShell(Protocol):
    """What provisioning asks of a server over SSH."""

    def hostname(self) -> str: ...

    def boot_id(self) -> str: ...

    def reboot(self) -> None: ...

    def disks(self) -> list[hostfacts.Disk]: ...

    def gpus(self) -> list[nvidia_smi.PciDevice]: ...

    def cpu_memory(self) -> tuple[int, int]: ...

    def wipe(self, wwns: Sequence[str]) -> None: ...

    def start_bootstrap(self, user_data: str, meta_data: str) -> None: ...

    def smart_ok(self, wwns: Sequence[str] | None = None) -> bool: ...

    def other_linux_present(self, root_wwns: Sequence[str]) -> list[str]: ...

    def write_file(self, path: str, data: bytes | str, mode: int = 0o600, parents: bool = False) -> None: ...

    def read_file(self, path: str) -> str | None: ...

    def uefi(self) -> bool: ...

    def stage_image(self, source: str, dest: str) -> str: ...

    def image_manifest(self, dest: str) -> str | None: ...

    def start_installimage(self, autosetup: str, post_install: str | None = None) -> None: ...

    def installimage_state(self) -> InstallImageStatus: ...

    def cloud_init_status(self) -> CloudInitState: ...

    def sentinel_present(self) -> bool: ...

    def kubeadm_reset(self) -> None: ...

    def nvidia_smi(self, args: Sequence[str]) -> str: ...

    def gpu_query(self, fields: Sequence[str]) -> list[dict[str, str]]: ...

    def close(self) -> None: ...


class ParamikoShell:
    """``HostShell`` over paramiko; one session reused across calls, reopened when it dropped."""

    def __init__(self, endpoint: Endpoint, credentials: Credentials, installimage: str = INSTALLIMAGE) -> None:
        self._session = sshtransport.Session(endpoint, credentials)
        self._installimage = installimage

    @property
    def host(self) -> str:
        return self._session.endpoint.host

    def __enter__(self) -> ParamikoShell:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _run(
        self, operation: str, command: str, check: bool = True, timeout: float | None = None
    ) -> sshtransport.Result:
        result = self._session.run(operation, command, timeout=timeout)
        if check and result.exit_status != 0:
            raise CommandFailed(self.host, operation, result.exit_status, result.tail())
        return result

    def hostname(self) -> str:
        return self._run("hostname", "hostname").text.strip()

    def boot_id(self) -> str:
        return self._run("boot_id", "cat /proc/sys/kernel/random/boot_id").text.strip()

    def reboot(self) -> None:
        """As CAPH: a session that vanishes without an exit status means the reboot began."""
        try:
            self._run("reboot", "reboot", check=True, timeout=30)
        except SessionDropped:
            pass
        finally:
            self._session.close()

    def disks(self) -> list[hostfacts.Disk]:
        return hostfacts.parse_lsblk(self._run("disks", LSBLK).text)

    def gpus(self) -> list[nvidia_smi.PciDevice]:
        """NVIDIA display/3D controllers from ``lspci -nn``; one that fell off the bus shows ``rev ff``
        (``hostfacts.fell_off_bus``)."""
        return nvidia_smi.nvidia_gpus(self._run("gpus", "lspci -nn").text)

    def _select(self, wwns: Sequence[str] | None) -> list[hostfacts.Disk]:
        disks = self.disks()
        if wwns is None:
            return disks
        known = {d.wwn: d for d in disks if d.wwn}
        missing = [w for w in wwns if w not in known]
        if missing:
            raise UnknownDisk(f"{self.host}: {', '.join(missing)} is not a disk of this server")
        return [known[w] for w in wwns]

    def cpu_memory(self) -> tuple[int, int]:
        """(logical CPUs, RAM in MiB) from nproc and /proc/meminfo."""
        out = self._run("cpu_memory", "nproc; grep MemTotal /proc/meminfo").text.split()
        return int(out[0]), int(out[2]) // 1024

    def wipe(self, wwns: Sequence[str]) -> None:
        """Remove every signature (partition tables, RAID, filesystems) from these disks."""
        for disk in self._select(wwns):
            self._run("wipe", f"wipefs -a /dev/{shlex.quote(disk.name)}", timeout=300)

    def start_bootstrap(self, user_data: str, meta_data: str) -> None:
        """Write the NoCloud seed (over SFTP: it holds the bootstrap data) and run cloud-init detached."""
        from capi_gpu.provisioning import bootstrap

        user_path, meta_path = bootstrap.seed_paths()
        self._run("seed_dir", f"install -d -m 0700 {shlex.quote(user_path.rsplit('/', 1)[0])}")
        self.write_file(user_path, user_data, 0o600)
        self.write_file(meta_path, meta_data, 0o600)
        self._run("start_bootstrap", bootstrap.START)

    def smart_ok(self, wwns: Sequence[str] | None = None) -> bool:
        for disk in self._select(wwns):
            res = self._run("smart", f"smartctl -H /dev/{shlex.quote(disk.name)}", check=False)
            if res.exit_status == 127:
                raise CommandFailed(self.host, "smart", 127, res.tail())
            if not hostfacts.smart_passed(res.text) or res.exit_status & 0b1000:
                return False
        return True

    def other_linux_present(self, root_wwns: Sequence[str]) -> list[str]:
        """OS-like partitions on disks other than ``root_wwns`` (empty list: none, safe to install)."""
        self._select(root_wwns)
        return hostfacts.other_linux(self.disks(), root_wwns)

    def write_file(self, path: str, data: bytes | str, mode: int = 0o600, parents: bool = False) -> None:
        if parents:
            self._run("write_file", f"mkdir -p {shlex.quote(path.rsplit('/', 1)[0] or '/')}")
        self._session.put(path, data.encode() if isinstance(data, str) else data, mode)

    def read_file(self, path: str) -> str | None:
        """A small text file's content; None when it does not exist."""
        res = self._run("read_file", f"test -f {shlex.quote(path)} && cat {shlex.quote(path)}", check=False)
        if res.exit_status == 1:
            return None
        if res.exit_status != 0:
            raise CommandFailed(self.host, "read_file", res.exit_status, res.tail())
        return res.text

    def uefi(self) -> bool:
        """Whether the running system (the rescue system) was booted in UEFI mode; installimage asks the same
        question, the same way, and then refuses a config without an EFI System Partition."""
        res = self._run("uefi", "test -d /sys/firmware/efi", check=False)
        if res.exit_status not in (0, 1):
            raise CommandFailed(self.host, "uefi", res.exit_status, res.tail())
        return res.exit_status == 0

    def stage_image(self, source: str, dest: str) -> str:
        """Bring the node image ``source`` (an https URL or a path in rescue) to ``dest`` and return the
        sha256 of what is there (``node_image``). The source travels over SFTP, never on a command line."""
        self._run("stage_image", f"install -d -m 0700 {shlex.quote(node_image.STAGE_DIR)}")
        self.write_file(node_image.SOURCE_WANTED, source, 0o600)
        script = node_image.stage_script(shlex.quote(dest))
        out = self._run("stage_image", script, timeout=node_image.STAGE_TIMEOUT).text.split()
        if not out or len(out[0]) != 64:
            raise CommandFailed(self.host, "stage_image", 0, "sha256sum printed no checksum")
        return out[0]

    def image_manifest(self, dest: str) -> str | None:
        """The manifest member of the staged archive; None when it has none."""
        res = self._run("image_manifest", node_image.member_script(shlex.quote(dest)), check=False, timeout=600)
        if res.exit_status == 4:
            return None
        if res.exit_status != 0:
            raise CommandFailed(self.host, "image_manifest", res.exit_status, res.tail())
        return res.text

    def bake_probe(self) -> image_bake.Facts:
        """What ``capi-gpu image bake`` checks before it captures (a fixed script, ``image_bake``)."""
        return image_bake.parse_probe(self._run("bake_probe", image_bake.PROBE_SCRIPT, timeout=60).text)

    def bake_capture(self, manifest: str) -> tuple[str, int]:
        """Archive the running root with ``manifest`` (``image_bake.capture_script``) on the host; its sha256
        and size. The manifest goes over SFTP, never on a command line."""
        self._run("bake", f"install -d -m 0700 {shlex.quote(image_bake.BAKE_DIR)}")
        self.write_file(image_bake.MANIFEST_STAGED, manifest, 0o600)
        out = self._run("bake", image_bake.capture_script(), timeout=image_bake.CAPTURE_TIMEOUT).text.split()
        if len(out) != 2 or len(out[0]) != 64 or not out[1].isdigit():
            raise CommandFailed(self.host, "bake", 0, "the capture printed no checksum and size")
        return out[0], int(out[1])

    def fetch(self, remote: str, local: str) -> None:
        """Copy ``remote`` to the local path ``local`` over SFTP."""
        self._session.get(remote, local)

    def bake_cleanup(self) -> None:
        self._run("bake_cleanup", image_bake.CLEANUP_SCRIPT, check=False)

    def start_installimage(self, autosetup: str, post_install: str | None = None) -> None:
        """Write the config (and post-install script), then start installimage detached under nohup, so a
        dropped SSH session doesn't kill it; progress is read with ``installimage_state()``."""
        self.write_file(AUTOSETUP, autosetup, 0o600)
        args = f"-a -c {AUTOSETUP}"
        if post_install is not None:
            self.write_file(POST_INSTALL, post_install, 0o700)
            args += f" -x {POST_INSTALL}"
        wrapper = (
            f"#!/bin/bash\nexport TERM=xterm\n"
            f"echo x | {shlex.quote(self._installimage)} {args}\n"
            f"echo $? > {EXIT_FILE}.tmp && mv {EXIT_FILE}.tmp {EXIT_FILE}\n"
        )
        self.write_file(WRAPPER, wrapper, 0o700)
        self._run(
            "start_installimage",
            f"if [ -f {PID_FILE} ] && kill -0 $(cat {PID_FILE}) 2>/dev/null; then "
            f"echo 'installimage already running' >&2; exit 3; fi; rm -f {EXIT_FILE} {WRAPPER_LOG}; "
            f"nohup {WRAPPER} >{WRAPPER_LOG} 2>&1 </dev/null & echo $! > {PID_FILE}",
        )

    def installimage_state(self) -> InstallImageStatus:
        res = self._run(
            "installimage_state",
            f"if [ -f {EXIT_FILE} ]; then echo exit=$(cat {EXIT_FILE}); "
            f"elif [ -f {PID_FILE} ] && kill -0 $(cat {PID_FILE}) 2>/dev/null; then echo running; "
            f"elif [ -f {EXIT_FILE} ]; then echo exit=$(cat {EXIT_FILE}); "  # it ended between checks
            f"elif [ -f {WRAPPER_LOG} ]; then echo vanished; else echo none; fi; "
            f"echo '--- installimage output'; tail -c 3000 {WRAPPER_LOG} 2>/dev/null; "
            f"echo '--- {DEBUG_LOG}'; tail -c 3000 {DEBUG_LOG} 2>/dev/null; true",
        )
        head, _, tail = res.text.partition("\n")
        if head.startswith("exit="):
            code = int(head[5:] or -1)
            state = InstallProgress.SUCCEEDED if code == 0 else InstallProgress.FAILED
            return InstallImageStatus(state, code, tail)
        if head == "running":
            return InstallImageStatus(InstallProgress.RUNNING, None, tail)
        if head == "vanished":
            return InstallImageStatus(InstallProgress.FAILED, None, tail)
        return InstallImageStatus(InstallProgress.NOT_STARTED)

    def cloud_init_status(self) -> CloudInitState:
        res = self._run("cloud_init_status", "cloud-init status", check=False)
        return hostfacts.parse_cloud_init_status(res.text)

    def sentinel_present(self) -> bool:
        res = self._run("sentinel", f"test -f {domain.BOOTSTRAP_SENTINEL}", check=False)
        if res.exit_status not in (0, 1):
            raise CommandFailed(self.host, "sentinel", res.exit_status, res.tail())
        return res.exit_status == 0

    def kubeadm_reset(self) -> None:
        self._run("kubeadm_reset", "kubeadm reset -f", timeout=300)

    def nvidia_smi(self, args: Sequence[str]) -> str:
        """``nvidia-smi`` output; nvidia-smi prints its errors on stdout, so they are in the failure too."""
        res = self._run("nvidia_smi", "nvidia-smi " + shlex.join(args), check=False)
        if res.exit_status != 0:
            raise CommandFailed(self.host, "nvidia_smi", res.exit_status, (res.text + res.stderr.decode())[-2000:])
        return res.text

    def gpu_query(self, fields: Sequence[str]) -> list[dict[str, str]]:
        out = self.nvidia_smi([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
        rows = []
        for line in filter(None, (ln.strip() for ln in out.splitlines())):
            rows.append(dict(zip(fields, (v.strip() for v in line.split(",")), strict=False)))
        return rows

    def close(self) -> None:
        self._session.close()


class AsyncHostShell:
    """The same operations for kopf's event loop: paramiko blocks, so each call runs in a thread."""

    def __init__(self, shell: HostShell) -> None:
        self.sync = shell

    async def hostname(self) -> str:
        return await asyncio.to_thread(self.sync.hostname)

    async def boot_id(self) -> str:
        return await asyncio.to_thread(self.sync.boot_id)

    async def reboot(self) -> None:
        await asyncio.to_thread(self.sync.reboot)

    async def disks(self) -> list[hostfacts.Disk]:
        return await asyncio.to_thread(self.sync.disks)

    async def gpus(self) -> list[nvidia_smi.PciDevice]:
        return await asyncio.to_thread(self.sync.gpus)

    async def wipe(self, wwns: Sequence[str]) -> None:
        await asyncio.to_thread(self.sync.wipe, wwns)

    async def start_bootstrap(self, user_data: str, meta_data: str) -> None:
        await asyncio.to_thread(self.sync.start_bootstrap, user_data, meta_data)

    async def cpu_memory(self) -> tuple[int, int]:
        return await asyncio.to_thread(self.sync.cpu_memory)

    async def smart_ok(self, wwns: Sequence[str] | None = None) -> bool:
        return await asyncio.to_thread(self.sync.smart_ok, wwns)

    async def other_linux_present(self, root_wwns: Sequence[str]) -> list[str]:
        return await asyncio.to_thread(self.sync.other_linux_present, root_wwns)

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o600, parents: bool = False) -> None:
        await asyncio.to_thread(self.sync.write_file, path, data, mode, parents)

    async def read_file(self, path: str) -> str | None:
        return await asyncio.to_thread(self.sync.read_file, path)

    async def start_installimage(self, autosetup: str, post_install: str | None = None) -> None:
        await asyncio.to_thread(self.sync.start_installimage, autosetup, post_install)

    async def installimage_state(self) -> InstallImageStatus:
        return await asyncio.to_thread(self.sync.installimage_state)

    async def cloud_init_status(self) -> CloudInitState:
        return await asyncio.to_thread(self.sync.cloud_init_status)

    async def sentinel_present(self) -> bool:
        return await asyncio.to_thread(self.sync.sentinel_present)

    async def kubeadm_reset(self) -> None:
        await asyncio.to_thread(self.sync.kubeadm_reset)

    async def nvidia_smi(self, args: Sequence[str]) -> str:
        return await asyncio.to_thread(self.sync.nvidia_smi, args)

    async def gpu_query(self, fields: Sequence[str]) -> list[dict[str, str]]:
        return await asyncio.to_thread(self.sync.gpu_query, fields)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)
