"""Gate case on the real apiserver: a node whose NVIDIA kubelet plugin went is not GPU-ready, although the
kubelet keeps the plugin's slices for 30 s after it went (its wipe delay) and those slices still match the
layout; nor is a node without the gate's own kubelet plugin (no claim with a gate device could be prepared
there). The plugins' pods come from their real DaemonSets (NVIDIA's rendered from the 0.4.1 chart archive,
ours from config/dra), the simulated kubelet keeps the slices for the real 30 s, and the gate runs from its
production entry point (the runner, reading the checks from the HetznerGPUCluster). A driver run under
other labels is followed once the HetznerGPUCluster names them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import test_readiness_gate as rg
import yaml
from test_readiness_gate import Gates, is_, node_condition, ready
from test_sim_node_pods import _slices, chart_daemonset, run_node_pods

from capi_gpu import domain
from capi_gpu.kube import PODS, Kube
from capi_gpu_sim import node_pods
from capi_gpu_sim import world as sim_world
from capi_gpu_sim.dra_publisher import DraPublisher
from capi_gpu_sim.gate_world import CLUSTERS, GateWorld, GpuNode

pytestmark = pytest.mark.integration
deps, world, gates = rg.deps, rg.world, rg.gates  # the gate fixtures of test_readiness_gate
__all__ = ["chart_daemonset"]  # a fixture this file uses


@dataclass
class NodeKubelet:
    """What NodePods drives of a SimKubelet, over a gate-world node: its NVIDIA plugin stand-in publishes
    while NodePods lets it (the chart's DaemonSet runs a plugin pod there)."""

    gpu: GpuNode
    publish_dra: bool = False
    publisher: DraPublisher | None = None

    @property
    def node_name(self) -> str:
        return self.gpu.node

    def tick(self) -> None:
        if self.publish_dra and self.publisher is None:
            self.gpu.publisher.start()
            self.publisher = self.gpu.publisher


def not_ready_because(kube: Kube, node: str, reason: str) -> bool:
    return rg.tainted(kube, node) and is_(node_condition(kube, node), "False", reason)


@pytest.fixture
def gate_daemonset(kube: Kube) -> Iterator[dict[str, Any]]:
    """The gate's kubelet-plugin DaemonSet as the add-ons run applies it; deleted after."""
    yield yaml.safe_load(sim_world.GATE_PLUGIN_DAEMONSET.read_text())
    kube.delete(node_pods.DAEMONSETS, node_pods.GATE_PLUGIN_DAEMONSET, node_pods.GATE_PLUGIN_NAMESPACE)


async def test_a_node_whose_plugin_went_is_not_ready_while_its_slices_linger(
    kube: Kube, world: GateWorld, gates: Gates, chart_daemonset: dict[str, Any], gate_daemonset: dict[str, Any]
) -> None:
    a = world.add_node()
    kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)
    kube.apply(node_pods.DAEMONSETS, gate_daemonset, node_pods.GATE_PLUGIN_NAMESPACE)
    kubelet = NodeKubelet(a)
    pods = run_node_pods(kube, kubelet)  # the kubelet's real 30 s wipe delay
    try:
        gates.start_runner(infra_cluster=world.cluster)
        await ready(gates, kube, a)
        assert is_(node_condition(kube, a.node), "True", "Ready")

        # Without the gate's own plugin the kubelet could not prepare a claim's gate device.
        kube.delete(node_pods.DAEMONSETS, node_pods.GATE_PLUGIN_DAEMONSET, node_pods.GATE_PLUGIN_NAMESPACE)
        await gates.wait("a not ready: no gate plugin", lambda: not_ready_because(kube, a.node, "PluginNotRunning"))
        message = node_condition(kube, a.node)["message"]  # type: ignore[index]
        assert "no gate kubelet plugin pod" in message and "NVIDIA" not in message, message
        kube.apply(node_pods.DAEMONSETS, gate_daemonset, node_pods.GATE_PLUGIN_NAMESPACE)
        await ready(gates, kube, a)

        # The plugin goes for good (the chart uninstalled; the same when its DaemonSet no longer fits the node).
        kube.delete(node_pods.DAEMONSETS, node_pods.PLUGIN_DAEMONSET, node_pods.PLUGIN_NAMESPACE)
        await gates.wait("the plugin pod gone", lambda: kubelet.publisher is None)
        gone = time.monotonic()
        await gates.wait("a not ready: no plugin", lambda: not_ready_because(kube, a.node, "PluginNotRunning"))
        took = time.monotonic() - gone
        lingering = _slices(kube, a.node)
        assert lingering, "the slices went with the plugin: the simulated kubelet is easier than the real one"
        assert took < 5.0, f"not ready {took:.1f}s after the plugin went: the slices' wipe, not the plugin's pod"
        message = node_condition(kube, a.node)["message"]  # type: ignore[index]
        assert domain.NVIDIA_PLUGIN_SELECTOR in message and a.node in message, message
        assert await gates.wait("the gate device tainted", lambda: rg.gate_device_tainted(kube, a.node))

        await gates.wait("the kubelet's wipe", lambda: not _slices(kube, a.node), within=node_pods.WIPE_DELAY_S + 10)
        assert time.monotonic() - gone >= node_pods.WIPE_DELAY_S - 1
        assert not_ready_because(kube, a.node, "PluginNotRunning")  # the root cause stays first

        kube.apply(node_pods.DAEMONSETS, chart_daemonset, node_pods.PLUGIN_NAMESPACE)  # the plugin is back
        await ready(gates, kube, a)

        # A driver the user runs under other labels: the HetznerGPUCluster names its pods.
        own = {"kubeletPluginSelector": "app=own-nvidia-driver", "kubeletPluginNamespace": world.namespace}
        kube.patch(CLUSTERS, world.cluster, {"spec": {"addons": {"draDriver": own}}}, world.namespace)
        gates.deps.wakeups.wake("gate", world.namespace, world.cluster)  # else its next resync, within 30 s
        await gates.wait("a not ready: no pod matches", lambda: not_ready_because(kube, a.node, "PluginNotRunning"))
        assert "app=own-nvidia-driver" in node_condition(kube, a.node)["message"]  # type: ignore[index]
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "own-plugin", "labels": {"app": "own-nvidia-driver"}},
            "spec": {"nodeName": a.node, "containers": [{"name": "plugin", "image": "own/driver"}]},
        }
        kube.create(PODS, body, world.namespace)
        running = {"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}
        kube.patch(PODS, "own-plugin", running, world.namespace, sub="status")
        await ready(gates, kube, a)
        kube.delete(PODS, "own-plugin", world.namespace, grace_period_seconds=0)
    finally:
        pods.stop()
        if kubelet.publisher is not None:
            kubelet.publisher.stop()
    assert pods.errors == [], pods.errors
