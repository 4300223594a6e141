"""e2e from nothing: a new workload cluster gets its DRA add-ons only through the operator's own Ansible run
(playbooks/addons.yml: NVIDIA's dra-driver-nvidia-gpu 0.4.1 from its unmodified archive with our values, our
gate driver, the claim templates); the world applies none of them. AddonsReady=True names the chart version;
the chart's DeviceClasses exist as helm's release 1 created them; the chart's kubelet-plugin DaemonSet runs
the NVIDIA plugin on each new GPU node (node_pods keys it off that DaemonSet), and a pod with the shipped
1g.24gb claim template binds on one. A second run of the playbook (the hourly drift refresh, brought
forward) changes nothing: 0 changed, still helm revision 1. With three GPU nodes, a roll of the plugin's pods
re-taints one node at a time (spec.addons.draDriver.pluginMaxUnavailable, default "1", as the operator's
helm run set it on the DaemonSet) while a claim binds on the others; with "100%" it re-taints them together.

The world has three hosts, all GPU nodes from the second test on: the roll needs the operator's
own helm run, which only this world has, so it shares this world instead of starting one more."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
GPU_NODES = 3
SAMPLE_S = 0.25


@pytest.fixture(scope="module")
def world(world_factory: Callable[..., World]) -> World:
    started = time.monotonic()
    w = world_factory(hosts=GPU_NODES, addons=True)
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
    # All three at once (cold hosts provision side by side): the roll test needs them, and one here then two
    # more there took about a minute longer (213 s against 152 s for both tests, 7 Dec 2026).
    names = {n.name for n in fk.provisioned(world, GPU_NODES)}
    fk.submit(world, POD, "mig-1g-24gb")
    got = fk.bound(world, POD, timeout=120)
    assert got.node == got.pool and got.node in names, got
    assert "-mig-1g24gb-" in got.device, got
    plugin = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
    pods = world.k.list(PODS, node_pods.PLUGIN_NAMESPACE, label_selector=node_pods.PLUGIN_SELECTOR)
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(names), "one plugin pod per GPU node"
    assert {p["metadata"]["ownerReferences"][0]["uid"] for p in pods} == {plugin["metadata"]["uid"]}


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


@dataclass
class Roll:
    """What sampling the GPU nodes every ``SAMPLE_S`` during one roll of the plugin DaemonSet saw."""

    most: int = 0
    """The most GPU nodes re-tainted (startup taint, or GPUReady not True) in one sample."""
    tainted: set[str] = field(default_factory=set)
    """Every node seen re-tainted."""
    seconds: float = 0.0
    """From the template change to every pod updated and Ready and every node GPU-ready again."""
    submitted_while: str | None = None
    """The node being rolled when the claim pod was submitted (None: no pod submitted)."""
    bound_after: float | None = None
    """Seconds from the template change to the claim pod bound, if it bound during the roll."""


def not_ready(node: dict[str, Any]) -> bool:
    return fk.startup_tainted(node) or not fk.is_true(node, domain.GPU_READY_CONDITION)


def plugin_rolled(world: World, generation: int) -> bool:
    """The DaemonSet controller's verdict: every desired node runs an updated pod and it is Ready."""
    ds = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
    st = ds.get("status") or {}
    return (st.get("observedGeneration") or 0) >= generation and (
        st.get("updatedNumberScheduled") == st.get("numberAvailable") == st.get("desiredNumberScheduled") == GPU_NODES
    )


