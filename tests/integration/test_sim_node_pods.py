"""The simulated nodes' pods on the real apiserver, keyed off the NVIDIA chart's own kubelet-plugin DaemonSet
(rendered from the dra-driver-nvidia-gpu 0.4.1 archive with our values): no DaemonSet, no plugin pod and no
NVIDIA slices; with it, one pod per node it fits, owned by it and matching its selector, and the node
publishes; deleting the pod re-enumerates the GPU (with the label `capi-gpu nodes relayout` selects by);
deleting the DaemonSet removes the pod at once and the slices only after the kubelet's wipe delay, which a
plugin back in time cancels. The chart's DaemonSet fits a capi-gpu GPU node only
with our values' affinity. A deleted pod bound to a simulated node is confirmed gone instead of staying
Terminating."""

from __future__ import annotations

import copy
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from capi_gpu import domain
from capi_gpu.kube import NAMESPACES, NODES, PODS, RESOURCESLICES, Kube, Res
from capi_gpu.relayout import Relayout
from capi_gpu_sim import daemonset_fit, dra_publisher, node_pods, nvidia_chart
from capi_gpu_sim import world as sim_world

pytestmark = pytest.mark.integration

SERVICEACCOUNTS = Res("", "v1", "serviceaccounts")
GPU = dra_publisher.GpuFacts(
    "GPU-1", "NVIDIA RTX PRO 6000", "Blackwell", "NvidiaRTX", "0000:01:00.0", "580.95.05", "13.0", "12.0", 97887, True
)
MIG = dra_publisher.MigFacts("1g.24gb", 14, 1, 0, 1, "MIG-1", 46, 1, 1, 1, 1, 0, 24000)
WIPE_DELAY_S = 3.0  # the kubelet's is 30 s (node_pods.WIPE_DELAY_S); the same code path, shorter


@dataclass
class PluginKubelet:
    """The part of SimKubelet NodePods drives: ``publish_dra`` gates the NVIDIA plugin, which (as in
    SimKubelet._dra_tick) starts a real publisher once allowed, so its slices land on the apiserver."""

    kube: Kube
    node_name: str | None
    publish_dra: bool = False
    publisher: dra_publisher.DraPublisher | None = None
    restarts: list[float] = field(default_factory=list)

    def tick(self) -> None:
        if self.publish_dra and self.publisher is None and self.node_name:
            uid = self.kube.get(NODES, self.node_name)["metadata"]["uid"]
            pub = dra_publisher.DraPublisher(self.kube, self.node_name, uid, lambda: (GPU, [MIG]))
            pub.start()
            self.publisher = pub


def _until(what: str, fn: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := fn():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def gpu_node(name: str, labelled: bool = True) -> dict[str, Any]:
    """A GPU node as our bootstrap registers it: the gpu label (--node-labels) and the startup taint."""
    labels = {domain.LABEL_GPU_PRESENT: "true"} if labelled else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": [{"key": domain.NODE_STARTUP_TAINT, "effect": "NoSchedule"}]},
    }


@pytest.fixture
def node(kube: Kube) -> Iterator[str]:
    name = f"sim-{uuid.uuid4().hex[:6]}"
    kube.create(NODES, gpu_node(name))
    yield name
    kube.delete(NODES, name)


