"""The gate's feature probe: a cluster whose control plane drops the gate device's fields says so in
``GateFeaturesAvailable`` (naming kube-controller-manager for DRADeviceTaints, whose eviction runs there),
and once its gates are turned on the same operator process reports it available at the next probe, not
only after a restart; probes are ``features.RECHECK`` apart, and the phase asks to be back by then."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import yaml
from fake_kube import NS, FakeKube

from capi_gpu.api import conditions as c
from capi_gpu.api.cluster import HetznerGPUCluster
from capi_gpu.controllers import cluster_addons
from capi_gpu.readiness import features
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

T0 = datetime(2026, 12, 5, 7, 0, tzinfo=UTC)
KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "w", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "admin", "user": {"token": "t"}}],
    "contexts": [{"name": "w", "context": {"cluster": "w", "user": "admin"}}],
    "current-context": "w",
}


class WorkloadAPIServer:
    """The workload apiserver as the probe sees it: the feature gates it runs with, and the probes it got."""

    def __init__(self, off: list[str]) -> None:
        self.off, self.probes = off, 0

    async def features(self, _deps: Deps, _doc: dict[str, Any]) -> list[str]:
        self.probes += 1
        return sorted(self.off)


@pytest.fixture
def apiserver(monkeypatch: pytest.MonkeyPatch) -> WorkloadAPIServer:
    server = WorkloadAPIServer(["DRADeviceBindingConditions", "DRADeviceTaints"])
    monkeypatch.setattr(cluster_addons, "_features", server.features)
    monkeypatch.setattr(cluster_addons, "_answers", lambda _doc: True)
    return server


def _world() -> tuple[FakeKube, dict[str, Any]]:
    value = base64.b64encode(yaml.safe_dump(KUBECONFIG).encode()).decode()
    secret = {"metadata": {"name": "dev-kubeconfig"}, "data": {"value": value}}
    spec = {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}}
    hgc = {"metadata": {"name": "dev", "namespace": NS, "generation": 1}, "spec": spec}
    return FakeKube(("secrets", secret)), hgc


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def _pass(deps: Deps, obj: dict[str, Any]) -> tuple[c.Condition | None, float | None]:
    phase = await cluster_addons.reconcile(deps, HetznerGPUCluster.model_validate(obj), obj, "dev")
    obj["status"] = {"conditions": [x.wire() for x in phase.conditions]}
    return c.get(phase.conditions, c.Type.GATE_FEATURES_AVAILABLE), phase.requeue


async def test_a_cluster_fixed_later_becomes_available_without_a_restart(apiserver: WorkloadAPIServer) -> None:
    kube, obj = _world()
    settings, clock = Settings(addons=False), Clock()
    deps = Deps(kube, settings, None, RobotClients(settings), clock=clock)  # type: ignore[arg-type]
    missing, requeue = await _pass(deps, obj)
    assert missing is not None and (missing.status, missing.reason) == ("False", c.Reason.FEATURES_MISSING)
    assert "DRADeviceTaints on kube-apiserver, kube-scheduler and kube-controller-manager" in missing.message
    assert "DRADeviceBindingConditions on kube-apiserver and kube-scheduler" in missing.message
    assert requeue == features.RECHECK.total_seconds()

    apiserver.off = []  # the admin turns the gates on; the operator keeps running
    clock.now = T0 + features.RECHECK / 2
    unchanged, requeue = await _pass(deps, obj)
    assert unchanged is not None and unchanged.status == "False" and apiserver.probes == 1
    assert requeue == (features.RECHECK / 2).total_seconds()  # back when the answer expires

    clock.now = T0 + features.RECHECK
    available, _ = await _pass(deps, obj)
    assert available is not None and (available.status, available.reason) == ("True", c.Reason.FEATURES_AVAILABLE)
    assert apiserver.probes == 2


@pytest.mark.parametrize(
    ("last", "now", "expected"),
    [
        (None, T0, 0.0),
        (T0, T0, features.RECHECK.total_seconds()),
        (T0, T0 + timedelta(minutes=1), (features.RECHECK - timedelta(minutes=1)).total_seconds()),
        (T0, T0 + features.RECHECK, 0.0),
        (T0, T0 + timedelta(days=1), 0.0),
    ],
)
def test_recheck_in(last: datetime | None, now: datetime, expected: float) -> None:
    assert features.recheck_in(last, now) == expected


@pytest.mark.parametrize(
    ("off", "named"),
    [
        ([], None),
        (["DRADeviceBindingConditions"], "DRADeviceBindingConditions on kube-apiserver and kube-scheduler:"),
        (["DRADeviceTaints"], "DRADeviceTaints on kube-apiserver, kube-scheduler and kube-controller-manager:"),
    ],
)
def test_the_message_names_every_component_that_needs_the_gate(off: list[str], named: str | None) -> None:
    ok, _, message = features.condition(off)
    assert ok is (named is None)
    assert named is None or named in message
