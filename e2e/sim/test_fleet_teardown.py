"""Teardown is guaranteed: after `capi-gpu sim up` is SIGKILLed, `sim down` leaves no netns, veth, mount,
process or cgroup of ours; a normal close leaves nothing either; a live fleet is never swept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from capi_gpu_sim.fleet import Fleet, FleetConfig
from capi_gpu_sim.hosts import registry

UP_TIMEOUT_S = 120.0


def _wait_json(proc: subprocess.Popen[str]) -> dict[str, object]:
    assert proc.stdout is not None
    buf = ""
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"sim up exited early: {proc.wait(5)}")
        buf += line
        if line.startswith("}"):
            doc: dict[str, object] = json.loads(buf)
            return doc
    raise AssertionError("sim up printed nothing")


def _nothing_left(slot: int) -> dict[str, list[str]]:
    return {k: v for k, v in registry.leftovers(slot).items() if v}


def _guests_running(slot: int, launcher_group: int) -> bool:
    """Both hosts' namespaces hold a process outside the launcher's process group (a booted guest)."""

    def outside(pid: int) -> bool:
        try:
            return os.getpgid(pid) != launcher_group
        except ProcessLookupError:
            return False

    nss = registry.leftovers(slot)["netns"]
    return len(nss) == 2 and all(any(outside(p) for p in registry.pids_in_netns(n)) for n in nss)


def test_sigkilled_sim_up_is_swept_by_sim_down(tmp_path: Path) -> None:
    cli = [sys.executable, "-c", "import sys; from capi_gpu.cli import main; sys.exit(main())"]
    proc = subprocess.Popen(
        [*cli, "sim", "up", "--hosts", "2", "--state-dir", str(tmp_path), "--compression", "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        doc = _wait_json(proc)
        slot = int(str(doc["slot"]))
        # Kill only once each guest runs in its own session: a host caught mid-boot has nothing but the
        # launcher's own children in its namespace, and those die with `sim up` (CI under load saw that).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not _guests_running(slot, proc.pid):
            time.sleep(0.2)
        alive = registry.leftovers(slot)
        assert len(alive["netns"]) == 2 and len(alive["links"]) == 2 and _guests_running(slot, proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.5)
        orphans = registry.leftovers(slot)
        assert orphans["netns"] and orphans["processes"], "SIGKILL should have left the guests running"
        down = subprocess.run(
            [*cli, "sim", "down", "--state-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert down.returncode == 0, down.stdout + down.stderr
        assert _nothing_left(slot) == {}
        assert not Path(str(doc["state_dir"])).exists()
        assert not registry.slot_alive(slot)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        registry.cleanup_stale()


def test_close_removes_everything_and_a_live_fleet_is_never_swept(tmp_path: Path) -> None:
    with Fleet(FleetConfig(hosts=1, state_root=tmp_path)) as fleet:
        assert fleet.host().wait_up(60)
        report = registry.cleanup_stale()
        assert fleet.slot not in report.slots
        assert fleet.host().state.value == "up"
        slot, state_dir = fleet.slot, fleet.state_dir
    assert _nothing_left(slot) == {}
    assert not state_dir.exists()
