"""Who owns which fleet slot, and how to remove everything a dead owner left behind.

Why: a test that fails, a SIGKILLed ``capi-gpu sim up`` or a crashed CI job must not leave network
namespaces, veths, running systemd trees or cgroups on the machine; the next run would collide with
them, and the machine's state would drift. So every fleet holds an exclusive ``flock`` on
``/run/capi-gpu-sim/fleet-<n>.lock`` for its whole life (released by the kernel when the process dies,
however it dies) and records what it made in ``fleet-<n>.json``. ``cleanup_stale()`` removes, for every
slot whose lock is free, everything carrying that slot's name (netns, veth, cgroup, processes inside
those namespaces, the recorded state directory). It is idempotent and safe to run at any time: a slot
whose owner is alive is never touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from capi_gpu_sim.hosts import cgroups, names, netns

MARKER = ".capi-gpu-sim"
KILL_WAIT_S = 15.0


def _run_dir() -> Path:
    names.RUN_DIR.mkdir(parents=True, exist_ok=True)
    return names.RUN_DIR


def lock_path(slot: int) -> Path:
    return _run_dir() / f"fleet-{slot}.lock"


def record_path(slot: int) -> Path:
    return _run_dir() / f"fleet-{slot}.json"


class SlotLease:
    """An exclusive claim on one fleet slot for the life of this object (or of the process)."""

    def __init__(self, slot: int, fd: int) -> None:
        self.slot = slot
        self._fd = fd

    @classmethod
    def acquire(cls, preferred: int | None = None) -> SlotLease:
        candidates = [preferred] if preferred else range(1, names.MAX_SLOT + 1)
        for slot in candidates:
            fd = os.open(lock_path(slot), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            return cls(slot, fd)
        raise RuntimeError("no free fleet slot (all held by running fleets)")

    def write(self, record: dict[str, object]) -> None:
        path = record_path(self.slot)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**record, "pid": os.getpid(), "slot": self.slot}, indent=1))
        tmp.replace(path)

    def release(self) -> None:
        if self._fd >= 0:
            record_path(self.slot).unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = -1


def slot_alive(slot: int) -> bool:
    path = lock_path(slot)
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops our lock if we got it
    return False


def owner_pid(slot: int) -> int | None:
    try:
        return int(json.loads(record_path(slot).read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


@dataclass
class CleanupReport:
    slots: list[int] = field(default_factory=list)
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    dirs: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.netns or self.links or self.cgroups or self.killed or self.dirs)


def pids_in_netns(name: str) -> list[int]:
    inode = netns.netns_inode(name)
    if inode is None:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if (entry / "ns" / "net").stat().st_ino == inode:
                found.append(int(entry.name))
    return found


def _kill(pids: list[int], report: CleanupReport) -> None:
    me = os.getpid()
    for pid in pids:
        if pid == me:
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            report.killed.append(pid)


def stale_slots() -> set[int]:
    found: set[int] = set()
    for name in netns.list_netns():
        if (slot := names.slot_of_netns(name)) is not None:
            found.add(slot)
    for link in netns.list_links():
        if (slot := names.slot_of_link(link)) is not None:
            found.add(slot)
    for cg in cgroups.list_ours():
        if (slot := names.slot_of_cgroup(cg)) is not None:
            found.add(slot)
    for path in _run_dir().glob("fleet-*.json"):
        head = path.stem.removeprefix("fleet-")
        if head.isdigit():
            found.add(int(head))
    return {s for s in found if not slot_alive(s)}


def cleanup_slot(slot: int, report: CleanupReport | None = None) -> CleanupReport:
    """Remove everything of ``slot``; the caller makes sure its owner is dead (or is the owner)."""
    report = report or CleanupReport()
    report.slots.append(slot)
    for cg in [c for c in cgroups.list_ours() if names.slot_of_cgroup(c) == slot]:
        cgroups.destroy(cg)
        report.cgroups.append(cg)
    for ns in [n for n in netns.list_netns() if names.slot_of_netns(n) == slot]:
        # A dying PID namespace takes a moment (1-2 s) to let go of its processes: kill until none is left.
        deadline = time.monotonic() + KILL_WAIT_S
        while (pids := pids_in_netns(ns)) and time.monotonic() < deadline:
            _kill(pids, report)
            time.sleep(0.1)
        netns.delete_by_name(ns, None)
        report.netns.append(ns)
    for link in [x for x in netns.list_links() if names.slot_of_link(x) == slot]:
        netns.delete_by_name(None, link)
        report.links.append(link)
    try:
        state_dir = json.loads(record_path(slot).read_text()).get("state_dir")
    except (OSError, ValueError):
        state_dir = None
    if state_dir:
        remove_state_dir(Path(state_dir), report)
    record_path(slot).unlink(missing_ok=True)
    return report


def remove_state_dir(path: Path, report: CleanupReport | None = None) -> None:
    """Delete a fleet state directory, but only one we marked as ours; unmount anything left in it."""
    if not (path / MARKER).exists():
        return
    prefix = str(path.resolve())
    with open("/proc/self/mounts") as fh:
        points = [ln.split()[1] for ln in fh if ln.split()[1].startswith(prefix + "/")]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, timeout=30, capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
    if report is not None:
        report.dirs.append(str(path))


def cleanup_stale() -> CleanupReport:
    """Remove the leftovers of every fleet whose owner is gone; live fleets are left alone."""
    report = CleanupReport()
    for slot in sorted(stale_slots()):
        cleanup_slot(slot, report)
    return report


def _slots_of(nss: list[str], slot: int | None) -> set[int]:
    return {slot} if slot is not None else {s for n in nss if (s := names.slot_of_netns(n)) is not None}


def leftovers(slot: int | None = None, include_live: bool = False) -> dict[str, list[str]]:
    """What of ours exists now (for tests and ``sim down``): netns, links, cgroups, processes, mounts;
    of one slot, or of every slot whose owner is dead (``include_live`` adds running fleets)."""
    live = set() if include_live or slot is not None else {s for s in range(1, names.MAX_SLOT + 1) if slot_alive(s)}

    def mine(s: int | None) -> bool:
        return s is not None and (slot is None or s == slot) and s not in live

    nss = [n for n in netns.list_netns() if mine(names.slot_of_netns(n))]
    cgs = [c for c in cgroups.list_ours() if mine(names.slot_of_cgroup(c))]
    pids = {p for n in nss for p in pids_in_netns(n)} | {p for c in cgs for p in cgroups.pids(cgroups.path_for(c))}
    with open("/proc/self/mounts") as fh:
        mounts = [ln.split()[1] for ln in fh if names.PREFIX in ln or str(names.DEFAULT_STATE_ROOT) in ln]
    return {
        "netns": nss,
        "links": [x for x in netns.list_links() if mine(names.slot_of_link(x))],
        "cgroups": cgs,
        "processes": sorted(str(p) for p in pids),
        "mounts": [m for m in mounts if any(f"-f{s}-" in m or f"/f{s}/" in m for s in _slots_of(nss, slot))],
    }
