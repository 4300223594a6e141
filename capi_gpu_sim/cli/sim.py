"""`capi-gpu sim up|down`: the simulated Hetzner (Robot API + GEX131 fleet) in the foreground, and its teardown.

Why a foreground process: everything the simulation creates (network namespaces, systemd trees in
them, cgroups) belongs to the process that made it; ``sim up`` holds the fleet's slot lock for its life
and removes everything on SIGINT/SIGTERM. If it is killed harder than that, ``sim down`` (or the next
``sim up``, or any test fleet) sweeps the leftovers by name (``capi_gpu_sim.hosts.registry``).

``sim up`` prints one JSON document on stdout: the Robot URL and credentials, and per host its server
number, address and netns; then it waits. It needs root (namespaces, cgroups, mounts).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from capi_gpu.cli import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from capi_gpu_sim.hosts import names, registry

DOWN_WAIT_S = 30.0
BOOT_WAIT_S = 60.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sim", help="simulated Hetzner: Robot API simulator + GEX131 hosts (needs root)")
    sim_sub = p.add_subparsers(dest="sim_command", required=True)
    up = sim_sub.add_parser("up", help="start Robot and N hosts; stay in the foreground until SIGINT/SIGTERM")
    up.add_argument("--hosts", type=int, default=1)
    up.add_argument("--state-dir", type=Path, default=names.DEFAULT_STATE_ROOT)
    up.add_argument("--compression", type=float, default=60.0, help="sim seconds per real second (Robot clock)")
    up.add_argument("--reset-seconds", type=float, default=330.0, help="simulated seconds dark after a reset")
    up.add_argument("--gpu-device-id", default="2bb5", help="PCI device id of the RTX PRO 6000 (hex)")
    up.add_argument("--first-server-number", type=int, default=2_000_001)
    up.set_defaults(func=run_up)
    down = sim_sub.add_parser("down", help="stop a running `sim up` and remove every leftover of dead fleets")
    down.add_argument("--state-dir", type=Path, default=names.DEFAULT_STATE_ROOT)
    down.set_defaults(func=run_down)


def _require_root() -> bool:
    if os.geteuid() != 0:
        print("capi-gpu sim: needs root (network namespaces, cgroups, mounts)", file=sys.stderr)
        return False
    return True


def run_up(args: argparse.Namespace) -> int:
    if not _require_root():
        return EXIT_USAGE
    if not 1 <= args.hosts <= names.MAX_HOSTS:
        print(f"--hosts must be 1..{names.MAX_HOSTS}", file=sys.stderr)
        return EXIT_USAGE
    from capi_gpu_sim.fleet import Fleet, FleetConfig
    from capi_gpu_sim.hosts.host import HostConfig
    from capi_gpu_sim.robot import RobotSim

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    args.state_dir.mkdir(parents=True, exist_ok=True)
    config = FleetConfig(
        hosts=args.hosts,
        state_root=args.state_dir,
        gpu_device_id=args.gpu_device_id,
        first_server_number=args.first_server_number,
        host=HostConfig(reset_seconds=args.reset_seconds),
    )
    with RobotSim(compression=args.compression) as robot, Fleet(config, robot=robot) as fleet:
        for host in fleet.hosts.values():
            host.wait_up(BOOT_WAIT_S)  # the previous OS; a host that stays dark is reported as such
        pidfile = args.state_dir / f"sim-up-{fleet.slot}.json"
        doc = {
            "pid": os.getpid(),
            "slot": fleet.slot,
            "state_dir": str(fleet.state_dir),
            "robot": {"url": robot.url, "username": robot.username, "password": robot.password},
            "hosts": fleet.describe(),
        }
        pidfile.write_text(json.dumps({"pid": os.getpid(), "slot": fleet.slot}))
        print(json.dumps(doc, indent=2), flush=True)
        try:
            while not stop.wait(0.5):
                pass
        finally:
            pidfile.unlink(missing_ok=True)
    return EXIT_OK


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_owner(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + DOWN_WAIT_S
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_down(args: argparse.Namespace) -> int:
    if not _require_root():
        return EXIT_USAGE
    for pidfile in sorted(args.state_dir.glob("sim-up-*.json")) if args.state_dir.is_dir() else []:
        try:
            info = json.loads(pidfile.read_text())
        except (OSError, ValueError):
            continue
        pid, slot = int(info.get("pid", 0)), int(info.get("slot", 0))
        if pid and slot and registry.slot_alive(slot) and registry.owner_pid(slot) == pid:
            _stop_owner(pid)
        pidfile.unlink(missing_ok=True)
    report = registry.cleanup_stale()
    deadline = time.monotonic() + DOWN_WAIT_S
    while any((left := registry.leftovers()).values()) and time.monotonic() < deadline:
        time.sleep(0.2)  # processes of a dying namespace take a moment to disappear
        registry.cleanup_stale()
    print(
        json.dumps(
            {
                "removed": {
                    "slots": report.slots,
                    "netns": report.netns,
                    "links": report.links,
                    "cgroups": report.cgroups,
                    "killed": report.killed,
                    "dirs": report.dirs,
                },
                "remaining": left,
            },
            indent=2,
        )
    )
    return EXIT_OK if not any(left.values()) else EXIT_FAILED
