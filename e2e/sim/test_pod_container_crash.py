"""A crash of a pod runner container (``Container.crash``, a test's ``kill -9``) costs exactly one restart.

``cgroups.kill`` loops until the cgroup is empty; the kubelet's first back-off is 0, so the restarted process
used to join the cgroup while the crash was still emptying it and was killed too. The manager container then
showed two restarts for one kill, and CI's 401 fault test blamed the operator for "a restart by itself"."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from capi_gpu_sim.hosts import cgroups
from capi_gpu_sim.pods import container
from capi_gpu_sim.pods.container import Container, Launch

CRASHES = 8


def test_each_crash_is_one_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_kill = cgroups.kill

    def slow_kill(path: Path, wait_s: float = cgroups.KILL_WAIT_S) -> bool:
        """As on a loaded machine: the crash's kill loop is still running when the restart would happen
        (the old process dying slowly); its next pass kills whatever is in the cgroup then."""
        done = real_kill(path, wait_s)
        if threading.current_thread().name != "container-manager":  # the crash, not the container's own kills
            time.sleep(0.5)
            done = real_kill(path, wait_s)
        return done

    monkeypatch.setattr(container.cgroups, "kill", slow_kill)
    launch = Launch(
        argv=["/bin/sleep", "600"],
        env={"PATH": "/usr/bin:/bin"},
        binds=[],
        cwd=Path("/"),
        log_path=tmp_path / "log",
        cgroup="f0-test-crash",
    )
    # Back-off /1000: the kubelet's CrashLoopBackOff (10 s, doubling) would otherwise pace the crashes.
    c = Container("manager", "127.0.0.1", lambda: launch, None, None, None, 1.0, lambda: None, backoff_scale=0.001)
    c.start()

    def running_after(restarts: int) -> None:
        deadline = time.monotonic() + 30
        while not (c.state.running and c.state.restarts >= restarts and c.pid is not None):
            assert time.monotonic() < deadline, (c.state.restarts, c.state.running, c.state.history)
            time.sleep(0.02)

    try:
        running_after(0)
        for n in range(1, CRASHES + 1):
            c.crash()
            running_after(n)
            assert c.state.restarts == n, c.state.history
    finally:
        c.stop(1.0)
        cgroups.destroy(launch.cgroup)
    assert [h.split()[2:] for h in c.state.history[:CRASHES]] == [["-9", "exited"]] * CRASHES