@pytest.fixture
def chart_daemonset(kube: Kube) -> Iterator[dict[str, Any]]:
    """The chart's kubelet-plugin DaemonSet and its ServiceAccount, as helm creates them; deleted after."""
    kube.apply(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": nvidia_chart.NAMESPACE}})
    for sa in (d for d in nvidia_chart.rendered() if d["kind"] == "ServiceAccount"):
        kube.apply(SERVICEACCOUNTS, copy.deepcopy(sa), nvidia_chart.NAMESPACE)
    yield copy.deepcopy(nvidia_chart.kubelet_plugin_daemonset())
    kube.delete(node_pods.DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)


def _plugin_pods(kube: Kube, node: str, running: bool = True) -> list[dict[str, Any]]:
    return [
        p
        for p in kube.list(PODS, node_pods.PLUGIN_NAMESPACE, label_selector=node_pods.PLUGIN_SELECTOR)
        if p["spec"].get("nodeName") == node
        and not p["metadata"].get("deletionTimestamp")
        and (not running or (p.get("status") or {}).get("phase") == "Running")
    ]


def _slices(kube: Kube, node: str) -> list[dict[str, Any]]:
    return [
        s
        for s in kube.list(RESOURCESLICES, field_selector=f"spec.nodeName={node}")
        if s["spec"]["driver"] == domain.NVIDIA_DRIVER
    ]


def run_node_pods(kube: Kube, kubelet: Any, wipe_delay_s: float = node_pods.WIPE_DELAY_S) -> node_pods.NodePods:
    """NodePods, and the kubelet's own loop beside it (the real one polls too); ``kubelet`` needs what
    ``PluginKubelet`` has."""
    pods = node_pods.NodePods(kube, lambda: [kubelet], poll_s=0.1, wipe_delay_s=wipe_delay_s).start()
    original = pods._tick

    def tick() -> None:
        original()
        kubelet.tick()

    pods._tick = tick  # type: ignore[method-assign]
    return pods


def test_the_charts_daemonset_fits_our_gpu_nodes_only_with_our_values() -> None:
    ds = nvidia_chart.kubelet_plugin_daemonset()
    assert ds["metadata"]["name"] == node_pods.PLUGIN_DAEMONSET
    assert ds["metadata"]["namespace"] == node_pods.PLUGIN_NAMESPACE
    key, _, value = node_pods.PLUGIN_SELECTOR.partition("=")
    assert ds["spec"]["selector"]["matchLabels"][key] == value
    spec = ds["spec"]["template"]["spec"]
    assert daemonset_fit.misfit(spec, gpu_node("gex131-1")) is None
    assert daemonset_fit.misfit(spec, gpu_node("cpu-1", labelled=False)) is not None
    # Why our values set the affinity: the chart's default wants NFD's or the GPU Operator's labels, which
    # capi-gpu nodes never get, so its plugin would run on none of them.
    with tarfile.open(nvidia_chart.CHART) as tgz:
        member = tgz.extractfile("dra-driver-nvidia-gpu/values.yaml")
        assert member is not None
        chart_default = yaml.safe_load(member.read())["kubeletPlugin"]["affinity"]
    assert daemonset_fit.misfit({**spec, "affinity": chart_default}, gpu_node("gex131-1")) is not None


def test_no_daemonset_no_plugin_and_no_slices_then_the_charts_daemonset_runs_it(
    kube: Kube, node: str, chart_daemonset: dict[str, Any]
) -> None:
    kubelet = PluginKubelet(kube, node)
    pods = run_node_pods(kube, kubelet, wipe_delay_s=WIPE_DELAY_S)
    try:
        _until("a tick that found no DaemonSet", lambda: "no DaemonSet" in pods.misfits.get(node, ""))
        time.sleep(0.5)  # several more ticks: still nothing
        assert not _plugin_pods(kube, node, running=False) and not _slices(kube, node)
        assert not kubelet.publish_dra and kubelet.publisher is None

        ds = kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
        pod = _until("the plugin pod, Running", lambda: _plugin_pods(kube, node))[0]
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "DaemonSet",
            ds["metadata"]["name"],
            ds["metadata"]["uid"],
        )
        assert owner["controller"] is True
        selector = ds["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["serviceAccountName"] == ds["spec"]["template"]["spec"]["serviceAccountName"]
        assert _until("the node's NVIDIA slices", lambda: _slices(kube, node))
        # The label the relayout command restarts by, so its default selector finds the chart's pod.
        k, _, v = Relayout.plugin_selector.partition("=")
        assert pod["metadata"]["labels"].get(k) == v

        kube.delete(node_pods.DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
        # The garbage collector may delete the pod before NodePods' next tick sees the DaemonSet gone.
        _until("the plugin pod gone", lambda: not _plugin_pods(kube, node, running=False))
        _until("the plugin stopped", lambda: not kubelet.publish_dra and kubelet.publisher is None)
        gone = time.monotonic()
        # The kubelet keeps a departed plugin's slices for its wipe delay, then deletes them.
        assert _slices(kube, node), "the slices went with the plugin: the kubelet keeps them for its wipe delay"
        _until("the node's slices gone", lambda: not _slices(kube, node), timeout=WIPE_DELAY_S + 10)
        assert time.monotonic() - gone >= WIPE_DELAY_S - 0.5
        assert pods.wiped == [node]
    finally:
        pods.stop()
        if kubelet.publisher is not None:
            kubelet.publisher.stop()


def test_a_node_the_daemonset_does_not_fit_gets_no_plugin(kube: Kube, chart_daemonset: dict[str, Any]) -> None:
    name = f"cpu-{uuid.uuid4().hex[:6]}"
    kube.create(NODES, gpu_node(name, labelled=False))
    kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
    kubelet = PluginKubelet(kube, name)
    pods = run_node_pods(kube, kubelet)
    try:
        _until("a tick that found the node misfit", lambda: "nodeAffinity" in pods.misfits.get(name, ""))
        time.sleep(0.5)
        assert not _plugin_pods(kube, name, running=False) and not _slices(kube, name)
    finally:
        pods.stop()
        kube.delete(NODES, name)


def test_deleting_the_plugin_pod_re_enumerates(kube: Kube, node: str, chart_daemonset: dict[str, Any]) -> None:
    kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
    kubelet = PluginKubelet(kube, node)
    pods = run_node_pods(kube, kubelet)
    try:
        first = _until("the plugin pod, Running", lambda: _plugin_pods(kube, node))[0]
        assert _until("slices", lambda: _slices(kube, node))
        kube.delete(PODS, first["metadata"]["name"], node_pods.PLUGIN_NAMESPACE)  # as relayout does
        second = _until(
            "a new plugin pod, Running",
            lambda: [p for p in _plugin_pods(kube, node) if p["metadata"]["name"] != first["metadata"]["name"]],
        )[0]
        assert second["metadata"]["ownerReferences"] == first["metadata"]["ownerReferences"]
        assert pods.restarts[node] == 1
        assert _slices(kube, node), "the restarted plugin publishes again"
    finally:
        pods.stop()
        if kubelet.publisher is not None:
            kubelet.publisher.stop()


def test_a_deleted_pod_on_a_simulated_node_goes_away(kube: Kube, namespace: str, node: str) -> None:
    idle = PluginKubelet(kube, node)  # joined, no DaemonSet: no plugin pod
    pods = node_pods.NodePods(kube, lambda: [idle], poll_s=0.1).start()
    try:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "job"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "busybox"}]},
        }
        kube.create(PODS, body, namespace)
        kube.delete(PODS, "job", namespace)  # a bound pod: graceful, would stay Terminating without a kubelet
        # confirmed is appended after the delete returned, so it implies the pod is gone, not the reverse.
        _until("the deletion confirmed", lambda: f"{namespace}/job" in pods.confirmed)
        assert kube.get_or_none(PODS, "job", namespace) is None
        assert not _plugin_pods(kube, node)
    finally:
        pods.stop()


