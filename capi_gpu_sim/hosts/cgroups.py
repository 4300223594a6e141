"""One cgroup (v2) per simulated host: the handle that kills a boot completely, whatever runs in it.

Why cgroups and not process trees: a booted host runs systemd as PID 1 of its own PID namespace, and
systemd forks services that reparent to it; after the test process dies they would reparent to the
machine's init. Every process of a host's boot lives in ``<cgroup2>/capigpu/<f>-<h>/``, so
``cgroup.kill`` ends all of them at once, and the stale sweep finds leftovers by directory name.

Works on a pure v2 machine (``/sys/fs/cgroup``) and on a hybrid one (``/sys/fs/cgroup/unified``).
systemd inside the host creates sub-cgroups (init.scope, system.slice/...): removal is depth-first.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from capi_gpu_sim.hosts import names

KILL_WAIT_S = 10.0


def cgroup2_root() -> Path:
    with open("/proc/self/mounts") as fh:
        for line in fh:
            fields = line.split()
            if fields[2] == "cgroup2":
                return Path(fields[1])
    raise RuntimeError("no cgroup2 hierarchy mounted (need /sys/fs/cgroup or /sys/fs/cgroup/unified)")


def base() -> Path:
    return cgroup2_root() / names.PREFIX


def path_for(name: str) -> Path:
    return base() / name


def ensure(name: str) -> Path:
    path = path_for(name)
    path.mkdir(parents=True, exist_ok=True)
    return path


def pids(path: Path) -> list[int]:
    """Every process in ``path`` and below."""
    found: list[int] = []
    if not path.is_dir():
        return found
    for dirpath, _dirs, files in os.walk(path):
        if "cgroup.procs" in files:
            try:
                text = Path(dirpath, "cgroup.procs").read_text()
            except OSError:
                continue
            found.extend(int(x) for x in text.split())
    return found


def kill(path: Path, wait_s: float = KILL_WAIT_S) -> bool:
    """SIGKILL everything in the cgroup; True once it is empty (bounded wait)."""
    if not path.is_dir():
        return True
    killer = path / "cgroup.kill"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not pids(path):
            return True
        if killer.exists():
            with contextlib.suppress(OSError):
                killer.write_text("1")
        else:
            for pid in pids(path):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
        time.sleep(0.05)
    return not pids(path)


def remove(path: Path) -> bool:
    """rmdir the cgroup and its children, deepest first; True when gone."""
    if not path.is_dir():
        return True
    for dirpath, _dirs, _files in sorted(os.walk(path), key=lambda t: len(t[0]), reverse=True):
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
    return not path.exists()


def destroy(name: str) -> bool:
    path = path_for(name)
    return kill(path) and remove(path)


def list_ours() -> list[str]:
    b = base()
    return sorted(p.name for p in b.iterdir() if p.is_dir()) if b.is_dir() else []
