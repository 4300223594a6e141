"""Pause per Cluster for the loops that are not hosts or machines (remediations, templates, and the
per-Cluster workload daemons: readiness gate and claim scaler), each saying Paused once and then writing
nothing; and the MachineHealthCheck external-remediation contract: a remediation that gives up (resets used
up, or retryLimit 0) sets OwnerRemediated=False on the Machine and never deletes it."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fake_kube import NS, FakeKube

from capi_gpu import domain
from capi_gpu.controllers import remediation_loop, template_loop
from capi_gpu.kube import AsyncKube, Obj
from capi_gpu.runtime import workload
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import Settings

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def _deps(kube: FakeKube) -> Deps:
    settings = Settings(robot_url="http://127.0.0.1:9")
    return Deps(kube, settings, None, RobotClients(settings), clock=lambda: T0)  # type: ignore[arg-type]


def _cluster(paused: bool = False, annotated: bool = False) -> tuple[str, Obj]:
    ann = {domain.PAUSED_ANNOTATION: ""} if annotated else {}
    return ("clusters", {"metadata": {"name": "dev", "annotations": ann}, "spec": {"paused": paused}})


def _conds(obj: Obj) -> dict[str, str]:
    return {
        c["type"]: f"{c['status']}/{c.get('reason', '')}" for c in (obj.get("status") or {}).get("conditions") or []
    }


def _remediation(retry_limit: int = 1, on_exhaustion: str = "Reuse", status: dict[str, Any] | None = None) -> Obj:
    return {
        "metadata": {"name": "w-1", "ownerReferences": [{"kind": "Machine", "name": "w-1"}]},
        "spec": {"strategy": {"retryLimit": retry_limit, "timeoutSeconds": 60, "onExhaustion": on_exhaustion}},
        "status": status or {},
    }


def _remediation_world(rem: Obj, cluster: tuple[str, Obj] | None = None) -> FakeKube:
    capi = {
        "metadata": {"name": "w-1", "generation": 3},
        "spec": {"clusterName": "dev", "infrastructureRef": {"name": "w-1"}},
        "status": {"nodeRef": {"name": "gex-1"}, "conditions": [{"type": "Ready", "status": "False"}]},
    }
    hgm = {"metadata": {"name": "w-1", "annotations": {domain.ANNOTATION_HOST: "gex-1"}}, "spec": {}}
    host = {"metadata": {"name": "gex-1"}, "spec": {"serverNumber": 1}, "status": {"state": "Provisioned"}}
    return FakeKube(
        ("hetznergpuremediations", rem),
        ("machines", capi),
        ("hetznergpumachines", hgm),
        ("hetznergpuhosts", host),
        cluster or _cluster(),
    )


@pytest.mark.parametrize("on_exhaustion", ["Reuse", "Retire"])
async def test_retry_limit_zero_hands_the_machine_to_its_owner_without_a_reset(on_exhaustion: str) -> None:
    kube = _remediation_world(_remediation(retry_limit=0, on_exhaustion=on_exhaustion))
    await remediation_loop.reconcile(_deps(kube), NS, "w-1")
    machine = kube.objs[("machines", NS, "w-1")]
    assert _conds(machine)["OwnerRemediated"] == "False/WaitingForRemediation"
    assert _conds(machine)["Ready"].startswith("False")  # CAPI's own conditions are left alone
    assert not [w for w in kube.writes if w[0] == "delete"]
    rem = kube.objs[("hetznergpuremediations", NS, "w-1")]["status"]
    assert (rem["phase"], rem.get("retryCount", 0)) == ("DeletingMachine", 0)
    retired = kube.objs[("hetznergpuhosts", NS, "gex-1")]["spec"].get("retired", False)
    assert retired is (on_exhaustion == "Retire")
    assert f"{domain.DOMAIN}/last-remediated" not in str(kube.writes)  # no reset was recorded or sent


async def test_resets_used_up_set_owner_remediated_false_and_never_delete_the_machine() -> None:
    waiting = {"phase": "Waiting", "retryCount": 1, "lastRemediated": (T0 - timedelta(seconds=120)).isoformat()}
    kube = _remediation_world(_remediation(retry_limit=1, status=waiting))
    await remediation_loop.reconcile(_deps(kube), NS, "w-1")
    assert _conds(kube.objs[("machines", NS, "w-1")])["OwnerRemediated"] == "False/WaitingForRemediation"
    assert ("machines", NS, "w-1") in kube.objs and not [w for w in kube.writes if w[0] == "delete"]


@pytest.mark.parametrize(
    ("cluster", "annotated"),
    [(_cluster(paused=True), False), (_cluster(annotated=True), False), (_cluster(), True)],
    ids=["Cluster.spec.paused", "Cluster annotation", "remediation annotation"],
)
async def test_a_paused_remediation_says_paused_once_and_sends_nothing(
    cluster: tuple[str, Obj], annotated: bool
) -> None:
    rem = _remediation(retry_limit=0)
    if annotated:
        rem["metadata"]["annotations"] = {domain.PAUSED_ANNOTATION: ""}
    kube = _remediation_world(rem, cluster)
    deps = _deps(kube)
    await remediation_loop.reconcile(deps, NS, "w-1")
    assert _conds(kube.objs[("hetznergpuremediations", NS, "w-1")])["Paused"] == "True/Paused"
    assert [w[1] for w in kube.writes] == ["hetznergpuremediations"]  # its own Paused condition, nothing else
    kube.writes.clear()
    await remediation_loop.reconcile(deps, NS, "w-1")
    assert kube.writes == []


def _template(owner_cluster: bool) -> Obj:
    meta: dict[str, Any] = {"name": "workers", "generation": 1}
    if owner_cluster:
        meta["ownerReferences"] = [{"kind": "Cluster", "name": "dev"}]
    return {"metadata": meta, "spec": {"template": {"spec": {}}, "standby": {"size": 1}}}


async def test_a_template_of_a_paused_cluster_takes_no_host_for_its_standby_pool() -> None:
    host = {"metadata": {"name": "gex-1", "resourceVersion": "1"}, "spec": {"serverNumber": 1}}
    host["status"] = {"state": "Available"}
    kube = FakeKube(("hetznergpumachinetemplates", _template(True)), ("hetznergpuhosts", host), _cluster(paused=True))
    deps = _deps(kube)
    await template_loop.reconcile(deps, NS, "workers")
    assert _conds(kube.objs[("hetznergpumachinetemplates", NS, "workers")])["Paused"] == "True/Paused"
    assert [w[1] for w in kube.writes] == ["hetznergpumachinetemplates"]
    kube.writes.clear()
    await template_loop.reconcile(deps, NS, "workers")
    assert kube.writes == []
    kube.objs[("clusters", NS, "dev")]["spec"]["paused"] = False  # resumed: the pool fills
    await template_loop.reconcile(deps, NS, "workers")
    assert kube.objs[("hetznergpuhosts", NS, "gex-1")]["spec"].get("standby") is not None
    assert _conds(kube.objs[("hetznergpumachinetemplates", NS, "workers")])["Paused"] == "False/NotPaused"


async def test_the_per_cluster_daemons_do_not_run_while_the_cluster_is_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "RECHECK", 0.05)
    kubeconfig = {
        "apiVersion": "v1",
        "clusters": [{"name": "w", "cluster": {"server": "https://127.0.0.1:9"}}],
        "users": [{"name": "w", "user": {"token": "t"}}],
        "contexts": [{"name": "w", "context": {"cluster": "w", "user": "w"}}],
        "current-context": "w",
    }
    secret = {
        "metadata": {"name": "dev-kubeconfig"},
        "data": {"value": base64.b64encode(json.dumps(kubeconfig).encode()).decode()},
    }
    kube = FakeKube(("secrets", secret), _cluster(paused=True))
    deps = _deps(kube)
    runs: list[str] = []

    async def task(client: AsyncKube) -> None:
        runs.append("started")
        try:
            await asyncio.sleep(3600)
        finally:
            runs.append("stopped")

    class Stop:
        flag = False

        def __bool__(self) -> bool:
            return self.flag

    stopped = Stop()
    daemon = asyncio.create_task(workload.supervise(deps, NS, "dev", "gate", task, stopped, 1, 1))
    await asyncio.sleep(0.3)
    assert runs == []  # paused from the start: never started
    kube.objs[("clusters", NS, "dev")]["spec"]["paused"] = False
    await asyncio.sleep(0.3)
    assert runs == ["started"]
    kube.objs[("clusters", NS, "dev")]["spec"]["paused"] = True  # clusterctl move pauses it: stop writing
    await asyncio.sleep(0.3)
    assert runs == ["started", "stopped"]
    stopped.flag = True
    await asyncio.wait_for(daemon, 5)
