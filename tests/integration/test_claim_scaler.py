"""The claim-aware scaler on the real apiserver, scheduler, resourceclaim controller and CAPI core: a pod with
the shipped 2g.48gb claim template and no GPU node raises the claim-scaler MachineDeployment 0->1 with a
ClaimScaleUp Event (through the production runner and `<cluster>-kubeconfig`), leaves the cluster-autoscaler
one alone, does not add again while the new replica is coming, and stops at max with a ClaimScaleBlocked
warning; next to cluster-autoscaler (ca-declined) it takes only the pod CA's Event declined, woken by that Event; `capi-gpu autoscaler annotate` and the annotation sync write the CA annotations."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from kopf._core.engines import posting  # the contextvars kopf sets around handlers (events.emit needs them)

from capi_gpu import cli, domain
from capi_gpu.autoscaler import scaler_runner, sync
from capi_gpu.autoscaler.scaler import ClaimScaler
from capi_gpu.kube import (
    CAPI_CLUSTERS,
    CAPI_MACHINEDEPLOYMENTS,
    DEVICECLASSES,
    EVENTS,
    PODS,
    RESOURCECLAIMTEMPLATES,
    RESOURCESLICES,
    SECRETS,
    AsyncKube,
    Kube,
    ours,
)
from capi_gpu.provisioning.ansible import AnsibleRunner
from capi_gpu.runtime.deps import Deps, RobotClients
from capi_gpu.runtime.settings import PodPolicy, Settings
from capi_gpu_sim import binaries
from capi_gpu_sim.controlplane import ControlPlane

pytestmark = pytest.mark.integration

TEMPLATES = ours("hetznergpumachinetemplates")
CAPACITY = {"cpu": "48", "memory": "257614Mi", "ephemeral-storage": "894Gi", "nvidia.com/gpu": "1"}
MIG_CLASS_CEL = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"


def docs(path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((binaries.REPO / path).read_text()) if d]


class Stopped:
    def __init__(self) -> None:
        self.flag = False

    def __bool__(self) -> bool:
        return self.flag


@contextlib.contextmanager
def kopf_context() -> Iterator[asyncio.Queue[posting.K8sEvent]]:
    """What kopf sets around a handler, so ``events.emit`` queues instead of failing; yields the queue."""
    queue: asyncio.Queue[posting.K8sEvent] = asyncio.Queue()
    tokens = (
        posting.settings_var.set(kopf.OperatorSettings()),
        posting.event_queue_var.set(queue),
        posting.event_queue_loop_var.set(asyncio.get_running_loop()),
    )
    try:
        yield queue
    finally:
        posting.event_queue_loop_var.reset(tokens[2])
        posting.event_queue_var.reset(tokens[1])
        posting.settings_var.reset(tokens[0])


def drained(queue: asyncio.Queue[posting.K8sEvent]) -> list[posting.K8sEvent]:
    out = []
    while not queue.empty():
        out.append(queue.get_nowait())
    return out


def machinedeployment(name: str, owner: str, max_size: int) -> dict[str, Any]:
    return {
        "apiVersion": domain.CAPI_API_VERSION,
        "kind": "MachineDeployment",
        "metadata": {
            "name": name,
            "annotations": {
                domain.CA_MIN_SIZE_ANNOTATION: "0",
                domain.CA_MAX_SIZE_ANNOTATION: str(max_size),
                domain.ANNOTATION_SCALER_OWNER: owner,
            },
        },
        "spec": {
            "clusterName": "c1",
            "replicas": 0,
            "selector": {"matchLabels": {"pool": name}},
            "template": {
                "metadata": {"labels": {"pool": name}},
                "spec": {
                    "clusterName": "c1",
                    "version": "v1.36.3",
                    "bootstrap": {"dataSecretName": "boot"},
                    "infrastructureRef": {"apiGroup": domain.GROUP, "kind": "HetznerGPUMachineTemplate", "name": "gpu"},
                },
            },
        },
    }


@pytest.fixture
def world(kube: Kube, namespace: str) -> Iterator[str]:
    """DeviceClasses, the shipped claim templates, a Cluster with zero GPU nodes, a balanced template with the
    capacity the template controller would write, and two autoscaled MachineDeployments: one per owner.
    The workload cluster is the whole apiserver, so the pods go at the end: another test's scaler would
    count them."""
    stale = [s for s in kube.list(RESOURCESLICES) if s["spec"].get("driver") == domain.NVIDIA_DRIVER]
    assert not stale, "NVIDIA ResourceSlices left by another test would count as free devices"
    mig = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": MIG_CLASS_CEL}}]},
    }
    kube.apply(DEVICECLASSES, mig)
    kube.apply(DEVICECLASSES, docs("config/dra/gate-deviceclass.yaml")[0])
    for doc in docs("config/dra/claims/mig-profiles.yaml"):
        kube.create(RESOURCECLAIMTEMPLATES, doc, namespace)
    boot = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "boot"},
        "type": "cluster.x-k8s.io/secret",
        "stringData": {"value": "#cloud-config\n"},
    }
    kube.create(SECRETS, boot, namespace)
    infra = {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUCluster",
        "metadata": {"name": "c1"},
        "spec": {"robotCredentials": {"name": "robot"}, "sshKeys": {"rescue": {"name": "ssh"}}},
    }
    kube.create(ours("hetznergpuclusters"), infra, namespace)
    cluster = {
        "apiVersion": domain.CAPI_API_VERSION,
        "kind": "Cluster",
        "metadata": {"name": "c1"},
        "spec": {"infrastructureRef": {"apiGroup": domain.GROUP, "kind": "HetznerGPUCluster", "name": "c1"}},
    }
    kube.create(CAPI_CLUSTERS, cluster, namespace)
    tpl = {
        "apiVersion": domain.API_VERSION,
        "kind": "HetznerGPUMachineTemplate",
        "metadata": {"name": "gpu"},
        "spec": {"template": {"spec": {"gpu": {"model": "rtx-pro-6000", "layout": {"preset": "all-balanced"}}}}},
    }
    kube.create(TEMPLATES, tpl, namespace)
    kube.patch(TEMPLATES, "gpu", {"status": {"capacity": CAPACITY, "matchingHosts": 1}}, namespace, sub="status")
    kube.create(CAPI_MACHINEDEPLOYMENTS, machinedeployment("gpu-claims", "claim-scaler", max_size=1), namespace)
    kube.create(CAPI_MACHINEDEPLOYMENTS, machinedeployment("gpu-ca", "cluster-autoscaler", max_size=3), namespace)
    yield namespace
    for pod in kube.list(PODS, namespace):
        kube.delete(PODS, pod["metadata"]["name"], namespace)  # unbound: gone at once, no kubelet to wait for


@pytest.fixture
async def deps(control_plane: ControlPlane, tmp_path: Path) -> AsyncIterator[Deps]:
    kube = AsyncKube(control_plane.kube(), workers=4)
    settings = Settings(claim_scaler=True, template_sync_annotations=True)
    yield Deps(kube, settings, AnsibleRunner(artifacts_root=tmp_path), RobotClients(settings))
    kube.close()


def gpu_pod(kube: Kube, namespace: str, name: str, template: str = "mig-2g-48gb") -> None:
    kube.create(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "containers": [
                    {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"claims": [{"name": "gpu"}]}}
                ],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
            },
        },
        namespace,
    )


def unschedulable(kube: Kube, namespace: str, name: str) -> bool:
    conditions = (kube.get(PODS, name, namespace).get("status") or {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions)


def replicas(kube: Kube, namespace: str, name: str) -> int:
    return int(kube.get(CAPI_MACHINEDEPLOYMENTS, name, namespace)["spec"].get("replicas", 0))


async def until(what: str, check: Any, within: float = 60.0) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = await asyncio.to_thread(check)
        if value:
            return value
        await asyncio.sleep(0.3)
    raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")


async def test_pending_2g_pod_scales_the_owned_machinedeployment_from_zero(
    control_plane: ControlPlane, kube: Kube, world: str, deps: Deps
) -> None:
    ns = world
    control_plane.write_workload_kubeconfig("c1", ns)
    gpu_pod(kube, ns, "p")
    await until("the scheduler to give up on the pod", lambda: unschedulable(kube, ns, "p"))
    with kopf_context() as events:
        task = asyncio.create_task(scaler_runner.run_for(deps, ns, "c1", Stopped()))  # as the kopf daemon runs it
        try:
            await until("the claim-scaler MachineDeployment at 1", lambda: replicas(kube, ns, "gpu-claims") == 1)
            await asyncio.sleep(3)  # further passes (pod still pending) see the new replica as coming
            assert not task.done(), task
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert replicas(kube, ns, "gpu-claims") == 1
    assert replicas(kube, ns, "gpu-ca") == 0, "a MachineDeployment owned by cluster-autoscaler was scaled"
    posted = [(e.reason, e.message, e.ref["name"], e.type) for e in drained(events)]
    assert posted == [("ClaimScaleUp", "0->1 for 1x 2g.48gb pending", "gpu-claims", "Normal")]


async def test_max_size_is_respected_and_the_shortfall_is_a_warning(kube: Kube, world: str, deps: Deps) -> None:
    ns = world
    for i in range(3):
        gpu_pod(kube, ns, f"p{i}")  # three 2g claims; a balanced node has one 2g slice; max is 1
    for i in range(3):
        await until(f"p{i} unschedulable", lambda i=i: unschedulable(kube, ns, f"p{i}"))
    workload = AsyncKube(kube, workers=2)
    with kopf_context() as events:
        scaler = ClaimScaler(deps, ns, "c1", workload, debounce=0.2, resync=0.5)
        task = asyncio.create_task(scaler.run(Stopped()))
        try:
            await until("a decision", lambda: scaler.last is not None and scaler.last.scale_ups)
            await until("the replicas patch", lambda: replicas(kube, ns, "gpu-claims") == 1)
            await asyncio.sleep(2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert replicas(kube, ns, "gpu-claims") == 1 and replicas(kube, ns, "gpu-ca") == 0
    posted = [(e.reason, e.type, e.message) for e in drained(events)]
    assert posted[0] == ("ClaimScaleUp", "Normal", "0->1 for 1x 2g.48gb pending")
    blocked = [p for p in posted if p[0] == "ClaimScaleBlocked"]
    assert len(blocked) == 1, posted  # said once, not once per pass
    assert blocked[0][1] == "Warning" and "2x 2g.48gb" in blocked[0][2] and "max size" in blocked[0][2]


def test_annotate_writes_the_ca_annotations_and_the_owner(
    control_plane: ControlPlane, kube: Kube, world: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ns, config = world, str(control_plane.kubeconfig)
    argv = ["autoscaler", "annotate", "gpu-ca", "-n", ns, "--kubeconfig", config, "-o", "json"]
    assert cli.main([*argv, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert dry["applied"] is False and dry["patch"] is not None
    assert domain.CA_CAPACITY_CPU not in (kube.get(CAPI_MACHINEDEPLOYMENTS, "gpu-ca", ns)["metadata"]["annotations"])
    assert cli.main([*argv, "--owner", "cluster-autoscaler"]) == 0
    done = json.loads(capsys.readouterr().out)
    md = kube.get(CAPI_MACHINEDEPLOYMENTS, "gpu-ca", ns)["metadata"]
    assert done["applied"] is True
    assert md["annotations"][domain.CA_CAPACITY_MEMORY] == "257614Mi"
    assert md["annotations"][domain.CA_CAPACITY_TAINTS] == "readiness.k8s.io/gpu-not-ready:NoSchedule"
    assert "gpu.infrastructure.cluster.x-k8s.io/gpu=true" in md["annotations"][domain.CA_CAPACITY_LABELS]
    assert domain.CA_ACCELERATOR_LABEL not in md["annotations"][domain.CA_CAPACITY_LABELS]
    assert domain.CA_CAPACITY_DRA_DRIVER not in md["annotations"]  # MIG layout: CA can't describe it
    assert md["labels"][domain.LABEL_SCALER_OWNER] == "cluster-autoscaler"
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["patch"] is None  # idempotent
    assert cli.main(["autoscaler", "annotate", "missing", "-n", ns, "--kubeconfig", config]) == 1


async def test_annotation_sync_follows_the_template(kube: Kube, world: str, deps: Deps) -> None:
    ns = world
    with kopf_context() as events:
        assert await sync.reconcile(deps, ns, "gpu") == sync.RESYNC
        ann = kube.get(CAPI_MACHINEDEPLOYMENTS, "gpu-claims", ns)["metadata"]["annotations"]
        assert ann[domain.CA_CAPACITY_CPU] == "48"
        assert domain.LABEL_SCALER_OWNER not in (
            kube.get(CAPI_MACHINEDEPLOYMENTS, "gpu-claims", ns)["metadata"].get("labels") or {}
        )  # the owner is a human's call
        bigger = {"status": {"capacity": {**CAPACITY, "cpu": "64"}}}
        kube.patch(TEMPLATES, "gpu", bigger, ns, sub="status")
        await sync.reconcile(deps, ns, "gpu")
        assert (
            kube.get(CAPI_MACHINEDEPLOYMENTS, "gpu-ca", ns)["metadata"]["annotations"][domain.CA_CAPACITY_CPU] == "64"
        )
        await sync.reconcile(deps, ns, "gpu")
    reasons = [e.reason for e in drained(events)]
    assert reasons == ["AutoscalerAnnotationsSynced"] * 4  # two MachineDeployments, two changes; then none


def ca_event(kube: Kube, namespace: str, pod: str, reason: str) -> None:
    """An Event as cluster-autoscaler's recorder posts it on a pod (core/v1, source component)."""
    obj = kube.get(PODS, pod, namespace)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod}.{reason.lower()}"},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": pod,
            "uid": obj["metadata"]["uid"],
        },
        "reason": reason,
        "message": "pod didn't trigger scale-up:" if reason == "NotTriggerScaleUp" else "pod triggered scale-up",
        "source": {"component": "cluster-autoscaler"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "type": "Normal",
    }
    kube.create(EVENTS, event, namespace)


