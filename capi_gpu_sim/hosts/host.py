"""One simulated GEX131: power, boot targets and faults, driven by a supervisor thread.

Why a supervisor per host: a real server changes state on its own (it comes back from a reset minutes
later, reboots itself when a playbook says so, stays dark after a power-off), and callers (the Robot
simulator's reset, a test) must not block on it. The supervisor owns the running boot process; callers
post commands and wait, bounded, on conditions (``wait_up``, ``wait_state``).

Power model (Robot reset types, hetzner.md §1.3): ``sw`` = graceful reboot, ``hw``/``man`` = hard reset;
either way the host is down for ``reset_seconds`` simulated seconds, then boots the target Robot chose.
``power`` = power button (graceful off when on, on when off), ``power_long`` = hard off. A reboot from
inside the guest (exit 129) boots whatever ``resolver`` says Robot would boot now (rescue if armed).
A blank disk boots nothing. Faults: ``never_boot_again``, ``drop_ssh()``, ``set_gpu_on_bus(False)``,
``set_smart()``.
"""

from __future__ import annotations

import logging
import queue
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import assert_never

from capi_gpu_sim.hosts import boot, cgroups, guest, hardware, names, netns, procfs, targets, views
from capi_gpu_sim.hosts.targets import Running, State

__all__ = ["BootRecord", "Host", "HostConfig", "Resolver", "Running", "State"]

log = logging.getLogger(__name__)

Resolver = Callable[["Host"], targets.BootTarget]
TICK_S = 0.02


@dataclass
class HostConfig:
    reset_seconds: float = 330.0  # simulated seconds dark after a reset (~5.5 min on bare metal)
    reboot_seconds: float = 120.0  # simulated seconds for an in-guest reboot
    time_scale: float = 0.005  # real seconds per simulated second
    previous_os: bool = True
    previous_hostname: str = "Ubuntu-2204-jammy-amd64-base"


@dataclass
class BootRecord:
    count: int
    running: Running
    boot_id: str
    started: float
    up_after_s: float | None = None
    exit_status: int | None = None


@dataclass(frozen=True)
class _Reset:
    kind: str
    target: targets.BootTarget


@dataclass(frozen=True)
class _PowerOn:
    delay_s: float
    target: targets.BootTarget


@dataclass(frozen=True)
class _PowerOff:
    hard: bool


@dataclass(frozen=True)
class _Close:
    pass


_Command = _Reset | _PowerOn | _PowerOff | _Close