def roll_plugin(world: World, stamp: str, claim_pod: str | None = None) -> Roll:
    """Change the plugin's pod template as ``kubectl rollout restart`` does (a chart upgrade's new image does
    the same to the DaemonSet controller) and sample until the roll is done and every node GPU-ready again.
    ``claim_pod``: submitted with the 1g.24gb template once one node is seen re-tainted."""
    names = [n.name for n in fk.provisioned(world, GPU_NODES)]
    ds = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
    fk.wait(world, "the plugin DaemonSet settled", lambda: plugin_rolled(world, ds["metadata"]["generation"]), 60)
    restart = {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": stamp}}}
    patched = world.k.patch(
        DAEMONSETS, node_pods.PLUGIN_DAEMONSET, {"spec": {"template": restart}}, node_pods.PLUGIN_NAMESPACE
    )
    roll, started = Roll(), time.monotonic()
    while time.monotonic() - started < 120:
        nodes = {n["metadata"]["name"]: n for n in fk.gpu_nodes(world)}
        down = {name for name in names if name not in nodes or not_ready(nodes[name])}
        roll.most, roll.tainted = max(roll.most, len(down)), roll.tainted | down
        if claim_pod and roll.submitted_while is None and len(down) == 1:
            fk.submit(world, claim_pod, "mig-1g-24gb")
            roll.submitted_while = next(iter(down))
        if roll.submitted_while and roll.bound_after is None and fk.pod_node(world, str(claim_pod)):
            roll.bound_after = time.monotonic() - started
        if not down and plugin_rolled(world, patched["metadata"]["generation"]):
            roll.seconds = time.monotonic() - started
            return roll
        time.sleep(SAMPLE_S)
    raise AssertionError(f"the plugin roll did not finish in 120 s: {roll}; {fk.where(world)}")


def test_a_plugin_roll_re_taints_one_gpu_node_at_a_time_and_claims_keep_binding(world: World) -> None:
    """Issue 30 item 4. A node's GPU-ready needs its kubelet-plugin pod Running and Ready, so every node whose
    plugin pod a roll replaces gets the startup taint back until the new pod is up. With the default
    pluginMaxUnavailable "1" (which the operator's helm run put on the chart's DaemonSet), a template change
    re-taints at most one of the three nodes at a time, each of them once; a 1g.24gb claim submitted while one
    node is being rolled binds on another before the roll ends. The control, "100%" (the chart's own default),
    written to the HetznerGPUCluster and applied by the operator's next helm upgrade, re-taints more than one
    node at once: this sampling can see the fault the setting prevents."""
    plugin = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
    strategy = plugin["spec"]["updateStrategy"]
    assert (strategy["type"], strategy["rollingUpdate"]["maxUnavailable"]) == ("RollingUpdate", 1), strategy
    one = roll_plugin(world, "2026-12-07T07:00:00Z", claim_pod="during-roll")
    assert one.tainted == {n.name for n in fk.provisioned(world, GPU_NODES)}, f"every node rolled: {one}"
    assert one.most == 1, f"more than one GPU node re-tainted at once: {one}"
    got = fk.bound(world, "during-roll", timeout=60)
    fk.check_bound(world, got, "1g.24gb")
    assert got.node != one.submitted_while, f"bound on the node being rolled: {one}, {got}"
    assert one.bound_after is not None and one.bound_after < one.seconds, f"not bound during the roll: {one}"

    world.k.patch(
        CLUSTERS,
        world.config.cluster,
        {"spec": {"addons": {"draDriver": {"pluginMaxUnavailable": "100%"}}}},
        world.config.namespace,
    )

    def applied() -> bool:
        ds = world.k.get(DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
        return bool(ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "100%")

    fk.wait(world, "the operator's helm upgrade to maxUnavailable 100%", applied, 240)
    every = roll_plugin(world, "2026-12-07T07:05:00Z")
    print(
        f"\nplugin roll over {GPU_NODES} GPU nodes: pluginMaxUnavailable 1: at most {one.most} re-tainted at once "
        f"({len(one.tainted)} in all), done in {one.seconds:.1f}s, a 1g.24gb claim submitted while "
        f"{one.submitted_while} rolled bound on {got.node} after {one.bound_after:.1f}s; "
        f"control 100%: {every.most} at once, done in {every.seconds:.1f}s"
    )
    assert every.most > 1, f"the control re-tainted one node at a time: the sampling cannot see the fault: {every}"
