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


async def test_a_remediation_moved_mid_reset_goes_on_waiting_from_its_snapshot() -> None:
    """clusterctl move creates it without status; the host's moved last-remediated annotation is within the
    cooldown. Started over, it would replace the Machine (cooldown) or reset the rebooting server again."""
    sent = (T0 - timedelta(seconds=30)).isoformat()
    waiting = {"phase": "Waiting", "retryCount": 1, "lastRemediated": sent, "bootIDBefore": "boot-a"}
    source = _remediation_world(_remediation(retry_limit=2, status=waiting))
    await remediation_loop.reconcile(_deps(source), NS, "w-1")  # any status write mirrors it first
    snapshot = source.objs[("hetznergpuremediations", NS, "w-1")]["metadata"]["annotations"][domain.ANNOTATION_STATUS]
    assert json.loads(snapshot) == {**waiting, "lastRemediated": sent.replace("+00:00", "Z")}
    # On the target the Cluster is paused until clusterctl is done: the loop's first write is its Paused condition.
    paused = {"conditions": [{"type": "Paused", "status": "True", "reason": "Paused", "lastTransitionTime": sent}]}
    moved = _remediation(retry_limit=2, status=paused)
    moved["metadata"]["annotations"] = {domain.ANNOTATION_STATUS: snapshot}
    target = _remediation_world(moved)
    target.objs[("hetznergpuhosts", NS, "gex-1")]["metadata"]["annotations"] = {
        f"{domain.DOMAIN}/last-remediated": sent
    }
    await remediation_loop.reconcile(_deps(target), NS, "w-1")
    status = target.objs[("hetznergpuremediations", NS, "w-1")]["status"]
    assert (status["phase"], status["retryCount"], status["bootIDBefore"]) == ("Waiting", 1, "boot-a")
    assert "OwnerRemediated" not in _conds(target.objs[("machines", NS, "w-1")])  # not replaced
    assert not [w for w in target.writes if w[1] == "hetznergpuhosts"]  # no new reset recorded or sent


async def test_an_unreadable_remediation_snapshot_is_ignored() -> None:
    rem = _remediation(retry_limit=0)
    rem["metadata"]["annotations"] = {domain.ANNOTATION_STATUS: "{not json"}
    kube = _remediation_world(rem)
    await remediation_loop.reconcile(_deps(kube), NS, "w-1")
    assert kube.objs[("hetznergpuremediations", NS, "w-1")]["status"]["phase"] == "DeletingMachine"


@pytest.mark.parametrize("missing", ["machine", "host", "host status", "nodeRef of a reset in flight"])
async def test_a_remediation_whose_machine_or_host_has_not_arrived_waits_and_replaces_nothing(missing: str) -> None:
    """Mid-move the target may hold the remediation before the HetznerGPUMachine, the host, or the host's status
    restored from its snapshot; judged then, a healthy host reads as "not provisioned" (found by the move e2e)."""
    kube = _remediation_world(_remediation(retry_limit=2))
    if missing == "machine":
        del kube.objs[("hetznergpumachines", NS, "w-1")]
    elif missing == "host":
        del kube.objs[("hetznergpuhosts", NS, "gex-1")]
    elif missing == "host status":
        kube.objs[("hetznergpuhosts", NS, "gex-1")]["status"] = {}
    else:  # clusterctl created the Machine without status; the remediation's snapshot says a reset was sent
        del kube.objs[("machines", NS, "w-1")]["status"]["nodeRef"]
        waiting = json.dumps({"phase": "Waiting", "retryCount": 1, "lastRemediated": T0.isoformat()})
        kube.objs[("hetznergpuremediations", NS, "w-1")]["metadata"]["annotations"] = {
            domain.ANNOTATION_STATUS: waiting
        }
    assert await remediation_loop.reconcile(_deps(kube), NS, "w-1") == 10.0
    assert kube.writes == []


class _Workload:
    """The workload cluster's apiserver, as ``workload.client`` returns it (sync, closed after use)."""

    def __init__(self, nodes: list[Obj] | None) -> None:
        self.nodes = nodes

    def list(self, res: Any) -> list[Obj]:
        if self.nodes is None:
            raise ConnectionError("workload apiserver down")
        return self.nodes

    def get_or_none(self, res: Any, name: str) -> Obj | None:
        return next((n for n in self.list(res) if n["metadata"]["name"] == name), None)

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("workload_nodes", "expected"),
    [
        ("the node, unhealthy", "reset"),  # a remediation the MHC made just before a move: judged, not replaced
        ("no node with its providerID", "replaced"),  # the node never joined: hand it back, as before
        ("unreachable", "wait"),
        ("no kubeconfig yet", "wait"),
    ],
)
async def test_a_remediation_not_started_whose_machine_lacks_its_node_ref_judges_the_node_by_provider_id(
    monkeypatch: pytest.MonkeyPatch, workload_nodes: str, expected: str
) -> None:
    kube = _remediation_world(_remediation(retry_limit=2))
    machine = kube.objs[("machines", NS, "w-1")]
    del machine["status"]["nodeRef"]  # clusterctl created it without status; CAPI has not set nodeRef again
    machine["spec"]["providerID"] = "hrobot://1"
    unhealthy = {
        "metadata": {"name": "gex-1"},
        "spec": {"providerID": "hrobot://1"},
        "status": {"nodeInfo": {"bootID": "boot-a"}, "conditions": [{"type": "Ready", "status": "False"}]},
    }
    other = {"metadata": {"name": "gex-9"}, "spec": {"providerID": "hrobot://9"}}
    clients = {
        "the node, unhealthy": _Workload([other, unhealthy]),
        "no node with its providerID": _Workload([other]),
        "unreachable": _Workload(None),
        "no kubeconfig yet": None,
    }

    async def client(deps: Any, namespace: str, cluster: str) -> Any:
        return clients[workload_nodes]

    async def reset(deps: Any, host: Any, namespace: str) -> None:
        sent.append(host.spec.server_number)

    sent: list[int] = []
    monkeypatch.setattr(workload, "client", client)
    monkeypatch.setattr(remediation_loop, "_reset", reset)
    wait = await remediation_loop.reconcile(_deps(kube), NS, "w-1")
    owner = _conds(kube.objs[("machines", NS, "w-1")]).get("OwnerRemediated")
    if expected == "wait":
        assert (wait, kube.writes, sent) == (10.0, [], [])
    elif expected == "reset":
        assert sent == [1] and owner is None
        assert kube.objs[("hetznergpuremediations", NS, "w-1")]["status"]["phase"] == "Waiting"
    else:
        assert sent == [] and owner == "False/WaitingForRemediation"
