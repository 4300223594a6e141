"""The released operator as a test handles it: the manager Deployment's containers under the pod runner.

A test that crashed or restarted the operator process of the checkout (``World.kill_operator`` then
``start_operator``) does the same to the release: a signal to each manager container's process, after which
the stand-in kubelet restarts the container as a kubelet does under ``restartPolicy: Always``, with its
back-off. The handle counts the restarts the test ordered, so a container that restarted by itself (a crash,
a failed liveness probe) is reported instead of waited out.
"""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from capi_gpu_sim import release
from capi_gpu_sim.pods.container import Container
from capi_gpu_sim.pods.runner import Pod, PodRunner

NAMESPACE = release.SYSTEM_NAMESPACE
CONTAINER = "manager"
SELECTOR = {"control-plane": "controller-manager"}
ARTIFACTS_VOLUME = "artifacts"  # config/manager/manager.yaml: the emptyDir at --artifacts-dir


@dataclass
class ReleaseOperator:
    runner: PodRunner
    ordered: int = 0  # restarts the test caused (kills, graceful stops)
    _pending: list[tuple[Container, int]] = field(default_factory=list)

    def pods(self) -> list[Pod]:
        """The manager pods the runner runs now."""
        pods = self.runner.running()
        return [
            p for p in pods if p.namespace == NAMESPACE and all(p.facts.labels.get(k) == v for k, v in SELECTOR.items())
        ]

    def containers(self) -> list[Container]:
        return [c for p in self.pods() for c in p.containers if c.name == CONTAINER]

    def kill(self, sig: int) -> None:
        """SIGKILL (9): the container's whole cgroup, as an OOM kill; another signal goes to the process."""
        running = [c for c in self.containers() if c.state.running]
        assert running, "no manager container is running"
        self._pending = [(c, c.state.restarts) for c in running]
        for c in running:
            if sig == signal.SIGKILL:
                c.crash()
            else:
                c.signal(sig)
        self.ordered += len(running)

    def crash_pod(self, name: str) -> None:
        """SIGKILL one pod's manager container (the leader, in the failover test)."""
        found = [c for p in self.pods() if p.name == name for c in p.containers if c.name == CONTAINER]
        assert found, f"no manager pod {name!r} runs"
        for c in found:
            c.crash()
        self.ordered += len(found)

    def restarted(self, timeout: float = 120.0) -> None:
        """Until every container ``kill`` signalled runs again (the kubelet's restart, after its back-off)."""
        deadline = time.monotonic() + timeout
        while not all(c.state.restarts > n and c.state.running for c, n in self._pending):
            if time.monotonic() > deadline:
                states = [(c.state.restarts, c.state.running, c.state.waiting_reason) for c, _ in self._pending]
                raise TimeoutError(f"the manager container did not restart within {timeout:.0f}s: {states}")
            time.sleep(0.1)
        self._pending = []

    def restarts(self) -> int:
        return sum(c.state.restarts for c in self.containers())

    def unordered_exit(self) -> str | None:
        """Why a manager container restarted without the test asking, or None."""
        extra = self.restarts() - self.ordered
        if extra <= 0:
            return None
        last = [c.state.history[-1] for c in self.containers() if c.state.history]
        return f"a manager container restarted {extra} time(s) by itself; last exits: {last}"

    def artifacts_dirs(self) -> list[Path]:
        """Each manager pod's Ansible artifacts (its emptyDir volume, gone with the pod)."""
        return [p.volume_dir(ARTIFACTS_VOLUME) for p in self.pods()]
