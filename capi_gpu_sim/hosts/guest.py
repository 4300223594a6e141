"""The test machine's side of a simulated host: its files, commands inside it, and hardware faults.

Why a mixin of its own: ``host`` is about power and boots (a supervisor thread and its state);
tests, the simulated kubelet and the DRA publisher also need to look *into* a running guest (through
``/proc/<pid 1>/root``, or the disk's upper dir when it is down), run a command in its namespaces, and
flip hardware knobs. Those need only a few facts of the host (its names, its guest PID 1, what runs).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path
from typing import Any

from capi_gpu_sim.hosts import cgroups, hardware, names
from capi_gpu_sim.hosts.targets import Running


class GuestSide:
    """Mixed into ``Host``; relies on the attributes and methods declared here."""

    hn: names.HostNames
    server_number: int
    state_dir: Path
    hw: hardware.Hardware

    def init_pid(self) -> int | None:
        raise NotImplementedError

    @property
    def running(self) -> Running:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.hn.key

    @property
    def guest_ip(self) -> str:
        return self.hn.guest_ip

    @property
    def disk_dir(self) -> Path:
        return self.state_dir / "disk"

    @property
    def hw_dir(self) -> Path:
        return self.state_dir / "hw"

    @property
    def firmware_dir(self) -> Path:
        """A per-host lower layer under the installed OS: the GPU shim's identity of this host's GPU."""
        return self.state_dir / "firmware"

    def _write_firmware(self, lost: bool = False) -> None:
        path = self.firmware_dir / "var" / "lib" / "gpu-shim" / "config.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(hardware.gpu_shim_config(self.hw, self.server_number, lost), indent=1))

    def guest_path(self, path: str) -> Path:
        """Where a guest path is visible from the test machine now (live root, else the disk's upper)."""
        pid = self.init_pid()
        if pid is not None:
            return Path(f"/proc/{pid}/root") / path.lstrip("/")
        return self.disk_dir / "upper" / path.lstrip("/")

    def read_file(self, path: str) -> bytes | None:
        try:
            return self.guest_path(path).read_bytes()
        except OSError:
            return None

    def exec(
        self, argv: list[str], timeout: float = 30.0, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """Run a command inside the running guest (all its namespaces, its root)."""
        pid = self.init_pid()
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        cmd = [
            "nsenter",
            "-t",
            str(pid),
            "-m",
            "-u",
            "-i",
            "-n",
            "-p",
            "-r",
            "-w",
            "--",
            "/usr/bin/env",
            "-i",
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME=/root",
            *argv,
        ]
        return subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout, check=False)

    def rss_bytes(self) -> int:
        total = 0
        for pid in cgroups.pids(cgroups.path_for(self.hn.cgroup_name)):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total

    # -- faults ---------------------------------------------------------------------------------
    def drop_ssh(self, listener: bool = False) -> int:
        """Kill sshd session processes (and the listener too if asked); returns how many."""
        killed = 0
        for pid in cgroups.pids(cgroups.path_for(self.hn.cgroup_name)):
            try:
                comm = Path(f"/proc/{pid}/comm").read_text().strip()
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if comm != "sshd" or ("[listener]" in cmdline and not listener):
                continue
            subprocess.run(["kill", "-9", str(pid)], check=False, timeout=5)
            killed += 1
        return killed

    def set_hardware(self, hw: hardware.Hardware) -> None:
        self.hw = hw
        hardware.write(self.hw_dir, hw)

    def gpu_fall_off_bus(self, until_reboot: bool = True) -> None:
        """The GPU drops off the bus: nvidia-smi says "GPU is lost", lspci shows ``rev ff``. Until the next
        reboot (the GPU shim's ``/run/gpu-shim/lost``), or for good (hardware + shim ``lost`` knob)."""
        if until_reboot:
            marker = self.guest_path("/run/gpu-shim/lost")
            if self.init_pid() is None:
                raise RuntimeError(f"{self.name}: not running; a fault until reboot needs a running OS")
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text("lost\n")
            return
        self.set_hardware(dataclasses.replace(self.hw, gpu_on_bus=False))
        self._set_shim_lost(True)

    def gpu_back_on_bus(self) -> None:
        self.set_hardware(dataclasses.replace(self.hw, gpu_on_bus=True))
        self._set_shim_lost(False)
        if self.init_pid() is not None:
            self.guest_path("/run/gpu-shim/lost").unlink(missing_ok=True)

    def _set_shim_lost(self, lost: bool) -> None:
        self._write_firmware(lost)
        if self.init_pid() is not None and self.running is not Running.RESCUE:
            live = self.guest_path("/var/lib/gpu-shim/config.json")
            live.parent.mkdir(parents=True, exist_ok=True)
            live.write_text(json.dumps(hardware.gpu_shim_config(self.hw, self.server_number, lost), indent=1))

    def set_gpu_shim(self, **knobs: Any) -> None:
        """Set GPU shim knobs (``driver_version="550.163.01"``, ``mig_toggle="reboot"``...) for good: in the
        firmware layer every OS boot sees and in the running OS. ``None`` removes a knob."""
        merged = {k: v for k, v in {**self.hw.gpu_shim, **knobs}.items() if v is not None}
        self.set_hardware(dataclasses.replace(self.hw, gpu_shim=merged))
        self._set_shim_lost(not self.hw.gpu_on_bus)

    def installimage_runs(self) -> list[dict[str, Any]]:
        """installimage's runs on this host's disks, as the shim recorded them (``event`` start/end, ``rc``)."""
        try:
            text = (self.disk_dir / "installimage-runs.jsonl").read_text()
        except OSError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def set_smart(self, disk: str, healthy: bool) -> None:
        self.set_hardware(self.hw.with_smart(disk, "PASSED" if healthy else "FAILED"))