def test_a_plugin_back_within_the_wipe_delay_keeps_its_slices(
    kube: Kube, node: str, chart_daemonset: dict[str, Any]
) -> None:
    """As the real kubelet: a plugin that registers again before the wipe delay ends cancels the wipe, and
    republishes over the slices it left (no gap in which the node has none)."""
    kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
    kubelet = PluginKubelet(kube, node)
    pods = run_node_pods(kube, kubelet, wipe_delay_s=WIPE_DELAY_S)
    try:
        _until("the plugin pod, Running", lambda: _plugin_pods(kube, node))
        (before,) = _until("slices", lambda: _slices(kube, node))
        kube.delete(node_pods.DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
        _until("the plugin gone", lambda: kubelet.publisher is None and not _plugin_pods(kube, node, running=False))
        kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
        _until("the plugin pod back, Running", lambda: _plugin_pods(kube, node))
        time.sleep(WIPE_DELAY_S + 1)  # past the delay the wipe would have ended at
        (after,) = _slices(kube, node)
        assert after["metadata"]["uid"] == before["metadata"]["uid"], "the slice was wiped and published anew"
        assert pods.wiped == []
    finally:
        pods.stop()
        if kubelet.publisher is not None:
            kubelet.publisher.stop()


def test_the_gate_plugin_daemonset_runs_a_pod_on_gpu_nodes_only(kube: Kube, node: str) -> None:
    """The gate's own kubelet-plugin DaemonSet (config/dra): a Running pod on a GPU node, owned by it; none on a
    node without the gpu label; gone with the DaemonSet."""
    gate_ds = yaml.safe_load(sim_world.GATE_PLUGIN_DAEMONSET.read_text())
    cpu = f"cpu-{uuid.uuid4().hex[:6]}"
    kube.create(NODES, gpu_node(cpu, labelled=False))
    kubelets = [PluginKubelet(kube, node), PluginKubelet(kube, cpu)]
    pods = node_pods.NodePods(kube, lambda: kubelets, poll_s=0.1).start()

    def gate_pods(on: str) -> list[dict[str, Any]]:
        selected = kube.list(PODS, node_pods.GATE_PLUGIN_NAMESPACE, label_selector=node_pods.GATE_PLUGIN_SELECTOR)
        return [p for p in selected if p["spec"].get("nodeName") == on and not p["metadata"].get("deletionTimestamp")]

    try:
        ds = kube.apply(node_pods.DAEMONSETS, gate_ds, node_pods.GATE_PLUGIN_NAMESPACE)
        pod = _until(
            "the gate plugin pod, Running",
            lambda: [p for p in gate_pods(node) if p["status"].get("phase") == "Running"],
        )[0]
        assert pod["metadata"]["ownerReferences"][0]["uid"] == ds["metadata"]["uid"]
        time.sleep(0.5)
        assert gate_pods(cpu) == []
        kube.delete(node_pods.DAEMONSETS, node_pods.GATE_PLUGIN_DAEMONSET, node_pods.GATE_PLUGIN_NAMESPACE)
        _until("the gate plugin pod gone", lambda: not gate_pods(node))
    finally:
        pods.stop()
        kube.delete(NODES, cpu)
        kube.delete(node_pods.DAEMONSETS, node_pods.GATE_PLUGIN_DAEMONSET, node_pods.GATE_PLUGIN_NAMESPACE)


@pytest.mark.parametrize(("max_unavailable", "at_once"), [(1, 1), ("100%", 3)])
def test_a_changed_template_rolls_max_unavailable_nodes_at_a_time(
    kube: Kube, chart_daemonset: dict[str, Any], max_unavailable: Any, at_once: int
) -> None:
    """As the DaemonSet controller: a pod-template change (here ``kubectl rollout restart``'s annotation)
    replaces every plugin pod, never more nodes without a Ready one than ``maxUnavailable`` allows, and
    the DaemonSet's status reports the roll done; each node's plugin restarted once."""
    names = [f"sim-{uuid.uuid4().hex[:6]}" for _ in range(3)]
    for name in names:
        kube.create(NODES, gpu_node(name))
    chart_daemonset["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] = max_unavailable
    ds = kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
    kubelets = [PluginKubelet(kube, name) for name in names]
    pods = node_pods.NodePods(kube, lambda: kubelets, poll_s=0.1, plugin_start_s=0.5).start()
    original = pods._tick

    def tick() -> None:
        original()
        for k in kubelets:
            k.tick()

    pods._tick = tick  # type: ignore[method-assign]

    def rolled(generation: int) -> bool:
        st = kube.get(node_pods.DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE).get("status") or {}
        return (
            st.get("observedGeneration") == generation
            and st.get("updatedNumberScheduled") == st.get("numberAvailable") == st.get("desiredNumberScheduled") == 3
        )

    try:
        _until("the first roll-out", lambda: rolled(ds["metadata"]["generation"]))
        before = {n: _plugin_pods(kube, n)[0]["metadata"]["name"] for n in names}
        restart = {"kubectl.kubernetes.io/restartedAt": "2026-12-07T07:00:00Z"}
        patched = kube.patch(
            node_pods.DAEMONSETS,
            node_pods.PLUGIN_DAEMONSET,
            {"spec": {"template": {"metadata": {"annotations": restart}}}},
            node_pods.PLUGIN_NAMESPACE,
        )
        most, deadline = 0, time.monotonic() + 30
        while not rolled(patched["metadata"]["generation"]):
            assert time.monotonic() < deadline, "the roll did not finish"
            most = max(most, sum(1 for n in names if not _plugin_pods(kube, n)))
            time.sleep(0.05)
        assert most == at_once, f"nodes without a Ready plugin at once: {most}"
        after = {n: _plugin_pods(kube, n)[0] for n in names}
        assert all(after[n]["metadata"]["name"] != before[n] for n in names)
        assert all(p["metadata"]["annotations"] == restart for p in after.values())
        assert sorted(pods.rolled) == sorted(names) and all(pods.restarts[n] == 1 for n in names)
    finally:
        pods.stop()
        for k in kubelets:
            if k.publisher is not None:
                k.publisher.stop()
        for name in names:
            kube.delete(NODES, name)
