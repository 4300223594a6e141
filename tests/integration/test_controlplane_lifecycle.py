"""The harness leaves nothing behind: stop() reaps every component, twice in a row, and a SIGKILLed
test process takes its children with it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from capi_gpu_sim.controlplane import ControlPlane, Options

pytestmark = pytest.mark.integration


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


def strays(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmd and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


def test_start_stop_twice_leaves_no_process(tmp_path: Path) -> None:
    opts = Options(with_capi=False)
    for round_ in range(2):
        workdir = tmp_path / f"round{round_}"
        cp = ControlPlane(workdir, opts)
        cp.start()
        pids = cp.component_pids()
        assert set(pids) == {"kine", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}
        assert all(alive(p) for p in pids.values())
        cp.stop()
        assert not [p for p in pids.values() if alive(p)]
        assert strays(str(workdir)) == []


CHILD = """
import json, sys, time
from pathlib import Path
from capi_gpu_sim.controlplane import ControlPlane, Options
cp = ControlPlane(Path(sys.argv[1]), Options(with_capi=False, with_scheduler=False))
cp.start()
print(json.dumps(cp.component_pids()), flush=True)
time.sleep(600)
"""


def test_sigkilled_parent_leaves_no_orphans(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "cp")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = json.loads(proc.stdout.readline())
        assert all(alive(p) for p in pids.values())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(alive(p) for p in pids.values()):
        time.sleep(0.1)
    assert [name for name, p in pids.items() if alive(p)] == []
    assert strays(str(tmp_path / "cp")) == []