@dataclass
class Host(guest.GuestSide):
    hn: names.HostNames
    server_number: int
    state_dir: Path
    base: Path
    layers: tuple[Path, Path]
    inner: Path
    hw: hardware.Hardware
    resolver: Resolver
    config: HostConfig = field(default_factory=HostConfig)
    never_boot_again: bool = False
    # Read-only (test-machine path, guest path) binds into every boot of the disk (the local apt repo).
    disk_binds: tuple[tuple[Path, str], ...] = ()
    # Read-only binds into every rescue boot (the fleet's node images).
    rescue_binds: tuple[tuple[Path, str], ...] = ()
    # Files every rescue boot writes (guest path -> content): the image server's name and CA.
    rescue_files: dict[str, bytes] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Condition()
        self._cmds: queue.Queue[_Command] = queue.Queue()
        self._proc: subprocess.Popen[bytes] | None = None
        self._mode = boot.Mode.RESCUE
        self._state = State.OFF
        self._pending: tuple[float, targets.BootTarget] | None = None
        self.boots: list[BootRecord] = []
        self._thread: threading.Thread | None = None
        self._closing = False

    # -- layout ---------------------------------------------------------------------------------
    def create(self) -> None:
        """Network, directories, hardware description, the previous OS; starts the supervisor."""
        for d in (self.disk_dir, self.state_dir / "rescue", self.state_dir / "boots", self.state_dir / "mnt"):
            d.mkdir(parents=True, exist_ok=True)
        hardware.write(self.hw_dir, self.hw)
        self._write_firmware()
        if self.config.previous_os:
            views.install_previous_os(self.disk_dir, self.hw, self.config.previous_hostname)
        else:
            views.wipe_disk(self.disk_dir)
        netns.create(self.hn)
        self._thread = threading.Thread(target=self._run, name=f"host-{self.name}", daemon=True)
        self._thread.start()

    # -- commands -------------------------------------------------------------------------------
    def reset(self, kind: str, target: targets.BootTarget) -> None:
        self._cmds.put(_Reset(kind, target))

    def power_on(self, target: targets.BootTarget, delay_s: float = 0.0) -> None:
        self._cmds.put(_PowerOn(delay_s, target))

    def power_off(self, hard: bool = True) -> None:
        self._cmds.put(_PowerOff(hard))

    def destroy(self) -> None:
        """Stop the supervisor and the boot, remove the cgroup and the network (not the state dir)."""
        self._cmds.put(_Close())
        if self._thread is not None:
            self._thread.join(timeout=boot.STOP_GRACE_S * 3)
        self._stop_boot(graceful=False)
        cgroups.destroy(self.hn.cgroup_name)
        netns.delete(self.hn)

    # -- observation ----------------------------------------------------------------------------
    @property
    def state(self) -> State:
        with self._lock:
            return self._state

    @property
    def running(self) -> Running:
        with self._lock:
            return (
                self.boots[-1].running if self.boots and self._state in (State.BOOTING, State.UP) else Running.NOTHING
            )

    @property
    def boot_id(self) -> str | None:
        with self._lock:
            return self.boots[-1].boot_id if self.boots and self._state is State.UP else None

    def init_pid(self) -> int | None:
        proc = self._proc
        return boot.guest_init_pid(proc) if proc is not None and proc.poll() is None else None

    def wait_state(self, want: State, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._state is not want:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
            return True

    def wait_up(self, timeout: float = 60.0, after_boot: int = 0) -> bool:
        """Wait until sshd answers in boot number ``> after_boot`` (0: any boot)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while not (self._state is State.UP and self.boots and self.boots[-1].count > after_boot):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(min(left, 0.5))
            return True

    def boot_count(self) -> int:
        with self._lock:
            return self.boots[-1].count if self.boots else 0

    # -- supervisor -----------------------------------------------------------------------------
    def _set(self, state: State) -> None:
        with self._lock:
            self._state = state
            self._lock.notify_all()

    def _sim(self, seconds: float) -> float:
        return seconds * self.config.time_scale

    def _run(self) -> None:
        while not self._closing:
            try:
                self._handle(self._cmds.get(timeout=TICK_S))
            except queue.Empty:
                pass
            except Exception:
                log.exception("host %s: command failed", self.name)
            try:
                self._tick()
            except Exception:
                log.exception("host %s: supervisor tick failed", self.name)
                self._stop_boot(graceful=False)
                self._set(State.OFF)

    def _handle(self, cmd: _Command) -> None:
        match cmd:
            case _Close():
                self._closing = True
                self._pending = None
            case _Reset(kind=kind, target=target):
                self._reset(kind, target)
            case _PowerOn(delay_s=delay, target=target):
                if self._proc is None:
                    self._schedule(delay, target)
            case _PowerOff(hard=hard):
                self._pending = None
                self._stop_boot(graceful=not hard)
                self._set(State.OFF)
            case _:
                assert_never(cmd)

    def _reset(self, kind: str, target: targets.BootTarget) -> None:
        was_on = self._proc is not None or self._pending is not None
        if kind == "power" and not was_on:
            self._schedule(self._sim(self.config.reset_seconds), target)
            return
        self._pending = None
        self._stop_boot(graceful=kind in ("sw", "power"))
        if kind in ("power", "power_long"):
            self._set(State.OFF)
            return
        self._set(State.DOWN)
        self._schedule(self._sim(self.config.reset_seconds), target)

    def _schedule(self, delay_s: float, target: targets.BootTarget) -> None:
        if self.never_boot_again:
            self._set(State.DOWN)
            return
        self._pending = (time.monotonic() + delay_s, target)
        self._set(State.DOWN)

    def _tick(self) -> None:
        proc = self._proc
        if proc is not None:
            rc = proc.poll()
            if rc is not None:
                self._boot_ended(boot.exit_status(rc))
            elif self._state is State.BOOTING and self._port_open():
                with self._lock:
                    rec = self.boots[-1]
                    rec.up_after_s = time.monotonic() - rec.started
                self._set(State.UP)
        if self._pending is not None and self._proc is None and time.monotonic() >= self._pending[0]:
            _, target = self._pending
            self._pending = None
            self._boot(target)

    def _boot_ended(self, rc: int) -> None:
        with self._lock:
            self.boots[-1].exit_status = rc
        self._proc = None
        cgroups.destroy(self.hn.cgroup_name)
        if rc == boot.EXIT_REBOOT:
            self._schedule(self._sim(self.config.reboot_seconds), self.resolver(self))
        else:
            log.info("host %s: boot ended with status %s; staying off", self.name, rc)
            self._set(State.OFF)

    def _port_open(self) -> bool:
        try:
            with socket.create_connection((self.guest_ip, 22), timeout=0.05):
                return True
        except OSError:
            return False

    def _boot(self, target: targets.BootTarget) -> None:
        count = (self.boots[-1].count if self.boots else 0) + 1
        boot_dir = self.state_dir / "boots" / str(count)
        boot_dir.mkdir(parents=True, exist_ok=True)
        (boot_dir / "disks").write_text(hardware.disk_lines(self.hw))
        boot_id = boot.new_boot_id(boot_dir)
        hw_binds = procfs.write(boot_dir, self.hw)
        rescue_layer, image_layer = self.layers
        if isinstance(target, targets.RescueBoot):
            upper, work = self.state_dir / "rescue" / "upper", self.state_dir / "rescue" / "work"
            views.prepare_rescue(upper, work, boot_dir, target, self.rescue_files)
            plan = boot.BootPlan(
                boot.Mode.RESCUE,
                self.hn.netns,
                self.hn.cgroup_name,
                self.state_dir / "mnt",
                f"{rescue_layer}:{self.base}",
                upper,
                work,
                boot_dir,
                self.hw_dir,
                disk_dir=self.disk_dir,
                base=self.base,
                image_layer=image_layer,
                ro_binds=hw_binds + self.rescue_binds,
                uefi=self.hw.uefi,
            )
            running = Running.RESCUE
        else:
            info = views.installed(self.disk_dir)
            if info is None:
                log.info("host %s: blank disk, nothing to boot", self.name)
                self._set(State.OFF)
                return
            plan = boot.BootPlan(
                boot.Mode.SYSTEMD,
                self.hn.netns,
                self.hn.cgroup_name,
                self.state_dir / "mnt",
                f"{self.firmware_dir}:{image_layer}:{self.base}",
                self.disk_dir / "upper",
                self.disk_dir / "work",
                boot_dir,
                self.hw_dir,
                ro_binds=hw_binds + self.disk_binds,
            )
            running = Running.PREVIOUS if info.get("previous") else Running.INSTALLED
        self._mode = plan.mode
        self._proc = boot.launch(plan, self.inner)
        with self._lock:
            self.boots.append(BootRecord(count, running, boot_id, time.monotonic()))
        self._set(State.BOOTING)

    def _stop_boot(self, graceful: bool) -> None:
        proc = self._proc
        if proc is None:
            return
        rc = boot.stop(proc, self._mode, self.hn.cgroup_name, graceful)
        with self._lock:
            if self.boots:
                self.boots[-1].exit_status = rc
        self._proc = None