async def test_next_to_cluster_autoscaler_only_pods_it_declined_count(kube: Kube, world: str, deps: Deps) -> None:
    """--claim-scaler-pods ca-declined: nothing before CA answers, nothing for the pod CA scales for, and CA's
    NotTriggerScaleUp wakes a pass at once (the resync is a minute; the Event watch, not a poll)."""
    ns = world
    for name in ("p-ca", "p-declined"):
        gpu_pod(kube, ns, name)
        await until(f"{name} unschedulable", lambda name=name: unschedulable(kube, ns, name))
    workload = AsyncKube(kube, workers=2)
    with kopf_context() as events:
        scaler = ClaimScaler(deps, ns, "c1", workload, debounce=0.2, resync=60, pods=PodPolicy.CA_DECLINED)
        task = asyncio.create_task(scaler.run(Stopped()))
        try:
            await asyncio.sleep(3)
            assert replicas(kube, ns, "gpu-claims") == 0, "raised before cluster-autoscaler answered"
            ca_event(kube, ns, "p-ca", "TriggeredScaleUp")
            await asyncio.sleep(3)
            assert replicas(kube, ns, "gpu-claims") == 0, "raised for a pod cluster-autoscaler scales for"
            asked = time.monotonic()
            ca_event(kube, ns, "p-declined", "NotTriggerScaleUp")
            await until("the replicas patch", lambda: replicas(kube, ns, "gpu-claims") == 1, within=15)
            took = time.monotonic() - asked
            await asyncio.sleep(1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert took < 10, f"{took:.1f}s: the Event did not wake a pass"
    assert replicas(kube, ns, "gpu-ca") == 0
    posted = [(e.reason, e.message) for e in drained(events)]
    # Max 1 and one 2g per node: had p-ca counted, the second claim would be reported blocked at max.
    assert posted == [("ClaimScaleUp", "0->1 for 1x 2g.48gb pending")], posted
