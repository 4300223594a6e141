"""The release's operator handle: a test's kill reaches the manager containers only, the restart it waits for
is the kubelet's, and a restart nobody ordered is reported with the container's last exits."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from capi_gpu_sim.operator_pods import NAMESPACE, ReleaseOperator


@dataclass
class FakeContainer:
    name: str
    state: Any = field(default_factory=lambda: SimpleNamespace(running=True, restarts=0, waiting_reason="", history=[]))
    got: list[str] = field(default_factory=list)

    def crash(self) -> None:
        self.got.append("crash")

    def signal(self, sig: int) -> None:
        self.got.append(f"signal {sig}")

    def restart(self, why: str) -> None:  # what the runner's container loop does after an exit
        self.state.restarts += 1
        self.state.history.append(why)


def _pod(name: str, namespace: str, labels: dict[str, str], containers: list[FakeContainer]) -> Any:
    return SimpleNamespace(
        name=name,
        namespace=namespace,
        facts=SimpleNamespace(labels=labels),
        containers=containers,
        volume_dir=lambda v: Path("/run/capigpu-pods/x") / name / v,
    )


@pytest.fixture
def world() -> tuple[ReleaseOperator, FakeContainer, FakeContainer, FakeContainer]:
    manager, sidecar, other = FakeContainer("manager"), FakeContainer("kube-rbac-proxy"), FakeContainer("manager")
    pods = {
        "a": _pod("mgr-1", NAMESPACE, {"control-plane": "controller-manager"}, [manager, sidecar]),
        "b": _pod("cert-manager-1", "cert-manager", {"app": "cert-manager"}, [other]),
    }
    runner = SimpleNamespace(running=lambda: list(pods.values()))
    return ReleaseOperator(runner), manager, sidecar, other  # type: ignore[arg-type]


def test_a_kill_reaches_the_manager_container_only_and_start_waits_for_its_restart(world: Any) -> None:
    op, manager, sidecar, other = world
    op.kill(signal.SIGKILL)
    assert (manager.got, sidecar.got, other.got) == (["crash"], [], [])
    with pytest.raises(TimeoutError, match="did not restart"):
        op.restarted(timeout=0.2)
    manager.restart("exit -9 exited")
    op.restarted(timeout=1)
    op.kill(signal.SIGTERM)
    assert manager.got == ["crash", "signal 15"]
    assert op.unordered_exit() is None and op.ordered == 2


def test_a_restart_nobody_ordered_is_reported_with_the_last_exits(world: Any) -> None:
    op, manager, _, other = world
    other.restart("cert-manager's own business")
    assert op.unordered_exit() is None
    manager.restart("exit 1 liveness probe failed")
    found = op.unordered_exit()
    assert found is not None and "1 time(s)" in found and "liveness probe failed" in found
    op.crash_pod("mgr-1")
    manager.restart("exit -9 exited")
    assert "1 time(s)" in (op.unordered_exit() or "")  # the ordered crash is not counted against it
    with pytest.raises(AssertionError, match="no manager pod"):
        op.crash_pod("cert-manager-1")


def test_artifacts_are_each_manager_pods_volume(world: Any) -> None:
    op = world[0]
    assert op.artifacts_dirs() == [Path("/run/capigpu-pods/x/mgr-1/artifacts")]
