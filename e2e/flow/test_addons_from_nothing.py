"""e2e from nothing: a new workload cluster gets its DRA add-ons only through the operator's own Ansible run
(playbooks/addons.yml: NVIDIA's dra-driver-nvidia-gpu 0.4.1 from its unmodified archive with our values, our
gate driver, the claim templates); the world applies none of them. AddonsReady=True names the chart version;
the chart's DeviceClasses exist as helm's release 1 created them; the chart's kubelet-plugin DaemonSet runs
the NVIDIA plugin on the new GPU node (node_pods keys it off that DaemonSet), and a pod with the shipped
1g.24gb claim template binds there. A second run of the playbook (the hourly drift refresh, brought
forward) changes nothing: 0 changed, still helm revision 1."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from collections.abc import Callable
from typing import Any

import flow_kit as fk
import pytest

from capi_gpu import domain
from capi_gpu.kube import DEVICECLASSES, PODS, RESOURCECLAIMTEMPLATES, Res, ours
from capi_gpu_sim import binaries, node_pods, nvidia_chart
from capi_gpu_sim.world import World

CLUSTERS = ours("hetznergpuclusters")
DAEMONSETS = Res("apps", "v1", "daemonsets")
POD = "from-nothing"


@pytest.fixture(scope="module")
def world(world_factory: Callable[..., World]) -> World:
    started = time.monotonic()
    w = world_factory(hosts=1, addons=True)
    print(f"\nworld with add-ons up in {time.monotonic() - started:.0f}s; add-ons run {w.addons_seconds:.0f}s")
    return w


def helm_history(world: World) -> list[dict[str, Any]]:
    argv = [str(binaries.ensure_helm()), "--kubeconfig", str(world.cp.kubeconfig), "history", nvidia_chart.RELEASE]
    argv += ["-n", nvidia_chart.NAMESPACE, "-o", "json"]
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    history: list[dict[str, Any]] = json.loads(out)
    return history


def cluster(world: World) -> dict[str, Any]:
    return world.k.get(CLUSTERS, world.config.cluster, world.config.namespace)


def test_the_operator_installs_the_chart_and_the_gate_driver(world: World) -> None:
    ready = fk.condition(cluster(world), "AddonsReady")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "AddonsInstalled"), ready
    assert "dra-driver-nvidia-gpu 0.4.1" in ready["message"]
    assert cluster(world)["status"]["addons"]["chartVersion"] == "0.4.1"
    (release,) = helm_history(world)
    assert (release["revision"], release["status"], release["chart"]) == (1, "deployed", "dra-driver-nvidia-gpu-0.4.1")
    # The chart's classes, as it renders them, created by helm (its ownership marks), not by the world.
    for rendered in nvidia_chart.device_classes():
        live = world.k.get(DEVICECLASSES, rendered["metadata"]["name"])
        assert live["spec"]["selectors"] == rendered["spec"]["selectors"]
        assert live["metadata"]["annotations"]["meta.helm.sh/release-name"] == nvidia_chart.RELEASE
    plugin = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
    assert plugin["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    assert world.k.get_or_none(DAEMONSETS, "capi-gpu-gate-plugin", "kube-system") is not None
    assert world.k.get_or_none(DEVICECLASSES, domain.GATE_DEVICE_CLASS) is not None
    assert world.k.get_or_none(RESOURCECLAIMTEMPLATES, "mig-1g-24gb", world.config.namespace) is not None


def test_a_1g_pod_binds_where_the_charts_daemonset_runs_the_plugin(world: World) -> None:
    (node,) = fk.provisioned(world, 1)
    fk.submit(world, POD, "mig-1g-24gb")
    got = fk.bound(world, POD, timeout=120)
    assert got.node == got.pool == node.name
    assert "-mig-1g24gb-" in got.device, got
    plugin = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
    pods = [
        p
        for p in world.k.list(PODS, node_pods.PLUGIN_NAMESPACE, label_selector=node_pods.PLUGIN_SELECTOR)
        if p["spec"]["nodeName"] == node.name
    ]
    assert len(pods) == 1, pods
    assert pods[0]["metadata"]["ownerReferences"][0]["uid"] == plugin["metadata"]["uid"]


def test_a_second_run_changes_nothing(world: World) -> None:
    before = cluster(world)
    ready_before = fk.condition(before, "AddonsReady")
    assert ready_before is not None
    (artifacts,) = world.artifacts_dirs()  # the one manager pod's volume: it outlives a container restart
    runs_dir = artifacts / "addons" / f"{world.config.namespace}.{world.config.cluster}"
    runs_before = len([p for p in runs_dir.iterdir() if p.is_dir()])
    # An hour on: the operator runs the playbook again to undo drift (cluster_addons.REFRESH).
    aged = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    world.k.patch(
        CLUSTERS,
        world.config.cluster,
        {"status": {"addons": {"appliedTime": aged}}},
        world.config.namespace,
        sub="status",
    )
    world.kill_operator(15)
    world.start_operator()

    def rerun() -> dict[str, Any] | None:
        obj = cluster(world)
        return obj if obj["status"]["addons"].get("appliedTime", aged) > aged else None

    after = fk.wait(world, "a second add-ons run", rerun, timeout=240)
    ready = fk.condition(after, "AddonsReady")
    assert ready is not None and ready["status"] == "True", ready
    assert ready["message"].endswith("(0 changed)"), ready["message"]
    assert ready["lastTransitionTime"] == ready_before["lastTransitionTime"]
    assert len([p for p in runs_dir.iterdir() if p.is_dir()]) == runs_before + 1
    assert [r["revision"] for r in helm_history(world)] == [1]
    assert fk.pod_node(world, POD), "the bound pod stays bound"
